package recovery_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	"walden/objformat"
	"walden/objstore"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
	"walden/recovery/recoverytest"
	"walden/wal"
)

// errDown is what a member that is down gets from its raft node.
var errDown = recoverytest.ErrDown

// testCluster is recoverytest's in-process replicated state, with the
// shorthands the tests of this package use.
type testCluster struct {
	*recoverytest.Cluster
	t testing.TB
	s *fsm.State
	// objects are the objects a scenario committed before the recovery,
	// by key: every store an executor of the cluster uses holds them.
	mu      sync.Mutex
	objects map[string][]byte
}

func newTestCluster(t testing.TB, ids ...string) *testCluster {
	t.Helper()
	c := recoverytest.NewCluster(t, ids...)
	return &testCluster{Cluster: c, t: t, s: c.State()}
}

func (c *testCluster) setLeader(id string)                   { c.SetLeader(id) }
func (c *testCluster) setDown(id string, down bool)          { c.SetDown(id, down) }
func (c *testCluster) must(o proto.Message) *waldenv1.Result { c.t.Helper(); return c.Must(o) }
func (c *testCluster) apply(proposer string, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	return c.Apply(proposer, cmd)
}

// applyOld applies cmd as an entry of a walden before the check levels
// (Command.checks 0) would be: the state an older walden left.
func (c *testCluster) applyOld(cmd *waldenv1.Command) (*waldenv1.Result, error) {
	return c.ApplyOld(cmd)
}

// op wraps an operation into a Command.
var op = recoverytest.Op

// scenario is a broker with opening streams, some data already committed,
// and a WAL holding more.
type scenario struct {
	broker  string
	epoch   uint64
	walPath string
	// want is, per stream, the batches that the recovery must commit.
	want map[uint64][]wal.Batch
	// closedStream has records in the WAL but is not opening.
	closedStream uint64
	gapStream    uint64
}

