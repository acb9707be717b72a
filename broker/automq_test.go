package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/automq/controller"
	"walden/automq/devcontroller"
	"walden/automq/failover"
	"walden/automq/protocol"
	"walden/broker"
	"walden/config"
	"walden/internal/testutil"
	"walden/objstore"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/wal"
)

// amqEnv is a development AutoMQ controller (with its metadata view), an
// S3 bucket and a directory for the brokers' WALs.
type amqEnv struct {
	t    *testing.T
	dc   *devcontroller.Controller
	view string
	s3   objstore.Config
	dir  string
}

const amqCluster = "amq-broker-test"

func newAmqEnv(t *testing.T, streams ...int64) *amqEnv {
	t.Helper()
	dc, err := devcontroller.New(devcontroller.Config{ClusterID: amqCluster, Streams: streams})
	if err != nil {
		t.Fatal(err)
	}
	var lns []net.Listener
	for i := 0; i < 2; i++ {
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
	hs := httptest.NewServer(dc.HTTPHandler())
	t.Cleanup(hs.Close)
	return &amqEnv{t: t, dc: dc, view: hs.URL, s3: s3test.StartFake(t), dir: t.TempDir()}
}

func (e *amqEnv) config(id string, node int32, streams ...uint64) *config.Broker {
	e.t.Helper()
	y := fmt.Sprintf(`broker_id: %s
mode: automq
listen: 127.0.0.1:0
wal: {path: %q, capacity: 1048576}
s3: {endpoint: %q, bucket: %q, path_style: true, access_key_id: %q, secret_access_key: %q}
upload_interval: 1h
upload_bytes: 262144
automq:
  node_id: %d
  cluster_id: %s
  controller: {voters: [%q, %q], request_timeout: 2s}
  metadata_url: %s
  takeover_after: 300ms
  open_backoff: 50ms
  open_max_backoff: 200ms
  stream_split_size: 4096
`, id, filepath.Join(e.dir, id+".wal"), e.s3.Endpoint, e.s3.Bucket, e.s3.AccessKeyID, e.s3.SecretAccessKey,
		node, amqCluster, e.dc.Addrs()[0], e.dc.Addrs()[1], e.view)
	cfg, err := config.ParseBroker(id+".yaml", []byte(y))
	if err != nil {
		e.t.Fatal(err)
	}
	cfg.Streams = streams
	return cfg
}

func (e *amqEnv) start(cfg *config.Broker) *broker.AutomqBroker {
	e.t.Helper()
	b, err := broker.NewAutomq(cfg, broker.Options{Logger: logger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = b.Stop(false) })
	return b
}

// serving waits until b leads want streams.
func serving(t *testing.T, b *broker.AutomqBroker, want ...uint64) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, "the broker leading its streams", func() error {
		st := b.Status()
		have := map[uint64]bool{}
		for _, s := range st.GetStreams() {
			have[s.GetStreamId()] = true
		}
		for _, id := range want {
			if !have[id] {
				return fmt.Errorf("stream %d not led yet (serving %v, streams %v)", id, st.GetServing(), st.GetStreams())
			}
		}
		return nil
	})
}

func (e *amqEnv) stream(id int64) devcontroller.StreamView {
	e.t.Helper()
	for _, s := range e.dc.Snapshot().Streams {
		if s.StreamID == id {
			return s
		}
	}
	e.t.Fatalf("no stream %d", id)
	return devcontroller.StreamView{}
}

func apiClient(t *testing.T, addr string) waldenv1.BrokerAPIClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return waldenv1.NewBrokerAPIClient(cc)
}

// producerRun appends batches of one idempotent producer to a stream.
type producerRun struct {
	t      *testing.T
	stream uint64
	pid    uint64
	seq    uint64
	// acked maps an offset to the record acknowledged there.
	acked map[uint64]string
}

func (p *producerRun) batch(n int) [][]byte {
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = []byte(fmt.Sprintf("%d/%d", p.stream, p.seq+uint64(i)))
	}
	return recs
}

// append sends the next batch of n records to cl and records the answer.
func (p *producerRun) append(cl waldenv1.BrokerAPIClient, n int) *waldenv1.AppendResponse {
	p.t.Helper()
	resp, err := p.send(cl, p.seq, n)
	if err != nil {
		p.t.Fatalf("append to stream %d at sequence %d: %v", p.stream, p.seq, err)
	}
	p.seq += uint64(n)
	return resp
}

