package raftnode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

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

// Timings of the in-process clusters: 10ms ticks, 100ms election timeout.
const (
	testTick     = 10 * time.Millisecond
	testDeadline = 15 * time.Second
)

// recordingSM wraps a StateMachine, serializes every call to it (tests read
// it concurrently with the apply path) and records the request id and
// payload of every applied command, in order, to compare members.
type recordingSM struct {
	mu      sync.Mutex
	inner   raftnode.StateMachine
	applied []appliedCommand
}

type appliedCommand struct {
	requestID uint64
	payload   string
}

func (r *recordingSM) Apply(index, term uint64, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, appliedCommand{cmd.GetRequestId(), string(cmd.GetNoop().GetPayload())})
	return r.inner.Apply(index, term, cmd)
}

func (r *recordingSM) ApplyConfChange(index uint64, cc *raftpb.ConfChangeV2, ctx *waldenv1.ConfChangeContext, cs *raftpb.ConfState) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inner.ApplyConfChange(index, cc, ctx, cs)
}

func (r *recordingSM) Snapshot() ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inner.Snapshot()
}

func (r *recordingSM) Restore(data []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inner.Restore(data)
}

func (r *recordingSM) AppliedIndex() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inner.AppliedIndex()
}

func (r *recordingSM) Members() []*waldenv1.Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inner.Members()
}

func (r *recordingSM) commands() []appliedCommand {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.applied)
}

// testCluster is an in-process cluster on a memnet Network with disk
// storage in temporary directories and the fsm state machine.
type testCluster struct {
	t       *testing.T
	name    string
	net     *raftnodetest.Network
	initial []*waldenv1.MemberContext
	tune    func(*raftnode.Config)
	mu      sync.Mutex
	members map[string]*testMember
	// joining lists members that start as a joining member would
	// (initial_cluster_state: existing): without themselves in the initial
	// cluster, so that empty storage does not bootstrap.
	joining map[string]bool
}

type testMember struct {
	id   string
	dir  string
	node *raftnode.Node
	sm   *recordingSM
	st   *raftlog.DiskStorage
}

// newTestCluster defines a cluster of the members ids and starts them all.
func newTestCluster(t *testing.T, tune func(*raftnode.Config), ids ...string) *testCluster {
	t.Helper()
	c := defineTestCluster(t, tune, ids...)
	for _, id := range ids {
		c.start(id)
	}
	return c
}

// defineTestCluster defines a cluster of the members ids; start them with
// start.
func defineTestCluster(t *testing.T, tune func(*raftnode.Config), ids ...string) *testCluster {
	c := &testCluster{t: t, name: "demo", net: raftnodetest.NewNetwork(42), tune: tune, members: make(map[string]*testMember)}
	for _, id := range ids {
		c.initial = append(c.initial, &waldenv1.MemberContext{Id: id, RaftAddr: "mem://" + id, AdminAddr: "admin://" + id})
	}
	t.Cleanup(c.stopAll)
	return c
}

// start starts member id, from its data directory if it ran before.
func (c *testCluster) start(id string) *testMember {
	c.t.Helper()
	c.mu.Lock()
	m := c.members[id]
	if m == nil {
		m = &testMember{id: id, dir: filepath.Join(c.t.TempDir(), id)}
		c.members[id] = m
	}
	c.mu.Unlock()
	st, err := raftlog.Open(m.dir, c.name, id, testLogger(c.t))
	if err != nil {
		c.t.Fatalf("open storage of %s: %v", id, err)
	}
	cfg := raftnode.Config{
		ClusterName: c.name, NodeID: id, InitialCluster: c.initial,
		TickInterval: testTick, ElectionTicks: 10, HeartbeatTicks: 1,
		DataDir: m.dir, Logger: testLogger(c.t),
	}
	c.mu.Lock()
	if c.joining[id] {
		cfg.InitialCluster = slices.DeleteFunc(slices.Clone(c.initial), func(mc *waldenv1.MemberContext) bool { return mc.GetId() == id })
	}
	c.mu.Unlock()
	if c.tune != nil {
		c.tune(&cfg)
	}
	sm := &recordingSM{inner: fsm.New(c.name)}
	n, err := raftnode.NewNode(cfg, sm, st, c.net.Transport(id))
	if err != nil {
		_ = st.Close()
		c.t.Fatalf("start %s: %v", id, err)
	}
	c.mu.Lock()
	m.node, m.sm, m.st = n, sm, st
	c.mu.Unlock()
	return m
}