// newScenario registers broker b1 with streams 1..4 and writes its WAL:
//   - stream 1: committed up to 10 by the broker; WAL holds 0..10 (already
//     in S3) and 10..10+n (to recover);
//   - stream 2: nothing committed; WAL holds 0..3n, batches of idempotent
//     producer 77 (sequence = offset) in the reference broker's framing;
//   - stream 3: WAL holds 0..4 then a gap (4..6 missing) then 6..10: only
//     0..4 is recovered;
//   - stream 4: closed by the broker before dying: nothing recovered.
func newScenario(t *testing.T, c *testCluster, dir string, n int, payload int) *scenario {
	t.Helper()
	sc := &scenario{broker: "b1", walPath: filepath.Join(dir, "b1.wal"), want: map[uint64][]wal.Batch{}, closedStream: 4, gapStream: 3}
	sc.epoch = c.must(&waldenv1.RegisterBroker{BrokerId: sc.broker, Wal: &waldenv1.WalLocation{Path: sc.walPath, VolumeId: "vol-0b1"}}).GetRegisterBroker().GetEpoch()
	for id := uint64(1); id <= 4; id++ {
		c.must(&waldenv1.OpenStreamRequest{BrokerId: sc.broker, BrokerEpoch: sc.epoch, StreamId: id})
	}
	// Stream 1's first 10 offsets are in S3 already: an object of its
	// batches (the same ones the WAL holds below), committed by the broker.
	pre := objformat.NewBuilder()
	for i := uint64(0); i < 5; i++ {
		if err := pre.Add(wal.Batch{StreamID: 1, Epoch: 1, BaseOffset: 2 * i, Count: 2, Payload: payloadFor(1, 2*i, payload)}); err != nil {
			t.Fatal(err)
		}
	}
	var preData bytes.Buffer
	if _, err := pre.WriteTo(&preData); err != nil {
		t.Fatal(err)
	}
	preIx, err := objformat.ReadIndex(bytes.NewReader(preData.Bytes()), int64(preData.Len()))
	if err != nil {
		t.Fatal(err)
	}
	c.must(&waldenv1.CommitObjectRequest{BrokerId: sc.broker, BrokerEpoch: sc.epoch, Object: &waldenv1.Object{
		ObjectId: "pre-1", Key: "pre/1.obj", Size: uint64(preData.Len()), Ranges: preIx.Ranges()}})
	c.mu.Lock()
	if c.objects == nil {
		c.objects = map[string][]byte{}
	}
	c.objects["pre/1.obj"] = preData.Bytes()
	c.mu.Unlock()
	c.must(&waldenv1.CloseStreamRequest{BrokerId: sc.broker, BrokerEpoch: sc.epoch, StreamId: 4, StreamEpoch: 1})

	capacity := int64(wal.HeaderRegionSize) + int64(4*n+64)*int64(payload+4096)
	capacity = (capacity + 4095) / 4096 * 4096
	w, err := wal.Create(sc.walPath, wal.CreateOptions{Capacity: capacity, NodeID: 1, NodeEpoch: sc.epoch})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	next := map[uint64]uint64{}
	var pending []wal.Batch
	// flush writes the pending batches as one group-commit block.
	flush := func() {
		if _, err := w.AppendAll(ctx, pending); err != nil {
			t.Fatal(err)
		}
		pending = nil
	}
	add := func(stream uint64, count uint32, keep bool) {
		b := wal.Batch{StreamID: stream, Epoch: 1, BaseOffset: next[stream], Count: count, Payload: payloadFor(stream, next[stream], payload)}
		if stream == 2 {
			recs := make([][]byte, count)
			recs[0] = b.Payload
			b.Payload = producer.Encode(producer.Header{ID: 77, Sequence: next[stream]}, recs)
		}
		pending = append(pending, b)
		next[stream] += uint64(count)
		if keep {
			sc.want[stream] = append(sc.want[stream], b)
		}
	}
	for i := 0; i < 5; i++ {
		add(1, 2, false) // 0..10: already committed
	}
	flush()
	for i := 0; i < n; i++ {
		add(1, 1, true)
		add(2, 3, true)
		add(4, 1, false)
		if i == 0 {
			add(3, 4, true)
			next[3] += 2 // the gap
		}
		if i == 1 {
			add(3, 4, false)
		}
		flush()
	}
	if err := w.Abandon(); err != nil { // as a kill -9 would leave it
		t.Fatal(err)
	}
	return sc
}

func payloadFor(stream, offset uint64, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(uint64(i)*31 + stream*7 + offset*13)
	}
	return p
}

// declare fences the broker and creates its job, assigned among live.
func (c *testCluster) declare(broker string, epoch uint64, live ...string) *waldenv1.Job {
	c.t.Helper()
	return c.Declare(broker, epoch, live...)
}

func testConfig() recovery.Config {
	cfg := recovery.DefaultConfig()
	// Long enough that a loaded machine does not let a running job's lease
	// lapse (renewals every JobLease/3) in tests that do not wait for one.
	cfg.JobLease = 2 * time.Second
	cfg.RetryMin = 20 * time.Millisecond
	cfg.RetryMax = 200 * time.Millisecond
	cfg.PartSize = 5 << 20
	cfg.ObjectSize = 5 << 20
	cfg.UploadObjects = 2 // exercise concurrent object uploads
	return cfg
}

