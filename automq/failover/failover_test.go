package failover_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"walden/automq/controller"
	"walden/automq/devcontroller"
	"walden/automq/failover"
	"walden/automq/object"
	"walden/automq/protocol"
	"walden/objstore"
	"walden/objstore/s3test"
	"walden/wal"
)

const (
	clusterID = "failover-test"
	node      = int32(3)
	nodeEpoch = int64(1_733_000_000_000)
)

// env is a development controller, an S3 bucket and an AutoMQ node that
// wrote a WAL and died.
type env struct {
	t     *testing.T
	dc    *devcontroller.Controller
	ctl   *controller.Client
	s3    objstore.Config
	store *objstore.Client
	wal   string
	// want is every record the WAL holds that the controller lacks, per
	// stream, in offset order: what the failover must commit.
	want map[int64][]object.Record
	// walEpoch is the node epoch in the WAL's header.
	walEpoch int64
	// skew is added to the controller's clock (prepared ids expire by it).
	skew   atomic.Int64
	faults *devcontroller.Faults
}

func newEnv(t *testing.T, streams ...int64) *env {
	t.Helper()
	e := &env{t: t, wal: filepath.Join(t.TempDir(), "node3.wal"), want: map[int64][]object.Record{}}
	now := func() time.Time { return time.Now().Add(time.Duration(e.skew.Load())) }
	e.faults = devcontroller.NewFaults()
	dc, err := devcontroller.New(devcontroller.Config{ClusterID: clusterID, Streams: streams, Now: now, Faults: e.faults})
	if err != nil {
		t.Fatal(err)
	}
	var lns []net.Listener
	for i := 0; i < 3; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
	}
	if err := dc.Start(lns...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	cc := controller.DefaultConfig()
	cc.Voters = dc.Addrs()
	cc.RequestTimeout = 5 * time.Second
	cc.Logger = slog.New(slog.DiscardHandler)
	ctl, err := controller.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	s3cfg := s3test.StartFake(t)
	store, err := objstore.New(context.Background(), s3cfg, objstore.Options{PartSize: 5 << 20, Concurrency: 4, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e.dc, e.ctl, e.s3, e.store = dc, ctl, s3cfg, store
	return e
}

func (e *env) config() failover.Config {
	cfg := failover.DefaultConfig()
	cfg.ClusterID = clusterID
	cfg.Controller.Voters = e.dc.Addrs()
	cfg.StreamSplitSize = 64 << 10
	return cfg
}

func (e *env) failover(cfg failover.Config, opts failover.Options) *failover.Failover {
	e.t.Helper()
	f, err := failover.New(cfg, e.ctl, e.store, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return f
}

// open has node n open streams (at epoch, registering it) as a broker does.
func (e *env) open(n int32, epoch int64, streams ...int64) {
	e.t.Helper()
	ctx := context.Background()
	if _, err := e.ctl.GetOpeningStreams(ctx, n, epoch, false); err != nil {
		e.t.Fatal(err)
	}
	var req []controller.OpenStream
	for _, id := range streams {
		st := e.stream(id)
		req = append(req, controller.OpenStream{StreamID: id, StreamEpoch: st.Epoch + 1})
	}
	res, err := e.ctl.OpenStreams(ctx, n, epoch, req)
	if err != nil {
		e.t.Fatalf("open %v: %v (%+v)", streams, err, res)
	}
}

// commitByBroker commits [start, end) of stream id as node n does when it
// uploads its WAL (the object's bytes do not matter to the controller).
func (e *env) commitByBroker(n int32, epoch, id, start, end int64) {
	e.t.Helper()
	ctx := context.Background()
	oid, err := e.ctl.PrepareS3Object(ctx, n, 1, time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	_, err = e.ctl.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: n, NodeEpoch: epoch, ObjectID: oid, OrderID: oid, ObjectSize: 100,
		StreamRanges: []protocol.ObjectStreamRange{{StreamID: id, StreamEpoch: -1, StartOffset: start, EndOffset: end}}})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) stream(id int64) devcontroller.StreamView {
	for _, s := range e.dc.Snapshot().Streams {
		if s.StreamID == id {
			return s
		}
	}
	e.t.Fatalf("no stream %d", id)
	return devcontroller.StreamView{}
}

func payload(stream, off int64, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(int64(i)*31 + stream*7 + off*13)
	}
	return p
}

// walWriter writes an AutoMQ WAL for node 3, a block per call of flush.
type walWriter struct {
	e       *env
	w       *wal.Writer
	pending []wal.Batch
	next    map[int64]int64
}

func (e *env) newWAL(capacity int64, epoch int64) *walWriter {
	e.t.Helper()
	w, err := wal.Create(e.wal, wal.CreateOptions{Capacity: capacity, NodeID: uint32(node), NodeEpoch: uint64(epoch)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.walEpoch = epoch
	return &walWriter{e: e, w: w, next: map[int64]int64{}}
}

// add appends a record of count offsets to stream id; want says the
// failover must commit it.
func (ww *walWriter) add(id int64, count int64, size int, want bool) {
	off := ww.next[id]
	b := wal.Batch{StreamID: uint64(id), Epoch: 1, BaseOffset: uint64(off), Count: uint32(count), Payload: payload(id, off, size)}
	ww.pending = append(ww.pending, b)
	ww.next[id] = off + count
	if want {
		ww.e.want[id] = append(ww.e.want[id], object.Record{StreamID: id, Epoch: 1, BaseOffset: off, Count: int32(count), Payload: b.Payload})
	}
}

func (ww *walWriter) skip(id, n int64) { ww.next[id] += n }

func (ww *walWriter) flush() {
	if len(ww.pending) == 0 {
		return
	}
	if _, err := ww.w.AppendAll(context.Background(), ww.pending); err != nil {
		ww.e.t.Fatal(err)
	}
	ww.pending = nil
}

// kill leaves the WAL as a kill -9 would.
func (ww *walWriter) kill() {
	ww.flush()
	if err := ww.w.Abandon(); err != nil {
		ww.e.t.Fatal(err)
	}
}

// committed reads every committed record of stream id back from S3
// through the controller's objects, in offset order, checking that the
// committed objects cover [0, end offset) without overlap.
func (e *env) committed(id int64) []object.Record {
	e.t.Helper()
	snap := e.dc.Snapshot()
	var recs []object.Record
	for _, o := range snap.Objects {
		if o.State != devcontroller.ObjectCommitted {
			continue
		}
		holds := false
		for _, r := range o.Ranges {
			if r.StreamID == id {
				holds = true
			}
		}
		if !holds {
			continue
		}
		data, err := e.store.Get(context.Background(), o.Key)
		if errors.Is(err, objstore.ErrNotFound) {
			continue // committed by the test's "broker" without bytes
		}
		if err != nil {
			e.t.Fatal(err)
		}
		obj, err := object.ReadIndex(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			e.t.Fatalf("object %s: %v", o.Key, err)
		}
		all, err := obj.ReadAll()
		if err != nil {
			e.t.Fatal(err)
		}
		for _, r := range all {
			if r.StreamID == id {
				recs = append(recs, r)
			}
		}
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].BaseOffset < recs[j].BaseOffset })
	for i := 1; i < len(recs); i++ {
		if recs[i].BaseOffset != recs[i-1].EndOffset() {
			e.t.Fatalf("stream %d: committed records not contiguous: %d after %d", id, recs[i].BaseOffset, recs[i-1].EndOffset())
		}
	}
	return recs
}

func (e *env) checkCommitted(ids ...int64) {
	e.t.Helper()
	for _, id := range ids {
		got := e.committed(id)
		want := e.want[id]
		if len(got) != len(want) {
			e.t.Fatalf("stream %d: %d records committed from the WAL, want %d", id, len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.BaseOffset != w.BaseOffset || g.Count != w.Count || g.Epoch != w.Epoch || !bytes.Equal(g.Payload, w.Payload) {
				e.t.Fatalf("stream %d record %d: got offset %d count %d, want offset %d count %d (or other bytes)", id, i, g.BaseOffset, g.Count, w.BaseOffset, w.Count)
			}
		}
		if n := len(want); n > 0 {
			if end := e.stream(id).EndOffset; end != want[n-1].EndOffset() {
				e.t.Fatalf("stream %d: end offset %d at the controller, want %d", id, end, want[n-1].EndOffset())
			}
		}
	}
}

func walEmpty(t *testing.T, path string) bool {
	t.Helper()
	rec, err := wal.RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return len(rec.Records) == 0
}

// scenario is the usual dead node: streams 10, 20, 30 (and 40 closed before
// it died); stream 10 had 0..20 committed; 30 has enough bytes for a stream
// object of its own; records interleaved over many blocks.
func scenario(t *testing.T) *env {
	e := newEnv(t, 10, 20, 30, 40)
	e.open(node, nodeEpoch, 10, 20, 30, 40)
	e.commitByBroker(node, nodeEpoch, 10, 0, 20)
	if _, err := e.ctl.CloseStreams(context.Background(), node, nodeEpoch, []controller.CloseStream{{StreamID: 40, StreamEpoch: e.stream(40).Epoch}}); err != nil {
		t.Fatal(err)
	}
	ww := e.newWAL(8<<20, nodeEpoch)
	for i := 0; i < 10; i++ {
		ww.add(10, 2, 100, false) // 0..20: committed already
	}
	ww.flush()
	for i := 0; i < 60; i++ {
		ww.add(10, 1, 300, true)
		ww.add(20, 3, 50, true)
		ww.add(30, 1, 4000, true) // 240 KB: above the split size
		ww.add(40, 1, 10, false)  // closed: not the node's any more
		ww.flush()
	}
	ww.kill()
	return e
}

// TestFailoverCommitsEveryRecordOnceAndCloses runs the whole failover: every
// record of the opening streams beyond their end offsets is committed once,
// in AutoMQ's objects (a stream-set object and a stream object for the
// large stream), the WAL is reset in its own version, the streams are
// closed as the node, and a new owner's OpenStreams that got
// STREAM_NOT_CLOSED before now succeeds at the new end offsets.
func TestFailoverCommitsEveryRecordOnceAndCloses(t *testing.T) {
	e := scenario(t)
	ctx := context.Background()
	// Before: the new leader (node 4) cannot open the streams.
	if _, err := e.ctl.GetOpeningStreams(ctx, 4, 1, false); err != nil {
		t.Fatal(err)
	}
	res, err := e.ctl.OpenStreams(ctx, 4, 1, []controller.OpenStream{{StreamID: 10, StreamEpoch: e.stream(10).Epoch + 1}})
	if !errors.Is(err, protocol.ErrStreamNotClosed) {
		t.Fatalf("open before the failover: %v %+v, want STREAM_NOT_CLOSED", err, res)
	}
	var steps []string
	var maxDone, maxTotal atomic.Int64
	f := e.failover(e.config(), failover.Options{
		Observe: func(ev failover.Event) error {
			steps = append(steps, fmt.Sprintf("%s:%t", ev.Step, ev.Done))
			return nil
		},
		Uploaded: func(done, total int64) {
			for d := maxDone.Load(); done > d && !maxDone.CompareAndSwap(d, done); d = maxDone.Load() {
			}
			for tt := maxTotal.Load(); total > tt && !maxTotal.CompareAndSwap(tt, total); tt = maxTotal.Load() {
			}
		},
	})
	rep, err := f.Run(ctx, failover.Request{WALPath: e.wal, NodeID: node})
	if err != nil {
		t.Fatalf("failover: %v\nreport %+v", err, rep)
	}
	if !rep.Complete() || !rep.Fenced || !rep.WALReset || rep.NodeEpoch != nodeEpoch {
		t.Fatalf("report %+v", rep)
	}
	e.checkCommitted(10, 20, 30)
	if len(e.committed(40)) != 0 {
		t.Fatal("a record of stream 40, closed before the node died, was committed")
	}
	kinds := map[string]int{}
	for _, o := range rep.Objects {
		kinds[o.Kind]++
		if o.State != failover.StateCommitted {
			t.Fatalf("object %d is %s", o.ObjectID, o.State)
		}
		if k, _ := object.Key(clusterID, o.ObjectID); k != o.Key {
			t.Fatalf("object %d under key %q, want %q", o.ObjectID, o.Key, k)
		}
	}
	if kinds[failover.KindStreamSet] != 1 || kinds[failover.KindStream] != 1 {
		t.Fatalf("objects %v, want one stream-set object (streams 10, 20) and one stream object (30)", kinds)
	}
	if rep.BytesUploaded == 0 || maxDone.Load() != rep.BytesUploaded || maxTotal.Load() != rep.BytesUploaded {
		t.Fatalf("progress: uploaded %d of %d, report %d", maxDone.Load(), maxTotal.Load(), rep.BytesUploaded)
	}
	for _, s := range rep.Streams {
		if !s.Closed {
			t.Fatalf("stream %d not closed", s.StreamID)
		}
		if s.StreamID == 10 && (s.EndOffsetBefore != 20 || s.EndOffsetAfter != 80 || s.Records != 60) {
			t.Fatalf("stream 10 report %+v", s)
		}
	}
	for _, id := range []int64{10, 20, 30} {
		if st := e.stream(id); st.State != devcontroller.StreamClosed {
			t.Fatalf("stream %d is %s after the failover", id, st.State)
		}
	}
	if !walEmpty(t, e.wal) {
		t.Fatal("the WAL still holds records after the failover")
	}
	h, _, err := wal.ReadHeader(e.wal)
	if err != nil || h.Version() != 1 || h.NodeID != uint32(node) {
		t.Fatalf("WAL header after the reset %+v %v", h, err)
	}
	// After: the new leader opens the streams at the new end offsets.
	opened, err := e.ctl.OpenStreams(ctx, 4, 1, []controller.OpenStream{{StreamID: 10, StreamEpoch: e.stream(10).Epoch + 1}})
	if err != nil || opened[0].NextOffset != 80 {
		t.Fatalf("open after the failover: %+v %v, want next offset 80", opened, err)
	}
	for _, want := range []string{"header:true", "fence:true", "read:true", "upload:true", "commit:true", "reset:true", "close:true"} {
		if !strings.Contains(strings.Join(steps, " "), want) {
			t.Errorf("no %s among the steps %v", want, steps)
		}
	}

	// Run again: nothing more is committed, nothing changes.
	before := e.dc.Snapshot()
	rep2, err := f.Run(ctx, failover.Request{WALPath: e.wal, NodeID: node})
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	if len(e.dc.Snapshot().Objects) != len(before.Objects) || rep2.BytesUploaded != 0 {
		t.Fatalf("a second run uploaded %d bytes and left %d objects (were %d)", rep2.BytesUploaded, len(e.dc.Snapshot().Objects), len(before.Objects))
	}
}

// TestFailoverResumesAfterACrashAtEveryStep stops the failover at each
// step (as a coordinator killed there would), the first and the second
// time the step comes (several batches), and runs it again: each record is
// committed exactly once, whatever the first run reached.
func TestFailoverResumesAfterACrashAtEveryStep(t *testing.T) {
	points := []string{"fence:true", "read:true", "upload:false", "upload:true", "commit:false", "commit:true", "reset:true", "close:false"}
	for _, at := range points {
		for _, nth := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s#%d", at, nth), func(t *testing.T) {
				e := scenario(t)
				cfg := e.config()
				cfg.BatchSize = 1 << 20 // several batches
				hits := 0
				_, err := e.failover(cfg, failover.Options{Observe: func(ev failover.Event) error {
					if fmt.Sprintf("%s:%t", ev.Step, ev.Done) == at {
						if hits++; hits == nth {
							return failover.ErrStopped
						}
					}
					return nil
				}}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
				if hits < nth {
					t.Skipf("the step %s comes %d times only", at, hits)
				}
				if !errors.Is(err, failover.ErrStopped) {
					t.Fatalf("first run: %v, want it stopped", err)
				}
				rep, err := e.failover(cfg, failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
				if err != nil {
					t.Fatalf("run after the crash: %v", err)
				}
				if !rep.Complete() {
					t.Fatalf("report %+v", rep)
				}
				e.checkCommitted(10, 20, 30)
			})
		}
	}
}

// TestFailoverRefusesAnotherNodesWAL: a WAL whose header names another node
// is refused before anything is asked of the controller: the node is not
// fenced, nothing is committed or closed.
func TestFailoverRefusesAnotherNodesWAL(t *testing.T) {
	e := scenario(t)
	before := e.dc.Snapshot()
	_, err := e.failover(e.config(), failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: 5})
	if !errors.Is(err, failover.ErrWrongWAL) || !strings.Contains(err.Error(), "belongs to node 3, not node 5") {
		t.Fatalf("failover of node 5 from node 3's WAL: %v", err)
	}
	if after := e.dc.Snapshot(); fmt.Sprint(after.Nodes) != fmt.Sprint(before.Nodes) || fmt.Sprint(after.Streams) != fmt.Sprint(before.Streams) {
		t.Fatalf("the controller changed:\nbefore %+v\nafter  %+v", before.Nodes, after.Nodes)
	}
	if walEmpty(t, e.wal) {
		t.Fatal("the WAL was reset")
	}
}

