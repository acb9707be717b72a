package raftnode_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/fsm"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
	"walden/raftnode"
	"walden/raftnode/raftnodetest"
)

// grpcEndpoint is one transport served on a loopback port.
type grpcEndpoint struct {
	addr string
	tr   *raftnode.GRPCTransport
	srv  *grpc.Server
	h    *raftnodetest.RecordingHandler
}

func serveTransport(t *testing.T, cluster, id, addr string) *grpcEndpoint {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	e := &grpcEndpoint{
		addr: lis.Addr().String(),
		tr:   raftnode.NewGRPCTransport(raftnode.GRPCTransportConfig{ClusterName: cluster, NodeID: id, Logger: testLogger(t), MaxBackoff: 50 * time.Millisecond}),
		srv:  grpc.NewServer(raftnode.ServerOptions()...),
		h:    raftnodetest.NewRecordingHandler(),
	}
	e.tr.Register(e.srv)
	if err := e.tr.Start(e.h); err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.srv.Serve(lis) }()
	t.Cleanup(e.stop)
	return e
}

func (e *grpcEndpoint) stop() {
	e.srv.Stop()
	_ = e.tr.Close()
}

func appFrom(from, to string, index uint64) *raftpb.Message {
	return &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(raftnode.RaftID(from)), To: new(raftnode.RaftID(to)), Index: new(index)}
}

func TestGRPCTransportDeliversInOrderAndReconnects(t *testing.T) {
	a := serveTransport(t, "demo", "a", "")
	b := serveTransport(t, "demo", "b", "")
	a.tr.AddPeer(raftnode.RaftID("b"), b.addr)
	for i := range 100 {
		a.tr.Send([]*raftpb.Message{appFrom("a", "b", uint64(i))})
	}
	testutil.EventuallyTrue(t, 10*time.Second, "100 deliveries", func() bool { n, _, _ := b.h.Counts(); return n == 100 })
	if want := func() []uint64 {
		var w []uint64
		for i := range 100 {
			w = append(w, uint64(i))
		}
		return w
	}(); !slices.Equal(b.h.Indexes(), want) {
		t.Fatalf("deliveries out of order: %v", b.h.Indexes())
	}
	testutil.EventuallyTrue(t, 5*time.Second, "b reachable", func() bool { return a.tr.Reachable(raftnode.RaftID("b")) })

	// b goes down: sends fail and are reported, b becomes unreachable.
	b.stop()
	testutil.EventuallyTrue(t, 10*time.Second, "unreachable reports while b is down", func() bool {
		a.tr.Send([]*raftpb.Message{appFrom("a", "b", 1000)})
		_, u, _ := a.h.Counts()
		return u[raftnode.RaftID("b")] > 0 && !a.tr.Reachable(raftnode.RaftID("b"))
	})

	// b comes back on the same address: the stream is reopened.
	b2 := serveTransport(t, "demo", "b", b.addr)
	testutil.EventuallyTrue(t, 10*time.Second, "delivery after b restarted", func() bool {
		a.tr.Send([]*raftpb.Message{appFrom("a", "b", 2000)})
		n, _, _ := b2.h.Counts()
		return n > 0 && a.tr.Reachable(raftnode.RaftID("b"))
	})
}

func TestGRPCTransportSnapshotReports(t *testing.T) {
	a := serveTransport(t, "demo", "a", "")
	b := serveTransport(t, "demo", "b", "")
	a.tr.AddPeer(raftnode.RaftID("b"), b.addr)
	snap := &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: new(raftnode.RaftID("a")), To: new(raftnode.RaftID("b")),
		Snapshot: &raftpb.Snapshot{Data: make([]byte, 8<<20), Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(9)), Term: new(uint64(2))}}}
	a.tr.Send([]*raftpb.Message{snap})
	testutil.EventuallyTrue(t, 10*time.Second, "snapshot delivered and reported", func() bool {
		n, _, _ := b.h.Counts()
		_, _, s := a.h.Counts()
		return n == 1 && s[raft.SnapshotFinish] == 1
	})

	// A snapshot to an unknown peer fails at once.
	a.tr.Send([]*raftpb.Message{{Type: raftpb.MsgSnap.Enum(), From: new(raftnode.RaftID("a")), To: new(raftnode.RaftID("zz")), Snapshot: snap.GetSnapshot()}})
	testutil.EventuallyTrue(t, 5*time.Second, "snapshot failure for unknown peer", func() bool {
		_, u, s := a.h.Counts()
		return s[raft.SnapshotFailure] == 1 && u[raftnode.RaftID("zz")] == 1
	})
}