// stop stops member id and closes its storage.
func (c *testCluster) stop(id string) {
	c.mu.Lock()
	m := c.members[id]
	c.mu.Unlock()
	if m == nil || m.node == nil {
		return
	}
	m.node.Stop()
	if err := m.st.Close(); err != nil {
		c.t.Errorf("close storage of %s: %v", id, err)
	}
	c.mu.Lock()
	m.node = nil
	c.mu.Unlock()
}

func (c *testCluster) stopAll() {
	for _, id := range c.ids() {
		c.stop(id)
	}
}

func (c *testCluster) ids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id := range c.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (c *testCluster) node(id string) *raftnode.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.members[id]; m != nil {
		return m.node
	}
	return nil
}

func (c *testCluster) member(id string) *testMember {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[id]
}

// leaderAmong waits until every running member of ids agrees on one leader
// that is itself among ids, and returns it.
func (c *testCluster) leaderAmong(ids ...string) string {
	c.t.Helper()
	var leader string
	testutil.EventuallyTrue(c.t, testDeadline, fmt.Sprintf("one leader among %v", ids), func() bool {
		leader = ""
		leaders := 0
		for _, id := range ids {
			n := c.node(id)
			if n == nil {
				continue
			}
			if n.IsLeader() {
				leaders++
				leader = id
			}
		}
		if leaders != 1 {
			return false
		}
		for _, id := range ids {
			if n := c.node(id); n != nil && n.LeaderID() != leader {
				return false
			}
		}
		return true
	})
	return leader
}

// propose proposes a Noop with payload through member id.
func (c *testCluster) propose(id, payload string) (*waldenv1.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.node(id).Propose(ctx, noop(payload))
}

func (c *testCluster) mustPropose(id, payload string) *waldenv1.Result {
	c.t.Helper()
	res, err := c.propose(id, payload)
	if err != nil {
		c.t.Fatalf("propose %q via %s: %v", payload, id, err)
	}
	return res
}

// converged waits until the running members among ids have applied the same
// index and hold identical state machines and command sequences.
func (c *testCluster) converged(ids ...string) {
	c.t.Helper()
	testutil.EventuallyTrue(c.t, testDeadline, fmt.Sprintf("%v to converge", ids), func() bool {
		var applied uint64
		var snap []byte
		for i, id := range ids {
			m := c.member(id)
			if m == nil || m.node == nil {
				return false
			}
			s := m.node.Status()
			if s.AppliedIndex != s.CommitIndex {
				return false
			}
			data, err := m.node.SnapshotForTest()
			if err != nil {
				return false
			}
			if i == 0 {
				applied, snap = s.AppliedIndex, data
				continue
			}
			if s.AppliedIndex != applied || !bytes.Equal(data, snap) {
				return false
			}
		}
		return true
	})
}

func payloads(cmds []appliedCommand) []string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.payload
	}
	return out
}

func TestClusterElectsOneLeader(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	for _, id := range c.ids() {
		n := c.node(id)
		testutil.EventuallyTrue(t, testDeadline, id+" ready", n.Ready)
		s := n.Status()
		if s.LeaderID != leader || len(s.Members) != 3 {
			t.Fatalf("%s status: leader %q members %d, want %q and 3", id, s.LeaderID, len(s.Members), leader)
		}
		wantState := "follower"
		if id == leader {
			wantState = "leader"
		}
		if s.RaftState != wantState {
			t.Fatalf("%s raft state %q, want %q", id, s.RaftState, wantState)
		}
	}
	// The leader sees every member reachable, with match indexes (once the
	// followers answered its first appends).
	testutil.EventuallyTrue(t, testDeadline, "match indexes on the leader", func() bool {
		for _, m := range c.node(leader).Status().Members {
			if m.GetMatchIndex() == 0 {
				return false
			}
		}
		return true
	})
	for _, m := range c.node(leader).Status().Members {
		if !m.GetReachable() || m.GetRaftId() != raftnode.RaftID(m.GetId()) || m.GetRaftAddr() != "mem://"+m.GetId() || m.GetAdminAddr() != "admin://"+m.GetId() {
			t.Fatalf("leader's view of %s: %v", m.GetId(), m)
		}
	}
}