func newStore(t *testing.T, cfg objstore.Config) *objstore.Client {
	t.Helper()
	s, err := objstore.New(context.Background(), cfg, objstore.Options{PartSize: 5 << 20, Concurrency: 4, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newExecutor(c *testCluster, id string, cfg recovery.Config, store recovery.Store, f recovery.Fencer, a recovery.Attacher) *recovery.Executor {
	c.seed(store)
	return recovery.NewExecutor(recovery.ExecutorConfig{Config: cfg, NodeID: id, State: c.s, Cluster: c.Member(id), Store: store,
		Fencer: f, Attacher: a, Logger: testLogger()})
}

// seed uploads to store the objects the cluster's scenario committed
// before the recovery (nil: none).
func (c *testCluster) seed(store recovery.Store) {
	c.t.Helper()
	if store == nil {
		return
	}
	c.mu.Lock()
	objs := maps.Clone(c.objects)
	c.mu.Unlock()
	for key, data := range objs {
		if info, err := store.Head(context.Background(), key); err == nil && info.Size == int64(len(data)) {
			continue // another member's store of the same bucket seeded it
		}
		if _, err := store.Upload(context.Background(), key, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			c.t.Fatalf("seed %s: %v", key, err)
		}
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("RECOVERY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// waitJob polls until cond holds for the job or the deadline passes.
func waitJob(t *testing.T, c *testCluster, id string, d time.Duration, what string, cond func(*waldenv1.Job) bool) *waldenv1.Job {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		j, _ := c.s.Job(id)
		if cond(j) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %s not reached within %s: %v", id, what, d, j)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkCommitted reads every committed object of every stream back from S3
// and compares the batches with the scenario's: each offset exactly once,
// in order, and every stream closed.
func checkCommitted(t *testing.T, c *testCluster, store *objstore.Client, sc *scenario) {
	t.Helper()
	ctx := context.Background()
	for id := uint64(1); id <= 4; id++ {
		st, ok := c.s.Stream(id)
		if !ok || st.GetState() != fsm.StreamClosed {
			t.Fatalf("stream %d not closed: %v", id, st)
		}
		var got []wal.Batch
		end := uint64(0)
		for _, o := range c.s.StreamObjects(id, 0, 0) {
			for _, r := range o.GetRanges() {
				if r.GetStreamId() != id {
					continue
				}
				if r.GetStartOffset() != end && !(id == 1 && end == 0) {
					t.Fatalf("stream %d: range %d..%d after %d: overlap or hole", id, r.GetStartOffset(), r.GetEndOffset(), end)
				}
				end = r.GetEndOffset()
			}
			if !o.GetFailover() {
				continue
			}
			data, err := store.Get(ctx, o.GetKey())
			if err != nil {
				t.Fatalf("object %s: %v", o.GetKey(), err)
			}
			if uint64(len(data)) != o.GetSize() {
				t.Fatalf("object %s: %d bytes, the catalog says %d", o.GetKey(), len(data), o.GetSize())
			}
			if objformat.CRC32C(data) != o.GetCrc32C() {
				t.Fatalf("object %s: crc32c differs from the catalog's", o.GetKey())
			}
			ix, batches, err := objformat.ReadAll(bytesReaderAt(data), int64(len(data)))
			if err != nil {
				t.Fatalf("object %s: %v", o.GetKey(), err)
			}
			e, ok := ix.Entry(id)
			if !ok {
				t.Fatalf("object %s has no section of stream %d", o.GetKey(), id)
			}
			for _, b := range batches {
				if b.StreamID == id {
					got = append(got, b)
				}
			}
			_ = e
		}
		want := sc.want[id]
		if len(got) != len(want) {
			t.Fatalf("stream %d: %d batches committed, want %d", id, len(got), len(want))
		}
		for i := range want {
			if got[i].BaseOffset != want[i].BaseOffset || got[i].Count != want[i].Count || string(got[i].Payload) != string(want[i].Payload) {
				t.Fatalf("stream %d batch %d: got offset %d count %d, want offset %d count %d (or payload differs)",
					id, i, got[i].BaseOffset, got[i].Count, want[i].BaseOffset, want[i].Count)
			}
		}
		if len(want) > 0 && st.GetEndOffset() != want[len(want)-1].EndOffset() {
			t.Fatalf("stream %d: end offset %d, want %d", id, st.GetEndOffset(), want[len(want)-1].EndOffset())
		}
	}
}

type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(b)) {
		return 0, errors.New("EOF")
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, errors.New("EOF")
	}
	return n, nil
}

// keysUnder lists the object keys under prefix.
func keysUnder(t *testing.T, store *objstore.Client, prefix string) []string {
	t.Helper()
	objs, err := store.List(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range objs {
		out = append(out, o.Key)
	}
	sort.Strings(out)
	return out
}