func TestGRPCTransportRefusesForeignFrames(t *testing.T) {
	b := serveTransport(t, "demo", "b", "")
	conn, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(f *waldenv1.RaftFrame) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := waldenv1.NewRaftClient(conn).Stream(ctx)
		if err != nil {
			return err
		}
		_ = s.Send(f)
		_, err = s.CloseAndRecv()
		return err
	}
	msg, _ := proto.Marshal(appFrom("a", "b", 1))
	other, _ := proto.Marshal(appFrom("a", "c", 1))
	tests := []struct {
		name  string
		frame *waldenv1.RaftFrame
		code  codes.Code
	}{
		{"other cluster", &waldenv1.RaftFrame{ClusterName: "other", FromId: "a", Message: msg}, codes.PermissionDenied},
		{"from id does not match the message", &waldenv1.RaftFrame{ClusterName: "demo", FromId: "c", Message: msg}, codes.InvalidArgument},
		{"undecodable message", &waldenv1.RaftFrame{ClusterName: "demo", FromId: "a", Message: []byte{0xff, 0xff}}, codes.InvalidArgument},
		{"message for another member", &waldenv1.RaftFrame{ClusterName: "demo", FromId: "a", Message: other}, codes.FailedPrecondition},
		{"valid", &waldenv1.RaftFrame{ClusterName: "demo", FromId: "a", Message: msg}, codes.OK},
	}
	for _, tc := range tests {
		if err := send(tc.frame); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
	if n, _, _ := b.h.Counts(); n != 1 {
		t.Fatalf("%d frames stepped, want only the valid one", n)
	}
}

// TestGRPCTransportReportsRemoval: a receiver that refuses a removed
// member's messages answers MEMBER_REMOVED with the removal index, and the
// sending transport hands it to its node (ReportRemoved).
func TestGRPCTransportReportsRemoval(t *testing.T) {
	a := serveTransport(t, "demo", "a", "")
	b := serveTransport(t, "demo", "b", "")
	b.h.Refuse(&raftnode.RemovedError{Member: "a", Index: 42})
	a.tr.AddPeer(raftnode.RaftID("b"), b.addr)
	// The refusal ends the stream; the next send on it reads the answer.
	testutil.EventuallyTrue(t, 10*time.Second, "a told it was removed", func() bool {
		a.tr.Send([]*raftpb.Message{{Type: raftpb.MsgPreVote.Enum(), From: new(raftnode.RaftID("a")), To: new(raftnode.RaftID("b"))}})
		return a.h.Removed()[raftnode.RaftID("b")] == 42
	})
	if n, _, _ := b.h.Counts(); n != 0 {
		t.Fatalf("%d refused messages recorded as stepped", n)
	}
}

// BenchmarkGRPCCluster3 measures proposals/s and commit latency of a
// 3-member cluster over the gRPC transport on loopback with disk storage
// (fsync per Ready), the fsm state machine and production timings, with
// 256-byte Noop payloads.
// Each concurrency level runs for a bounded time (benchFor) whatever b.N.
func BenchmarkGRPCCluster3(b *testing.B) {
	for _, conc := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			nodes := startGRPCBenchCluster(b)
			leader := waitGRPCLeader(b, nodes)
			rate, p50, p99, n, failed := runProposals(b, leader, conc, 256, benchFor)
			b.ReportMetric(rate, "proposals/s")
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(n), "proposals")
			b.ReportMetric(float64(failed), "failed")
		})
	}
}

const benchFor = 2 * time.Second

func startGRPCBenchCluster(b *testing.B) []*raftnode.Node {
	b.Helper()
	ids := []string{"b1", "b2", "b3"}
	var initial []*waldenv1.MemberContext
	lis := make([]net.Listener, len(ids))
	for i, id := range ids {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lis[i] = l
		initial = append(initial, &waldenv1.MemberContext{Id: id, RaftAddr: l.Addr().String()})
	}
	var nodes []*raftnode.Node
	for i, id := range ids {
		tr := raftnode.NewGRPCTransport(raftnode.GRPCTransportConfig{ClusterName: "bench", NodeID: id, Logger: testLogger(b)})
		srv := grpc.NewServer(raftnode.ServerOptions()...)
		tr.Register(srv)
		go func() { _ = srv.Serve(lis[i]) }()
		st, err := raftlog.Open(filepath.Join(b.TempDir(), id), "bench", id, testLogger(b))
		if err != nil {
			b.Fatal(err)
		}
		// Production timings (100ms ticks, 1s election timeout): a loaded
		// machine must not cause leader changes during the run.
		n, err := raftnode.NewNode(raftnode.Config{ClusterName: "bench", NodeID: id, InitialCluster: initial,
			Logger: testLogger(b)}, fsm.New("bench"), st, tr)
		if err != nil {
			b.Fatal(err)
		}
		nodes = append(nodes, n)
		b.Cleanup(func() { n.Stop(); srv.Stop(); _ = st.Close() })
	}
	return nodes
}