func (p *producerRun) send(cl waldenv1.BrokerAPIClient, seq uint64, n int) (*waldenv1.AppendResponse, error) {
	saved := p.seq
	p.seq = seq
	recs := p.batch(n)
	p.seq = saved
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cl.Append(ctx, &waldenv1.AppendRequest{StreamId: p.stream, Records: recs, ProducerId: p.pid, Sequence: seq})
	if err == nil {
		for i, r := range recs {
			p.acked[resp.GetBaseOffset()+uint64(i)] = string(r)
		}
	}
	return resp, err
}

// readAll reads the stream from offset 0 through cl and checks that it
// holds exactly the acknowledged records, each once, with no gap.
func (p *producerRun) readAll(cl waldenv1.BrokerAPIClient) {
	p.t.Helper()
	got := map[uint64]string{}
	seen := map[string]bool{}
	next := uint64(0)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cl.Read(ctx, &waldenv1.ReadRequest{StreamId: p.stream, FromOffset: next, MaxRecords: 50})
		cancel()
		if err != nil {
			p.t.Fatalf("read stream %d from %d: %v", p.stream, next, err)
		}
		if len(resp.GetRecords()) == 0 {
			break
		}
		for _, r := range resp.GetRecords() {
			if r.GetOffset() != next {
				p.t.Fatalf("stream %d: read offset %d, expected %d", p.stream, r.GetOffset(), next)
			}
			if seen[string(r.GetPayload())] {
				p.t.Fatalf("stream %d: record %s stored twice", p.stream, r.GetPayload())
			}
			seen[string(r.GetPayload())] = true
			got[r.GetOffset()] = string(r.GetPayload())
			next++
		}
	}
	for off, rec := range p.acked {
		if got[off] != rec {
			p.t.Fatalf("stream %d offset %d: acknowledged %s, read %q", p.stream, off, rec, got[off])
		}
	}
}

// TestAutomqBrokerFailover runs AutoMQ's failure end to end in process: a
// broker acknowledges records it has not uploaded yet and dies; the broker
// that takes its streams over gets STREAM_NOT_CLOSED until walden's AutoMQ
// failover (package automq/failover) committed the dead broker's WAL and
// closed its streams, then opens them at the new end offsets, answers the
// producer's retry of a batch the dead broker wrote but never acknowledged
// as stored, and serves every record once. The dead broker started again
// registers a new node epoch, finds nothing to upload, and leads nothing.
func TestAutomqBrokerFailover(t *testing.T) {
	e := newAmqEnv(t, 1, 2, 11)
	a := e.start(e.config("a", 1, 1, 2))
	serving(t, a, 1, 2)
	bcfg := e.config("b", 2, 11)
	bcfg.Automq.Takeover = []config.BrokerAutomqTakeover{{NodeID: 1, Addr: a.Addr(), Streams: []uint64{1, 2}}}
	b := e.start(bcfg)
	serving(t, b, 11)

	ca := apiClient(t, a.Addr())
	p1 := &producerRun{t: t, stream: 1, pid: 77, acked: map[uint64]string{}}
	p2 := &producerRun{t: t, stream: 2, pid: 78, acked: map[uint64]string{}}
	for i := 0; i < 5; i++ {
		p1.append(ca, 3)
		p2.append(ca, 2)
	}
	if err := a.UploadNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Only in the WAL: acknowledged records, then a batch made durable
	// whose answer the producer never got (it retries it below).
	for i := 0; i < 4; i++ {
		p1.append(ca, 3)
		p2.append(ca, 5000/len("2/00")) // stream 2 reaches the split size: a stream object of its own
	}
	unanswered := p1.seq
	p1.append(ca, 3)
	delete(p1.acked, p1.seq-1)
	delete(p1.acked, p1.seq-2)
	delete(p1.acked, p1.seq-3)
	if s := e.stream(1); s.EndOffset != 15 || s.State != devcontroller.StreamOpened || s.Owner != 1 {
		t.Fatalf("stream 1 before the kill: %+v", s)
	}
	if err := a.Stop(false); err != nil {
		t.Fatal(err)
	}

	// The new leader keeps getting STREAM_NOT_CLOSED until the failover.
	testutil.Eventually(t, 20*time.Second, "STREAM_NOT_CLOSED answers to the new leader", func() error {
		for _, r := range e.dc.Snapshot().Requests {
			if r.API == "OpenStreams" && r.Code == "STREAM_NOT_CLOSED" && r.Count >= 2 {
				return nil
			}
		}
		return errors.New("no STREAM_NOT_CLOSED answers yet")
	})
	if len(b.Status().GetStreams()) != 1 {
		t.Fatalf("b leads %v before the failover", b.Status().GetStreams())
	}
	rep := e.failover(filepath.Join(e.dir, "a.wal"), 1)
	if !rep.WALReset || rep.Records == 0 {
		t.Fatalf("failover report %+v", rep)
	}
	serving(t, b, 1, 2, 11)
	cb := apiClient(t, b.Addr())
	// The batch the dead broker wrote but never answered is answered as
	// stored by the new leader, with its offsets.
	resp, err := p1.send(cb, unanswered, 3)
	if err != nil || !resp.GetDuplicate() || resp.GetBaseOffset() != 27 {
		t.Fatalf("retry of the unanswered batch: %+v %v", resp, err)
	}
	p1.seq = unanswered + 3
	p1.append(cb, 3)
	p2.append(cb, 2)
	if err := b.UploadNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	p1.readAll(cb)
	p2.readAll(cb)
	// Through a broker that does not lead the stream (committed data only).
	a2 := e.start(e.config("a", 1, 1, 2))
	testutil.Eventually(t, 20*time.Second, "the restarted broker ready", func() error {
		if !a2.Ready() {
			return errors.New("a2 not started")
		}
		return nil
	})
	p1.readAll(apiClient(t, a2.Addr()))
	if got := a2.Status(); len(got.GetStreams()) != 0 || got.GetBrokerEpoch() <= uint64(a.NodeEpoch()) {
		t.Fatalf("a started again: %+v (first epoch %d)", got, a.NodeEpoch())
	}
	for _, n := range e.dc.Snapshot().Nodes {
		if n.NodeID == 1 && (n.FailoverMode || n.NodeEpoch != a2.NodeEpoch()) {
			t.Fatalf("node 1 after its restart: %+v", n)
		}
	}
}

