package reconcile_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"walden/backup"
	"walden/config"
	"walden/fsm"
	"walden/objformat"
	"walden/objstore"
	"walden/objstore/s3test"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/reconcile"
	"walden/recovery"
	"walden/recovery/recoverytest"
	"walden/wal"
)

// oldBroker plays a reference broker of the old cluster: appends go to its
// WAL (and are acknowledged), uploads build an object of what is pending,
// put it in S3 and (unless told not to) commit it, then trim the WAL.
type oldBroker struct {
	t       *testing.T
	c       *recoverytest.Cluster
	store   *objstore.Client
	id      string
	epoch   uint64
	w       *wal.Writer
	path    string
	streams map[uint64]*waldenv1.Stream
	pending []walRecord
	// acked is every batch acknowledged, by stream, in offset order.
	acked map[uint64][]wal.Batch
}

type walRecord struct {
	off   int64
	batch wal.Batch
}

func newOldBroker(t *testing.T, c *recoverytest.Cluster, store *objstore.Client, dir, id string, acked map[uint64][]wal.Batch) *oldBroker {
	t.Helper()
	b := &oldBroker{t: t, c: c, store: store, id: id, path: filepath.Join(dir, id+".wal"), streams: map[uint64]*waldenv1.Stream{}, acked: acked}
	b.epoch = c.Must(&waldenv1.RegisterBroker{BrokerId: id, Wal: &waldenv1.WalLocation{Path: b.path}}).GetRegisterBroker().GetEpoch()
	w, err := wal.Create(b.path, wal.CreateOptions{Capacity: 8 << 20, NodeEpoch: b.epoch})
	if err != nil {
		t.Fatal(err)
	}
	b.w = w
	return b
}

func (b *oldBroker) open(stream uint64) {
	b.t.Helper()
	st := b.c.Must(&waldenv1.OpenStreamRequest{BrokerId: b.id, BrokerEpoch: b.epoch, StreamId: stream}).GetOpenStream().GetStream()
	b.streams[stream] = st
}

// appendRecords writes n batches of 2 records to stream: acknowledged when
// ack, else written only (a zombie's write after its lease).
func (b *oldBroker) appendRecords(stream uint64, n int, ack bool) {
	b.t.Helper()
	st := b.streams[stream]
	for range n {
		off := st.GetEndOffset()
		payload := producer.Encode(producer.Header{ID: 1000 + stream, Sequence: off}, [][]byte{
			[]byte(fmt.Sprintf("%s s%d o%d e%d a", b.id, stream, off, st.GetEpoch())), []byte("b")})
		bt := wal.Batch{StreamID: stream, Epoch: st.GetEpoch(), BaseOffset: off, Count: 2, Payload: payload}
		woff, err := b.w.Append(context.Background(), bt)
		if err != nil {
			b.t.Fatal(err)
		}
		st.EndOffset = off + 2
		b.pending = append(b.pending, walRecord{woff, bt})
		if ack {
			b.acked[stream] = append(b.acked[stream], bt)
		}
	}
}

// upload puts an object of the pending records in S3 under the broker's
// epoch and commits it (when commit), then trims the WAL.
func (b *oldBroker) upload(commit bool) {
	b.t.Helper()
	data, obj := build(b.t, b.store.Prefix(), b.id, b.epoch, b.pending)
	if _, err := b.store.Upload(context.Background(), obj.GetKey(), bytes.NewReader(data), int64(len(data)), nil); err != nil {
		b.t.Fatal(err)
	}
	if !commit {
		return
	}
	b.c.Must(&waldenv1.CommitObjectRequest{BrokerId: b.id, BrokerEpoch: b.epoch, Object: obj})
	if err := b.w.Trim(b.pending[len(b.pending)-1].off); err != nil {
		b.t.Fatal(err)
	}
	b.pending = nil
}

// build encodes records into an object of the broker's at epoch.
func build(t *testing.T, prefix, broker string, epoch uint64, recs []walRecord) ([]byte, *waldenv1.Object) {
	t.Helper()
	bld := objformat.NewBuilder()
	for _, r := range recs {
		if err := bld.Add(r.batch); err != nil {
			t.Fatal(err)
		}
	}
	data, ix, err := bld.Build()
	if err != nil {
		t.Fatal(err)
	}
	first, last := recs[0].off, recs[len(recs)-1].off
	return data, &waldenv1.Object{ObjectId: objformat.ObjectID(broker, epoch, first, last), Key: objformat.Key(prefix, broker, epoch, first, last),
		Size: uint64(len(data)), Ranges: ix.Ranges(), FirstWalOffset: first, LastWalOffset: last, Crc32C: objformat.CRC32C(data)}
}