func TestClusterReplicates(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	c.leaderAmong("c1", "c2", "c3")
	var want []string
	for i := range 30 {
		via := []string{"c1", "c2", "c3"}[i%3] // followers forward to the leader
		p := fmt.Sprintf("p%d", i)
		res := c.mustPropose(via, p)
		if res.GetNoop().GetCount() != uint64(i+1) || res.GetIndex() == 0 {
			t.Fatalf("proposal %d result %v", i, res)
		}
		want = append(want, p)
	}
	c.converged("c1", "c2", "c3")
	for _, id := range c.ids() {
		if got := payloads(c.member(id).sm.commands()); !slices.Equal(got, want) {
			t.Fatalf("%s applied %v, want %v", id, got, want)
		}
	}
}

func TestClusterLeaderPartitionedAwayStepsDown(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	old := c.leaderAmong("c1", "c2", "c3")
	c.mustPropose(old, "before")
	var majority []string
	for _, id := range c.ids() {
		if id != old {
			majority = append(majority, id)
		}
	}

	c.net.Partition([]string{old}, majority)
	// CheckQuorum: the old leader steps down without hearing from anyone.
	testutil.EventuallyTrue(t, testDeadline, "old leader "+old+" to step down", func() bool { return !c.node(old).IsLeader() })
	leader := c.leaderAmong(majority...)
	if leader == old {
		t.Fatalf("old leader %s re-elected inside the majority", old)
	}
	if _, err := c.propose(old, "cut-off"); err == nil {
		t.Fatal("proposal through the cut-off member succeeded")
	}
	for i := range 5 {
		c.mustPropose(majority[i%2], fmt.Sprintf("during-%d", i))
	}

	c.net.Heal()
	c.leaderAmong("c1", "c2", "c3")
	c.mustPropose(old, "after")
	c.converged("c1", "c2", "c3")
	want := payloads(c.member(leader).sm.commands())
	for _, id := range c.ids() {
		if got := payloads(c.member(id).sm.commands()); !slices.Equal(got, want) {
			t.Fatalf("%s applied %v, leader %v", id, got, want)
		}
	}
	if want[0] != "before" || want[len(want)-1] != "after" || slices.Contains(want, "cut-off") {
		t.Fatalf("applied sequence %v", want)
	}
}