// failover runs walden's AutoMQ failover of node on the WAL at path.
func (e *amqEnv) failover(path string, node int32) *failover.Report {
	e.t.Helper()
	cfg := failover.DefaultConfig()
	cfg.ClusterID = amqCluster
	cfg.Controller.Voters = e.dc.Addrs()
	cfg.StreamSplitSize = 4096
	cc := controller.DefaultConfig()
	cc.Voters = e.dc.Addrs()
	cc.Logger = slog.New(slog.DiscardHandler)
	ctl, err := controller.New(cc)
	if err != nil {
		e.t.Fatal(err)
	}
	defer ctl.Close()
	store, err := objstore.New(context.Background(), e.s3, objstore.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		e.t.Fatal(err)
	}
	f, err := failover.New(cfg, ctl, store, failover.Options{Logger: logger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	rep, err := f.Run(context.Background(), failover.Request{WALPath: path, NodeID: node})
	if err != nil {
		e.t.Fatalf("failover: %v", err)
	}
	return rep
}

// TestAutomqBrokerRecoversItsOwnWAL: a broker that crashed and starts again
// before any failover does what AutoMQ's S3Storage does at startup: it
// commits what its WAL holds beyond the controller's end offsets under its
// new epoch, resets the WAL, closes its streams and opens them again.
func TestAutomqBrokerRecoversItsOwnWAL(t *testing.T) {
	e := newAmqEnv(t, 5)
	a := e.start(e.config("a", 4, 5))
	serving(t, a, 5)
	p := &producerRun{t: t, stream: 5, pid: 9, acked: map[uint64]string{}}
	ca := apiClient(t, a.Addr())
	for i := 0; i < 6; i++ {
		p.append(ca, 4)
	}
	if err := a.Stop(false); err != nil {
		t.Fatal(err)
	}
	if s := e.stream(5); s.EndOffset != 0 || s.State != devcontroller.StreamOpened {
		t.Fatalf("stream 5 after the crash: %+v", s)
	}
	a2 := e.start(e.config("a", 4, 5))
	serving(t, a2, 5)
	s := e.stream(5)
	if s.EndOffset != 24 || s.State != devcontroller.StreamOpened || s.Epoch != 1 {
		t.Fatalf("stream 5 after the restart: %+v", s)
	}
	c2 := apiClient(t, a2.Addr())
	// The producer's state came back from the committed records.
	resp, err := p.send(c2, p.seq-4, 4)
	if err != nil || !resp.GetDuplicate() || resp.GetBaseOffset() != 20 {
		t.Fatalf("retry of the last batch: %+v %v", resp, err)
	}
	p.append(c2, 4)
	p.readAll(c2)
	h, _, err := wal.ReadHeader(filepath.Join(e.dir, "a.wal"))
	if err != nil || h.NodeID != 4 || int64(h.NodeEpoch) != a2.NodeEpoch() {
		t.Fatalf("WAL header %+v %v (epoch %d)", h, err, a2.NodeEpoch())
	}
}

// TestAutomqBrokerAcknowledgesAfterItWasFenced shows what the watchdog is
// for: once the controller fenced the node (a failover's GetOpeningStreams),
// its commits are refused, yet it goes on acknowledging appends into its
// WAL, as AutoMQ 1.4 does.
func TestAutomqBrokerAcknowledgesAfterItWasFenced(t *testing.T) {
	e := newAmqEnv(t, 7)
	a := e.start(e.config("a", 6, 7))
	serving(t, a, 7)
	cc := controller.DefaultConfig()
	cc.Voters = e.dc.Addrs()
	ctl, err := controller.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if _, err := ctl.GetOpeningStreams(context.Background(), 6, a.NodeEpoch(), true); err != nil {
		t.Fatal(err)
	}
	p := &producerRun{t: t, stream: 7, pid: 3, acked: map[uint64]string{}}
	ca := apiClient(t, a.Addr())
	p.append(ca, 2)
	if err := a.UploadNow(context.Background()); !errors.Is(err, protocol.ErrNodeFenced) {
		t.Fatalf("upload after the fence: %v", err)
	}
	p.append(ca, 2)
	if st := a.Status(); !st.GetFenced() || st.GetWalPendingBytes() == 0 {
		t.Fatalf("status after the fence: %+v", st)
	}
}

// TestAutomqBrokerRefuses: another node's WAL stops the start; an append
// to a stream the broker does not lead is NOT_OWNER.
func TestAutomqBrokerRefuses(t *testing.T) {
	e := newAmqEnv(t, 1, 2)
	a := e.start(e.config("a", 1, 1))
	serving(t, a, 1)
	_, err := apiClient(t, a.Addr()).Append(context.Background(), &waldenv1.AppendRequest{StreamId: 2, Records: [][]byte{[]byte("x")}})
	if rpcerr.Reason(err) != refusal.NotOwner {
		t.Fatalf("append to a stream not led: %v", err)
	}
	if err := a.Stop(true); err != nil {
		t.Fatal(err)
	}
	if s := e.stream(1); s.State != devcontroller.StreamClosed {
		t.Fatalf("stream 1 after a graceful stop: %+v", s)
	}
	other, err := broker.NewAutomq(e.config("a", 2, 1), broker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(context.Background()); !errors.Is(err, broker.ErrOtherNode) {
		t.Fatalf("start on node 1's WAL as node 2: %v", err)
	}
}

// TestAutomqBrokerTakesOverFromANodeDeadBeforeItStarted: a broker started
// after the node whose streams it takes over died (its data API never
// answered it) leads them once the controller shows they were opened before;
// a node that never answered and whose streams never opened is left alone.
func TestAutomqBrokerTakesOverFromANodeDeadBeforeItStarted(t *testing.T) {
	e := newAmqEnv(t, 1, 2, 3)
	a := e.start(e.config("a", 1, 1))
	serving(t, a, 1)
	p := &producerRun{t: t, stream: 1, pid: 5, acked: map[uint64]string{}}
	p.append(apiClient(t, a.Addr()), 3)
	deadAddr := a.Addr()
	if err := a.Stop(false); err != nil {
		t.Fatal(err)
	}
	e.failover(filepath.Join(e.dir, "a.wal"), 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	neverUp := ln.Addr().String()
	ln.Close()
	bcfg := e.config("b", 2, 2)
	bcfg.Automq.Takeover = []config.BrokerAutomqTakeover{{NodeID: 1, Addr: deadAddr, Streams: []uint64{1}},
		{NodeID: 3, Addr: neverUp, Streams: []uint64{3}}}
	b := e.start(bcfg)
	serving(t, b, 1, 2)
	p.readAll(apiClient(t, b.Addr()))
	time.Sleep(3 * bcfg.Automq.TakeoverAfter)
	if s := e.stream(3); s.State != devcontroller.StreamClosed || len(s.Ranges) != 0 {
		t.Fatalf("stream 3 of a node that never started: %+v", s)
	}
}