func waitGRPCLeader(b *testing.B, nodes []*raftnode.Node) *raftnode.Node {
	b.Helper()
	var leader *raftnode.Node
	testutil.EventuallyTrue(b, 10*time.Second, "a leader", func() bool {
		for _, n := range nodes {
			if n.IsLeader() && n.Ready() {
				leader = n
				return true
			}
		}
		return false
	})
	return leader
}

// runProposals proposes from conc goroutines through n for d and returns
// the rate, the p50 and p99 latencies, the number of proposals and the
// number that failed (a leader change on a loaded machine fails a few).
func runProposals(b *testing.B, n *raftnode.Node, conc, payload int, d time.Duration) (float64, time.Duration, time.Duration, int, int) {
	b.Helper()
	data := make([]byte, payload)
	var mu sync.Mutex
	var lat []time.Duration
	var failed int
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				t0 := time.Now()
				_, err := n.Propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_Noop{Noop: &waldenv1.Noop{Payload: data}}})
				cancel()
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					time.Sleep(10 * time.Millisecond) // no leader for a moment
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(lat) == 0 {
		b.Fatal("no proposal completed")
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return float64(len(lat)) / elapsed.Seconds(), pct(0.50), pct(0.99), len(lat), failed
}

// grpcCluster runs members over the gRPC transport on fixed loopback
// addresses, with disk storage, so that a member can be stopped and
// restarted on the same address from its data directory.
type grpcCluster struct {
	t       *testing.T
	initial []*waldenv1.MemberContext
	dirs    map[string]string
	running map[string]*grpcMember
}

type grpcMember struct {
	node *raftnode.Node
	srv  *grpc.Server
	st   *raftlog.DiskStorage
}

func newGRPCCluster(t *testing.T, ids ...string) *grpcCluster {
	c := &grpcCluster{t: t, dirs: make(map[string]string), running: make(map[string]*grpcMember)}
	for _, id := range ids {
		// Reserve a port, then free it for the member to listen on.
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c.initial = append(c.initial, &waldenv1.MemberContext{Id: id, RaftAddr: lis.Addr().String()})
		_ = lis.Close()
		c.dirs[id] = filepath.Join(t.TempDir(), id)
	}
	t.Cleanup(func() {
		for id := range c.running {
			c.stop(id)
		}
	})
	for _, id := range ids {
		c.start(id)
	}
	return c
}

func (c *grpcCluster) addr(id string) string {
	for _, m := range c.initial {
		if m.GetId() == id {
			return m.GetRaftAddr()
		}
	}
	return ""
}

func (c *grpcCluster) start(id string) {
	c.t.Helper()
	lis, err := net.Listen("tcp", c.addr(id))
	if err != nil {
		c.t.Fatal(err)
	}
	tr := raftnode.NewGRPCTransport(raftnode.GRPCTransportConfig{ClusterName: "demo", NodeID: id, Logger: testLogger(c.t), MaxBackoff: 100 * time.Millisecond})
	srv := grpc.NewServer(raftnode.ServerOptions()...)
	tr.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	st, err := raftlog.Open(c.dirs[id], "demo", id, testLogger(c.t))
	if err != nil {
		c.t.Fatal(err)
	}
	n, err := raftnode.NewNode(raftnode.Config{
		ClusterName: "demo", NodeID: id, InitialCluster: c.initial, TickInterval: testTick,
		SnapshotCount: 20, SnapshotCatchUpEntries: 5, Logger: testLogger(c.t),
	}, fsm.New("demo"), st, tr)
	if err != nil {
		c.t.Fatal(err)
	}
	c.running[id] = &grpcMember{node: n, srv: srv, st: st}
}