func TestClusterSnapshotCatchUp(t *testing.T) {
	c := newTestCluster(t, func(cfg *raftnode.Config) {
		cfg.SnapshotCount, cfg.SnapshotCatchUpEntries = 20, 5
	}, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	lagging := "c3"
	if leader == lagging {
		lagging = "c2"
	}
	c.mustPropose(leader, "first")
	c.converged(c.ids()...)
	c.stop(lagging)
	for i := range 60 {
		c.mustPropose(leader, fmt.Sprintf("while-down-%d", i))
	}
	first, err := c.member(leader).st.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	lagLast, _ := c.lastIndexOnDisk(lagging)
	if first <= lagLast+1 {
		t.Fatalf("leader log starts at %d, lagging member has up to %d: not compacted past it", first, lagLast)
	}
	c.start(lagging)
	c.converged(c.ids()...)
	if got := c.net.SnapshotsReceived(lagging); got == 0 || c.node(lagging).SnapshotsApplied() == 0 {
		t.Fatalf("%s caught up without a snapshot (%d delivered)", lagging, got)
	}
	// After the snapshot the member applies new entries normally.
	c.mustPropose(lagging, "after")
	c.converged(c.ids()...)
}

// lastIndexOnDisk reads the last log index of a stopped member.
func (c *testCluster) lastIndexOnDisk(id string) (uint64, error) {
	st, err := raftlog.Open(c.member(id).dir, c.name, id, testLogger(c.t))
	if err != nil {
		return 0, err
	}
	defer st.Close()
	return st.LastIndex()
}

func TestClusterAddAndRemoveMember(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	for i := range 10 {
		c.mustPropose(leader, fmt.Sprintf("p%d", i))
	}

	// c4 joins: it is added as a learner, started with empty storage, and
	// promoted by the leader once it caught up.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.node(leader).AddMember(ctx, &waldenv1.MemberContext{Id: "c4", RaftAddr: "mem://c4", AdminAddr: "admin://c4"}); err != nil {
		t.Fatalf("add c4: %v", err)
	}
	if err := c.node(leader).AddMember(ctx, &waldenv1.MemberContext{Id: "c4", RaftAddr: "mem://c4"}); !errors.Is(err, raftnode.ErrMemberExists) {
		t.Fatalf("adding c4 twice: %v", err)
	}
	// Until c4 runs and catches up it stays a learner.
	var c4 *waldenv1.Member
	for _, m := range c.node(leader).Status().Members {
		if m.GetId() == "c4" {
			c4 = m
		}
	}
	if c4.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER || c4.GetMatchIndex() != 0 {
		t.Fatalf("c4 before it started: %v", c4)
	}
	c.start("c4")
	testutil.EventuallyTrue(t, testDeadline, "c4 promoted to voter", func() bool {
		voter, learner := c.node(leader).Role(raftnode.RaftID("c4"))
		return voter && !learner
	})
	c.converged("c1", "c2", "c3", "c4")
	s := c.node(leader).Status()
	if len(s.Members) != 4 {
		t.Fatalf("members after add: %v", s.Members)
	}
	for _, m := range s.Members {
		if m.GetId() == "c4" && (m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_FOLLOWER || m.GetRaftAddr() != "mem://c4" || m.GetAdminAddr() != "admin://c4") {
			t.Fatalf("c4 as seen by the leader: %v", m)
		}
	}

	// Remove the leader itself: it stops, the others elect a new leader.
	if err := c.node(leader).RemoveMember(ctx, leader); err != nil && !errors.Is(err, raftnode.ErrStopped) {
		t.Fatalf("remove %s: %v", leader, err)
	}
	select {
	case <-c.node(leader).Done():
	case <-time.After(testDeadline):
		t.Fatalf("removed member %s did not stop", leader)
	}
	c.stop(leader)
	var rest []string
	for _, id := range []string{"c1", "c2", "c3", "c4"} {
		if id != leader {
			rest = append(rest, id)
		}
	}
	newLeader := c.leaderAmong(rest...)
	c.mustPropose(newLeader, "after-removal")
	c.converged(rest...)
	if s := c.node(newLeader).Status(); len(s.Members) != 3 {
		t.Fatalf("members after removal: %v", s.Members)
	}
	if err := c.node(newLeader).RemoveMember(ctx, leader); !errors.Is(err, raftnode.ErrUnknownMember) {
		t.Fatalf("removing %s twice: %v", leader, err)
	}

	// Remove a follower: it stops itself, the other two go on.
	var follower string
	var remaining []string
	for _, id := range rest {
		if id != newLeader && follower == "" {
			follower = id
		} else {
			remaining = append(remaining, id)
		}
	}
	if err := c.node(newLeader).RemoveMember(ctx, follower); err != nil {
		t.Fatalf("remove follower %s: %v", follower, err)
	}
	select {
	case <-c.node(follower).Done():
	case <-time.After(testDeadline):
		t.Fatalf("removed follower %s did not stop", follower)
	}
	c.stop(follower)
	c.mustPropose(newLeader, "two-members")
	c.converged(remaining...)
	if s := c.node(newLeader).Status(); len(s.Members) != 2 {
		t.Fatalf("members after removing %s: %v", follower, s.Members)
	}
}