// TestFailoverRefusesAnOlderEpoch: when the node started again with a newer
// epoch, a failover of the older one is refused (NODE_EPOCH_EXPIRED) with
// the epoch named, and nothing changes; an epoch given that is older than
// the WAL's is refused before the controller is asked anything.
func TestFailoverRefusesAnOlderEpoch(t *testing.T) {
	e := scenario(t)
	f := e.failover(e.config(), failover.Options{})
	before := e.dc.Snapshot()
	_, err := f.Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node, NodeEpoch: nodeEpoch - 1})
	if !errors.Is(err, failover.ErrEpochTooOld) || !strings.Contains(err.Error(), "older than the epoch 1733000000000 in the WAL's header") {
		t.Fatalf("failover at an epoch older than the WAL's: %v", err)
	}
	// The node started again with a newer epoch.
	if _, err := e.ctl.GetOpeningStreams(context.Background(), node, nodeEpoch+5000, false); err != nil {
		t.Fatal(err)
	}
	before = e.dc.Snapshot()
	for _, epoch := range []int64{nodeEpoch, 0} {
		_, err := f.Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node, NodeEpoch: epoch})
		if !errors.Is(err, protocol.ErrNodeEpochExpired) || !strings.Contains(err.Error(), "epoch 1733000000000") {
			t.Fatalf("failover at epoch %d after a restart: %v", epoch, err)
		}
	}
	if after := e.dc.Snapshot(); fmt.Sprint(after.Streams) != fmt.Sprint(before.Streams) || fmt.Sprint(after.Nodes) != fmt.Sprint(before.Nodes) {
		t.Fatal("the controller changed")
	}
}