func (c *grpcCluster) stop(id string) {
	m := c.running[id]
	delete(c.running, id)
	m.node.Stop()
	m.srv.Stop()
	_ = m.st.Close()
}

func (c *grpcCluster) leader() string {
	c.t.Helper()
	var leader string
	testutil.EventuallyTrue(c.t, testDeadline, "one leader over gRPC", func() bool {
		leader = ""
		for id, m := range c.running {
			if m.node.IsLeader() {
				leader = id
			}
		}
		if leader == "" {
			return false
		}
		for _, m := range c.running {
			if m.node.LeaderID() != leader {
				return false
			}
		}
		return true
	})
	return leader
}

// TestGRPCClusterMemberCatchesUpBySnapshot stops a member, lets the others
// compact their logs past it, and restarts it from its data directory on the
// same address: the peers reconnect and it catches up by a snapshot sent over
// gRPC.
func TestGRPCClusterMemberCatchesUpBySnapshot(t *testing.T) {
	c := newGRPCCluster(t, "g1", "g2", "g3")
	leader := c.leader()
	lagging := "g3"
	if leader == lagging {
		lagging = "g1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c.stop(lagging)
	for i := range 50 {
		if _, err := c.running[leader].node.Propose(ctx, noop(fmt.Sprint(i))); err != nil {
			t.Fatalf("propose %d with %s down: %v", i, lagging, err)
		}
	}
	if first, _ := c.running[leader].st.FirstIndex(); first < 10 {
		t.Fatalf("leader log not compacted: first index %d", first)
	}
	c.start(lagging)
	want := c.running[leader].node.Status().CommitIndex
	testutil.EventuallyTrue(t, testDeadline, lagging+" to catch up", func() bool {
		s := c.running[lagging].node.Status()
		return s.AppliedIndex >= want && s.LeaderID == leader
	})
	if got := c.running[lagging].node.SnapshotsApplied(); got == 0 {
		t.Fatalf("%s caught up without a snapshot from the leader", lagging)
	}
	res, err := c.running[lagging].node.Propose(ctx, noop("after"))
	if err != nil || res.GetNoop().GetCount() != 51 {
		t.Fatalf("proposal through %s after catch-up: %v %v", lagging, res, err)
	}
	testutil.EventuallyTrue(t, testDeadline, "leader sees everyone reachable", func() bool {
		for _, m := range c.running[leader].node.Status().Members {
			if !m.GetReachable() {
				return false
			}
		}
		return true
	})
}

// reachableFrom returns the members that member id reports reachable.
func (c *grpcCluster) reachableFrom(id string) map[string]bool {
	out := make(map[string]bool)
	for _, m := range c.running[id].node.Status().Members {
		out[m.GetId()] = m.GetReachable()
	}
	return out
}

// TestGRPCReachableFromEveryMember checks that every member, followers
// included, reports every live peer reachable and a stopped one unreachable,
// and that a restarted member is reachable again from a follower that never
// sends to it.
func TestGRPCReachableFromEveryMember(t *testing.T) {
	c := newGRPCCluster(t, "g1", "g2", "g3")
	leader := c.leader()
	var followers []string
	for _, id := range []string{"g1", "g2", "g3"} {
		if id != leader {
			followers = append(followers, id)
		}
	}
	allReachable := func(from string, want map[string]bool) func() bool {
		return func() bool {
			got := c.reachableFrom(from)
			for id, w := range want {
				if got[id] != w {
					return false
				}
			}
			return true
		}
	}
	everyone := map[string]bool{"g1": true, "g2": true, "g3": true}
	for id := range c.running {
		testutil.EventuallyTrue(t, testDeadline, id+" sees every member reachable", allReachable(id, everyone))
	}

	// Stop one follower: the leader and the other follower report it
	// unreachable and each other reachable.
	gone, other := followers[0], followers[1]
	c.stop(gone)
	want := map[string]bool{leader: true, other: true, gone: false}
	testutil.EventuallyTrue(t, testDeadline, leader+" sees "+gone+" unreachable", allReachable(leader, want))
	testutil.EventuallyTrue(t, testDeadline, other+" sees "+gone+" unreachable", allReachable(other, want))

	// Restart it: the follower that never sends to it sees it reachable
	// again, and it sees everyone.
	c.start(gone)
	testutil.EventuallyTrue(t, testDeadline, other+" sees "+gone+" reachable again", allReachable(other, everyone))
	testutil.EventuallyTrue(t, testDeadline, gone+" sees every member reachable", allReachable(gone, everyone))
}