func TestClusterRestartAllFromDisk(t *testing.T) {
	c := newTestCluster(t, func(cfg *raftnode.Config) {
		cfg.SnapshotCount, cfg.SnapshotCatchUpEntries = 15, 5
	}, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	for i := range 40 {
		c.mustPropose(leader, fmt.Sprintf("p%d", i))
	}
	c.converged(c.ids()...)
	before, err := c.node(leader).SnapshotForTest()
	if err != nil {
		t.Fatal(err)
	}
	applied := c.node(leader).Status().AppliedIndex
	c.stopAll()

	for _, id := range []string{"c1", "c2", "c3"} {
		c.start(id)
	}
	leader = c.leaderAmong("c1", "c2", "c3")
	testutil.EventuallyTrue(t, testDeadline, "members ready after restart", func() bool {
		for _, id := range c.ids() {
			if !c.node(id).Ready() || c.node(id).Status().AppliedIndex < applied {
				return false
			}
		}
		return true
	})
	got := new(waldenv1.StateSnapshot)
	want := new(waldenv1.StateSnapshot)
	data, _ := c.node("c1").SnapshotForTest()
	if err := proto.Unmarshal(data, got); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(before, want); err != nil {
		t.Fatal(err)
	}
	if got.GetNoopCount() != 40 || len(got.GetMembers()) != 3 {
		t.Fatalf("state after restart: %v (before: %v)", got, want)
	}
	res := c.mustPropose(leader, "after-restart")
	if res.GetNoop().GetCount() != 41 {
		t.Fatalf("count after restart %d, want 41", res.GetNoop().GetCount())
	}
	c.converged(c.ids()...)
}

func TestClusterProposalsUnderFaultsApplyExactlyOnce(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	c.leaderAmong("c1", "c2", "c3")
	c.net.Drop("*", "*", 0.1)
	c.net.Delay("*", "*", time.Millisecond, 4*time.Millisecond)

	var mu sync.Mutex
	succeeded := make(map[string]bool)
	proposed := make(map[string]bool)
	var wg sync.WaitGroup
	for w := range 3 {
		via := []string{"c1", "c2", "c3"}[w]
		wg.Go(func() {
			for i := range 15 {
				p := fmt.Sprintf("%s-%d", via, i)
				mu.Lock()
				proposed[p] = true
				mu.Unlock()
				// A forwarded proposal lost on the way is never answered.
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				_, err := c.node(via).Propose(ctx, noop(p))
				cancel()
				if err == nil {
					mu.Lock()
					succeeded[p] = true
					mu.Unlock()
				} else {
					time.Sleep(20 * time.Millisecond) // e.g. no leader during a re-election
				}
			}
		})
	}
	wg.Wait()
	c.net.Heal()
	c.leaderAmong("c1", "c2", "c3")
	c.mustPropose("c1", "final")
	c.converged(c.ids()...)
	t.Logf("%d of 45 proposals succeeded", len(succeeded))
	if len(succeeded) < 15 {
		t.Fatalf("only %d of 45 proposals succeeded under 10%% loss", len(succeeded))
	}

	ref := c.member("c1").sm.commands()
	seenReq := make(map[uint64]bool)
	seenPayload := make(map[string]int)
	for _, cmd := range ref {
		if seenReq[cmd.requestID] {
			t.Fatalf("request %x applied twice", cmd.requestID)
		}
		seenReq[cmd.requestID] = true
		seenPayload[cmd.payload]++
		if cmd.payload != "final" && !proposed[cmd.payload] {
			t.Fatalf("applied %q that nobody proposed", cmd.payload)
		}
	}
	for p := range succeeded {
		if seenPayload[p] != 1 {
			t.Fatalf("successful proposal %q applied %d times", p, seenPayload[p])
		}
	}
	for _, id := range []string{"c2", "c3"} {
		if got := c.member(id).sm.commands(); !slices.Equal(got, ref) {
			t.Fatalf("%s applied a different sequence than c1", id)
		}
	}
	if delivered, dropped := c.net.Counts(); dropped == 0 || delivered == 0 {
		t.Fatalf("fault injection inactive: delivered %d dropped %d", delivered, dropped)
	}
}

func TestProposeWithoutLeaderFailsFast(t *testing.T) {
	// Only one of three members runs: no quorum, never a leader.
	c := defineTestCluster(t, nil, "c1", "c2", "c3")
	n := c.start("c2").node
	// Give it several election timeouts: it stays without a leader.
	time.Sleep(30 * testTick)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.Propose(ctx, noop("x")); !errors.Is(err, raftnode.ErrNoLeader) {
		t.Fatalf("Propose without leader: %v, want ErrNoLeader", err)
	}
	if err := n.LinearizableRead(ctx); !errors.Is(err, raftnode.ErrNoLeader) {
		t.Fatalf("LinearizableRead without leader: %v, want ErrNoLeader", err)
	}
	if n.Ready() {
		t.Fatal("Ready without a leader")
	}
	if s := n.Status(); s.LeaderID != "" || s.RaftState == "leader" {
		t.Fatalf("status without leader: %+v", s)
	}
}

func TestClusterLinearizableReadAndTransfer(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	var follower string
	for _, id := range c.ids() {
		if id != leader {
			follower = id
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Slow down the follower's incoming appends so that a plain local read
	// would miss the write; the read index makes it wait.
	c.net.Delay(leader, follower, 30*time.Millisecond, 0)
	res := c.mustPropose(leader, "w")
	if err := c.node(follower).LinearizableRead(ctx); err != nil {
		t.Fatalf("LinearizableRead on %s: %v", follower, err)
	}
	if got := c.node(follower).Status().AppliedIndex; got < res.GetIndex() {
		t.Fatalf("after LinearizableRead %s applied %d < written index %d", follower, got, res.GetIndex())
	}
	c.net.Heal()

	if err := c.node(follower).TransferLeadership(ctx, follower); !errors.Is(err, raftnode.ErrNotLeader) {
		t.Fatalf("transfer on a follower: %v, want ErrNotLeader", err)
	}
	if err := c.node(leader).TransferLeadership(ctx, follower); err != nil {
		t.Fatalf("transfer %s -> %s: %v", leader, follower, err)
	}
	if got := c.leaderAmong("c1", "c2", "c3"); got != follower {
		t.Fatalf("leader after transfer %s, want %s", got, follower)
	}
	c.mustPropose(leader, "after-transfer")
}

// TestGRPCTransportCluster runs three members over the real gRPC transport
// on loopback ports.
func TestGRPCTransportCluster(t *testing.T) {
	ids := []string{"g1", "g2", "g3"}
	var initial []*waldenv1.MemberContext
	listeners := make(map[string]net.Listener)
	for _, id := range ids {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[id] = lis
		initial = append(initial, &waldenv1.MemberContext{Id: id, RaftAddr: lis.Addr().String()})
	}
	nodes := make(map[string]*raftnode.Node)
	for _, id := range ids {
		tr := raftnode.NewGRPCTransport(raftnode.GRPCTransportConfig{ClusterName: "demo", NodeID: id, Logger: testLogger(t)})
		srv := grpc.NewServer(raftnode.ServerOptions()...)
		tr.Register(srv)
		go func() { _ = srv.Serve(listeners[id]) }()
		st, err := raftlog.Open(filepath.Join(t.TempDir(), id), "demo", id, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		n, err := raftnode.NewNode(raftnode.Config{
			ClusterName: "demo", NodeID: id, InitialCluster: initial,
			TickInterval: testTick, Logger: testLogger(t),
		}, fsm.New("demo"), st, tr)
		if err != nil {
			t.Fatal(err)
		}
		nodes[id] = n
		t.Cleanup(func() {
			n.Stop()
			srv.Stop()
			_ = st.Close()
		})
	}
	var leader string
	testutil.EventuallyTrue(t, testDeadline, "a leader over gRPC", func() bool {
		leader = ""
		for id, n := range nodes {
			if n.IsLeader() {
				leader = id
			}
		}
		if leader == "" {
			return false
		}
		for _, n := range nodes {
			if n.LeaderID() != leader {
				return false
			}
		}
		return true
	})
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := nodes[ids[i%3]].Propose(ctx, noop(fmt.Sprint(i)))
		cancel()
		if err != nil {
			t.Fatalf("propose %d: %v", i, err)
		}
		if res.GetNoop().GetCount() != uint64(i+1) {
			t.Fatalf("proposal %d count %d", i, res.GetNoop().GetCount())
		}
	}
	testutil.EventuallyTrue(t, testDeadline, "replication over gRPC", func() bool {
		var applied uint64
		for _, n := range nodes {
			s := n.Status()
			if applied == 0 {
				applied = s.AppliedIndex
			}
			if s.AppliedIndex != applied || s.AppliedIndex != s.CommitIndex {
				return false
			}
		}
		return true
	})
	for _, m := range nodes[leader].Status().Members {
		if !m.GetReachable() {
			t.Fatalf("leader sees %s unreachable over gRPC", m.GetId())
		}
	}

	// A member of another cluster is refused.
	conn, err := grpc.NewClient(initial[0].GetRaftAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := waldenv1.NewRaftClient(conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := proto.Marshal(&raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: new(raftnode.RaftID("x9")), To: new(raftnode.RaftID("g1"))})
	_ = stream.Send(&waldenv1.RaftFrame{ClusterName: "other", FromId: "x9", Message: msg})
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("frame of another cluster: %v, want PermissionDenied", err)
	}
}