// TestFailoverTakesTheLargerEpoch: the node epoch is the larger of the
// WAL header's and the one AutomqGetNodes reports.
func TestFailoverTakesTheLargerEpoch(t *testing.T) {
	e := scenario(t)
	if _, err := e.dc.RegisterNode(devcontroller.NodeRegistration{NodeID: node, NodeEpoch: nodeEpoch + 7, State: "FENCED"}); err != nil {
		t.Fatal(err)
	}
	rep, err := e.failover(e.config(), failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
	if err != nil || rep.NodeEpoch != nodeEpoch+7 {
		t.Fatalf("failover: epoch %d, %v; want %d", rep.NodeEpoch, err, nodeEpoch+7)
	}
	e.checkCommitted(10, 20, 30)
}

// TestFailoverLeavesAStreamWithMissingRecordsOpened: a stream whose WAL
// records start beyond the controller's end offset is reported by name,
// left opened, and the WAL is not reset; the other streams are failed over.
// With close_streams_with_gaps the failover does what AutoMQ does.
func TestFailoverLeavesAStreamWithMissingRecordsOpened(t *testing.T) {
	e := newEnv(t, 10, 20)
	e.open(node, nodeEpoch, 10, 20)
	ww := e.newWAL(4<<20, nodeEpoch)
	ww.skip(20, 5) // 0..5 of stream 20 are nowhere
	for i := 0; i < 10; i++ {
		ww.add(10, 1, 100, true)
		ww.add(20, 1, 100, false)
		ww.flush()
	}
	ww.kill()
	rep, err := e.failover(e.config(), failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
	if !errors.Is(err, failover.ErrDataMayBeLost) || !strings.Contains(err.Error(), "stream 20: the controller's end offset is 0 but the WAL's first record of the stream starts at 5") {
		t.Fatalf("failover: %v", err)
	}
	e.checkCommitted(10)
	if st := e.stream(20); st.State != devcontroller.StreamOpened || st.EndOffset != 0 {
		t.Fatalf("stream 20 %+v, want left opened at 0", st)
	}
	if e.stream(10).State != devcontroller.StreamClosed {
		t.Fatal("stream 10 not closed")
	}
	if walEmpty(t, e.wal) || rep.WALReset || rep.Complete() {
		t.Fatalf("the WAL was reset or the report says complete: %+v", rep)
	}
	cfg := e.config()
	cfg.CloseStreamsWithGaps = true
	rep, err = e.failover(cfg, failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
	if err != nil || !rep.WALReset || e.stream(20).State != devcontroller.StreamClosed {
		t.Fatalf("with close_streams_with_gaps: %v, report %+v, stream 20 %s", err, rep, e.stream(20).State)
	}
}

// TestFailoverDropsRecordsAfterAGapAsAutoMQ: inside a stream, records after
// a gap are dropped and reported, those before it committed; records out
// of order are put back in order.
func TestFailoverDropsRecordsAfterAGapAsAutoMQ(t *testing.T) {
	e := newEnv(t, 10)
	e.open(node, nodeEpoch, 10)
	ww := e.newWAL(4<<20, nodeEpoch)
	ww.add(10, 2, 100, true) // 0..2
	// 2..4 comes after 4..6 in the WAL: put back in order.
	ww.next[10] = 4
	ww.add(10, 2, 100, false)
	ww.next[10] = 2
	ww.add(10, 2, 100, true)
	e.want[10] = append(e.want[10], object.Record{StreamID: 10, Epoch: 1, BaseOffset: 4, Count: 2, Payload: payload(10, 4, 100)})
	ww.next[10] = 6
	ww.add(10, 1, 100, true) // 6..7
	ww.skip(10, 3)           // 7..10 missing
	ww.add(10, 1, 100, false)
	ww.kill()
	rep, err := e.failover(e.config(), failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	e.checkCommitted(10)
	if len(rep.Gaps) != 1 || !strings.Contains(rep.Gaps[0], "stream 10: 1 record after offset 7 dropped") {
		t.Fatalf("gaps %q", rep.Gaps)
	}
}

// TestFailoverRefusesToOverwriteAnObject: an object with other bytes under
// the key of the id the controller prepares is not overwritten, nothing is
// committed, and the error names the key.
func TestFailoverRefusesToOverwriteAnObject(t *testing.T) {
	e := scenario(t)
	ctx := context.Background()
	next := e.dc.Snapshot().NextObjectID
	key, _ := object.Key(clusterID, next)
	junk := []byte("not the failover's bytes")
	if _, err := e.store.Upload(ctx, key, bytes.NewReader(junk), int64(len(junk)), nil); err != nil {
		t.Fatal(err)
	}
	_, err := e.failover(e.config(), failover.Options{}).Run(ctx, failover.Request{WALPath: e.wal, NodeID: node})
	if !errors.Is(err, failover.ErrObjectExists) || !strings.Contains(err.Error(), key) {
		t.Fatalf("failover over a foreign object: %v", err)
	}
	got, err := e.store.Get(ctx, key)
	if err != nil || !bytes.Equal(got, junk) {
		t.Fatalf("the object under %s was changed", key)
	}
	if e.stream(10).EndOffset != 20 {
		t.Fatal("something was committed")
	}
}

// TestFailoverPreparesAgainWhenTheIdsExpired: OBJECT_NOT_EXIST on the
// commit (the prepared ids expired) prepares new ids, uploads again and
// commits once.
func TestFailoverPreparesAgainWhenTheIdsExpired(t *testing.T) {
	e := scenario(t)
	expired := false
	f := e.failover(e.config(), failover.Options{Observe: func(ev failover.Event) error {
		if ev.Step == failover.StepCommit && !ev.Done && !expired {
			// The hour of the prepared ids passes before the commit.
			expired = true
			e.skew.Add(int64(2 * time.Hour))
			e.dc.Snapshot()
		}
		return nil
	}})
	rep, err := f.Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
	if err != nil {
		t.Fatalf("failover: %v", err)
	}
	e.checkCommitted(10, 20, 30)
	for _, o := range rep.Objects {
		if o.State != failover.StateCommitted {
			t.Fatalf("the report keeps an object that was never committed: %+v", o)
		}
	}
}

// TestFailoverAfterALostCommitAnswer: the controller applies a commit and
// the connection drops before its answer (then its answers are garbage, or
// a frame is cut): each failed run is an error, and the next run commits
// nothing twice (the commit is recognized as done, or filtered out by the
// streams' new end offsets).
func TestFailoverAfterALostCommitAnswer(t *testing.T) {
	for name, f := range map[string]devcontroller.Fault{
		"close after apply": {Kind: devcontroller.FaultCloseAfterApply, APIKey: protocol.KeyCommitStreamSetObject, Times: -1},
		"garbage":           {Kind: devcontroller.FaultGarbage, APIKey: protocol.KeyCommitStreamSetObject, Garbage: []byte{0xff, 0x00, 0x12}, Times: -1},
		"cut frame":         {Kind: devcontroller.FaultCutFrame, APIKey: protocol.KeyCommitStreamSetObject, Times: -1},
		"unknown code":      {Kind: devcontroller.FaultErrorCode, APIKey: protocol.KeyCommitStreamSetObject, Code: 777, Times: -1},
	} {
		t.Run(name, func(t *testing.T) {
			e := scenario(t)
			cfg := e.config()
			cfg.Controller.Attempts = 1
			e.faults.Add(f)
			_, err := e.failover(cfg, failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
			if err == nil {
				t.Fatal("the failover succeeded through a broken commit")
			}
			if walEmpty(t, e.wal) {
				t.Fatal("the WAL was reset after a failed commit")
			}
			e.faults.Clear()
			rep, err := e.failover(cfg, failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
			if err != nil || !rep.Complete() {
				t.Fatalf("second run: %v %+v", err, rep)
			}
			e.checkCommitted(10, 20, 30)
		})
	}
}

// TestTwoFailoversRacing: two runs of the same failover at once (a stale
// coordinator's attempt and the current one) commit each record once: the
// controller refuses the second commit of a range (OFFSET_NOT_MATCHED) and
// the loser recognizes the records as committed.
func TestTwoFailoversRacing(t *testing.T) {
	e := scenario(t)
	cfg := e.config()
	cfg.BatchSize = 1 << 20
	type result struct {
		rep *failover.Report
		err error
	}
	out := make(chan result, 2)
	for i := 0; i < 2; i++ {
		go func() {
			rep, err := e.failover(cfg, failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
			out <- result{rep, err}
		}()
	}
	ok := 0
	for i := 0; i < 2; i++ {
		r := <-out
		if r.err == nil {
			ok++
		} else {
			t.Logf("one run: %v", r.err)
		}
	}
	if ok == 0 {
		t.Fatal("neither run succeeded")
	}
	rep, err := e.failover(cfg, failover.Options{}).Run(context.Background(), failover.Request{WALPath: e.wal, NodeID: node})
	if err != nil || !rep.Complete() {
		t.Fatalf("a run after the race: %v %+v", err, rep)
	}
	e.checkCommitted(10, 20, 30)
}