// TestRestoreLosesNothingAndReissuesNoOffset (issue 21, finding 5): a
// backup is taken; the old cluster goes on — objects committed, an object
// uploaded and never committed, a broker failed over (its job commits the
// WAL's tail), its stream taken over at a new epoch while the failed broker,
// a zombie, writes one more record of the old epoch, records acknowledged
// and only in the WALs — and stops. The cluster restored from the backup
// reconciles before any stream opens: every stream's catalog then holds
// exactly what was acknowledged, in order, and ends where it ended; the
// zombie's record is not taken.
func TestRestoreLosesNothingAndReissuesNoOffset(t *testing.T) {
	dir := t.TempDir()
	s3cfg := s3test.StartFake(t)
	s3cfg.Prefix = "walden"
	store, err := objstore.New(context.Background(), s3cfg, objstore.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	old := recoverytest.NewCluster(t, "c1", "c2", "c3")
	acked := map[uint64][]wal.Batch{}
	b1 := newOldBroker(t, old, store, dir, "b1", acked)
	b2 := newOldBroker(t, old, store, dir, "b2", acked)
	b1.open(1)
	b1.open(2)
	b2.open(3)
	for range 3 {
		b1.appendRecords(1, 3, true)
		b1.appendRecords(2, 2, true)
		b2.appendRecords(3, 2, true)
		b1.upload(true)
		b2.upload(true)
	}

	// The backup.
	data, err := old.State().Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	file, _, err := backup.Encode(&waldenv1.SnapshotHeader{ClusterName: "test", Index: old.State().AppliedIndex(), Term: 1}, data)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := backup.Decode(file)
	if err != nil {
		t.Fatal(err)
	}

	// After the backup: objects committed; an object uploaded, never
	// committed, whose records the next upload commits again.
	b1.appendRecords(1, 4, true)
	b1.appendRecords(2, 1, true)
	b1.upload(true)
	b1.appendRecords(1, 2, true)
	b1.upload(false)
	b1.appendRecords(2, 3, true)
	b1.upload(true)
	b2.appendRecords(3, 3, true)
	b2.upload(true)
	// b2 dies with records in its WAL; its failover commits them and
	// closes stream 3; the zombie writes one record more (not acknowledged).
	b2.appendRecords(3, 2, true)
	j := old.Declare("b2", b2.epoch, "c1")
	jdata, jobj := build(t, store.Prefix(), "b2", j.GetToken(), b2.pending)
	if _, err := store.Upload(context.Background(), jobj.GetKey(), bytes.NewReader(jdata), int64(len(jdata)), nil); err != nil {
		t.Fatal(err)
	}
	fo := &waldenv1.FailoverContext{JobId: j.GetJobId(), Attempt: 1, Token: j.GetToken()}
	old.Must(&waldenv1.CommitObjectRequest{BrokerId: "b2", BrokerEpoch: j.GetToken(), Failover: fo, Object: jobj})
	old.Must(&waldenv1.CloseStreamRequest{BrokerId: "b2", BrokerEpoch: j.GetToken(), StreamId: 3, StreamEpoch: b2.streams[3].GetEpoch(), Failover: fo})
	old.Must(&waldenv1.FinishJob{JobId: j.GetJobId(), Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED})
	b2.pending = nil
	b2.appendRecords(3, 1, false)
	// b1 takes stream 3 over at a new stream epoch, from its end.
	b1.open(3)
	b1.appendRecords(3, 2, true)
	b1.upload(true)
	// Acknowledged, in b1's WAL only.
	b1.appendRecords(1, 2, true)
	b1.appendRecords(3, 3, true)
	for _, b := range []*oldBroker{b1, b2} {
		if err := b.w.Abandon(); err != nil { // the cluster stops as kill -9 leaves it
			t.Fatal(err)
		}
	}
	// A damaged object under b1's key: reported, never committed.
	badKey := objformat.Key(store.Prefix(), "b1", b1.epoch, 1<<40, 1<<40)
	if _, err := store.Upload(context.Background(), badKey, bytes.NewReader([]byte("not a walden object")), 19, nil); err != nil {
		t.Fatal(err)
	}
	ends := map[uint64]uint64{}
	for s, bs := range acked {
		ends[s] = bs[len(bs)-1].EndOffset()
	}

	// The restore, into a new cluster of three.
	cfg := &config.Server{ClusterName: "test", InitialCluster: []config.Member{
		{ID: "c1", Raft: "127.0.0.1:7101", Admin: "127.0.0.1:7001"}, {ID: "c2", Raft: "127.0.0.1:7102", Admin: "127.0.0.1:7002"},
		{ID: "c3", Raft: "127.0.0.1:7103", Admin: "127.0.0.1:7003"}}}
	restored, res, err := backup.Rewrite(snap, cfg, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if res.BrokersFenced != 2 {
		t.Fatalf("restore fenced %d brokers", res.BrokersFenced)
	}
	c := recoverytest.NewCluster(t, "c1", "c2", "c3")
	if err := c.Restore(restored); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply("c1", recoverytest.Op(&waldenv1.RegisterBroker{BrokerId: "b1"})); err == nil {
		t.Fatal("a broker registered with a cluster that has not reconciled")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rcfg := recovery.DefaultConfig()
	rcfg.JobLease = 2 * time.Second
	rcfg.RetryMin, rcfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("RECONCILE_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, id := range []string{"c1", "c2", "c3"} {
		exe := recovery.NewExecutor(recovery.ExecutorConfig{Config: rcfg, NodeID: id, State: c.State(), Cluster: c.Member(id), Store: store, Logger: logger})
		go recovery.NewRunner(rcfg, id, c.State(), c.Member(id), exe, logger).Run(ctx)
		go reconcile.New(reconcile.Config{Retry: 100 * time.Millisecond}, c.State(), c.Member(id), store, logger).Run(ctx)
	}
	deadline := time.Now().Add(60 * time.Second)
	for c.State().Reconciling() {
		if time.Now().After(deadline) {
			t.Fatalf("not reconciled within a minute: %v\njobs %v", c.State().RestoreState(), c.State().Jobs("", 0))
		}
		time.Sleep(20 * time.Millisecond)
	}
	rs := c.State().RestoreState()
	rep := rs.GetReport()
	t.Logf("reconciled: %v", rep)
	if rep.GetObjectsCommitted() == 0 || rep.GetTails() != 2 || len(rep.GetDamaged()) != 1 || rep.GetDamaged()[0].GetKey() != badKey ||
		len(rep.GetGaps()) != 0 || rep.GetObjectsRedundant() != 1 {
		t.Fatalf("report %v", rep)
	}
	found := false
	for _, e := range c.State().Events("", 0) {
		if e.GetEventKind() == waldenv1.EventKind_EVENT_KIND_RESTORE && bytes.Contains([]byte(e.GetMessage()), []byte(badKey)) {
			found = true
		}
	}
	if !found {
		t.Fatal("no restore event names the damaged object")
	}

	// Every stream holds exactly what was acknowledged, closed at its end.
	for _, id := range []uint64{1, 2, 3} {
		st, _ := c.State().Stream(id)
		if st.GetState() != fsm.StreamClosed || st.GetEndOffset() != ends[id] || st.GetEpoch() <= 1000 {
			t.Fatalf("stream %d after the reconciliation: %v, acknowledged up to %d", id, st, ends[id])
		}
		got := readStream(t, store, c.State(), id)
		want := acked[id]
		if len(got) != len(want) {
			t.Fatalf("stream %d: %d batches in the catalog, %d acknowledged", id, len(got), len(want))
		}
		for i := range want {
			if got[i].BaseOffset != want[i].BaseOffset || !bytes.Equal(got[i].Payload, want[i].Payload) {
				t.Fatalf("stream %d batch %d: offset %d %q, acknowledged offset %d %q", id, i, got[i].BaseOffset, got[i].Payload,
					want[i].BaseOffset, want[i].Payload)
			}
		}
	}
	// Registration is open again; the streams open past everything.
	e := c.Must(&waldenv1.RegisterBroker{BrokerId: "b1"}).GetRegisterBroker().GetEpoch()
	st := c.Must(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e, StreamId: 3}).GetOpenStream().GetStream()
	if st.GetEndOffset() != ends[3] {
		t.Fatalf("stream 3 opens at %d, acknowledged up to %d", st.GetEndOffset(), ends[3])
	}
}

// readStream reads every committed batch of stream id back from S3, in
// offset order, checking that the ranges leave no hole.
func readStream(t *testing.T, store *objstore.Client, st *fsm.State, id uint64) []wal.Batch {
	t.Helper()
	var out []wal.Batch
	next := uint64(0)
	for _, o := range st.StreamObjects(id, 0, 0) {
		data, err := store.Get(context.Background(), o.GetKey())
		if err != nil {
			t.Fatalf("object %s: %v", o.GetKey(), err)
		}
		ix, err := objformat.ReadIndex(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatalf("object %s: %v", o.GetKey(), err)
		}
		for _, r := range o.GetRanges() {
			if r.GetStreamId() != id {
				continue
			}
			if r.GetStartOffset() != next {
				t.Fatalf("stream %d: object %s's range starts at %d after %d", id, o.GetObjectId(), r.GetStartOffset(), next)
			}
			e, ok := ix.EntryOf(r)
			if !ok {
				t.Fatalf("object %s: no section for %v", o.GetKey(), r)
			}
			bs, err := objformat.ReadSection(bytes.NewReader(data), e)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, bs...)
			next = r.GetEndOffset()
		}
	}
	return out
}
