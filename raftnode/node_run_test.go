package raftnode_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
	"walden/raftnode/raftnodetest"
)

// errRefused is what testSM returns for a Noop whose payload is "refuse".
var errRefused = errors.New("test: command refused")

// testSM is a small deterministic state machine: it counts Noops and keeps
// the membership from conf change contexts.
type testSM struct {
	mu      sync.Mutex
	applied uint64
	count   uint64
	members map[string]*waldenv1.Member
}

func newTestSM() *testSM { return &testSM{members: make(map[string]*waldenv1.Member)} }

func (s *testSM) Apply(index, term uint64, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied = index
	if string(cmd.GetNoop().GetPayload()) == "refuse" {
		return nil, errRefused
	}
	s.count++
	return &waldenv1.Result{Index: index, Value: &waldenv1.Result_Noop{Noop: &waldenv1.NoopResult{Count: s.count}}}, nil
}

func (s *testSM) ApplyConfChange(index uint64, cc *raftpb.ConfChangeV2, ctx *waldenv1.ConfChangeContext, _ *raftpb.ConfState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied = index
	for _, ch := range cc.GetChanges() {
		switch ch.GetType() {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			if m := ctx.GetMember(); m != nil && raftnode.RaftID(m.GetId()) == ch.GetNodeId() {
				s.members[m.GetId()] = &waldenv1.Member{Id: m.GetId(), RaftId: ch.GetNodeId(), RaftAddr: m.GetRaftAddr(), AdminAddr: m.GetAdminAddr()}
			}
		case raftpb.ConfChangeRemoveNode:
			for id, m := range s.members {
				if m.GetRaftId() == ch.GetNodeId() {
					delete(s.members, id)
				}
			}
		}
	}
	return nil
}

func (s *testSM) Snapshot() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := &waldenv1.StateSnapshot{Version: 1, AppliedIndex: s.applied, NoopCount: s.count}
	for _, m := range s.membersLocked() {
		snap.Members = append(snap.Members, m)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(snap)
}

func (s *testSM) Restore(data []byte) error {
	snap := new(waldenv1.StateSnapshot)
	if err := proto.Unmarshal(data, snap); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied, s.count = snap.GetAppliedIndex(), snap.GetNoopCount()
	s.members = make(map[string]*waldenv1.Member)
	for _, m := range snap.GetMembers() {
		s.members[m.GetId()] = m
	}
	return nil
}

func (s *testSM) AppliedIndex() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

func (s *testSM) Members() []*waldenv1.Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.membersLocked()
}

func (s *testSM) membersLocked() []*waldenv1.Member {
	out := make([]*waldenv1.Member, 0, len(s.members))
	for _, m := range s.members {
		out = append(out, proto.Clone(m).(*waldenv1.Member))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetId() < out[j].GetId() })
	return out
}

// TestSingleMemberNode runs the node against the in-memory storage adapter:
// a one-member cluster elects itself, applies proposals, returns the state
// machine's refusal, serves a linearizable read, and snapshots.
func TestSingleMemberNode(t *testing.T) {
	nw := raftnodetest.NewNetwork(1)
	sm := newTestSM()
	st := raftnodetest.NewMemStorage()
	n, err := raftnode.NewNode(raftnode.Config{
		ClusterName: "demo", NodeID: "solo", TickInterval: 5 * time.Millisecond,
		InitialCluster: []*waldenv1.MemberContext{{Id: "solo", RaftAddr: "mem"}},
		SnapshotCount:  10, SnapshotCatchUpEntries: 2, Logger: testLogger(t),
	}, sm, st, nw.Transport("solo"))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	testutil.EventuallyTrue(t, 5*time.Second, "self-election", func() bool { return n.IsLeader() && n.Ready() })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 25 {
		res, err := n.Propose(ctx, noop(fmt.Sprint(i)))
		if err != nil {
			t.Fatalf("propose %d: %v", i, err)
		}
		if res.GetNoop().GetCount() != uint64(i+1) {
			t.Fatalf("proposal %d: count %d", i, res.GetNoop().GetCount())
		}
	}
	if _, err := n.Propose(ctx, noop("refuse")); !errors.Is(err, errRefused) {
		t.Fatalf("refused command: err = %v, want errRefused", err)
	}
	if err := n.LinearizableRead(ctx); err != nil {
		t.Fatalf("LinearizableRead: %v", err)
	}
	snap, err := st.Snapshot()
	if err != nil || snap.GetMetadata().GetIndex() == 0 {
		t.Fatalf("no snapshot after 25 entries with SnapshotCount 10: %v %v", snap.GetMetadata(), err)
	}
	if first, _ := st.FirstIndex(); first <= 1 {
		t.Fatalf("log not compacted: first index %d", first)
	}
	s := n.Status()
	if s.LeaderID != "solo" || s.RaftState != "leader" || len(s.Members) != 1 || s.Members[0].GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEADER || !s.Members[0].GetReachable() {
		t.Fatalf("status = %+v", s)
	}
	// The membership refusals, and what an API answers of them: a sentence
	// without the package chain of the logs.
	for _, tc := range []struct {
		err      error
		sentinel error
		sentence string
	}{
		{n.TransferLeadership(ctx, "nobody"), raftnode.ErrUnknownMember, `transfer leadership to "nobody": no member has that id`},
		{n.RemoveMember(ctx, "solo"), raftnode.ErrLastVoter, `remove member "solo": it is the last voter: the cluster could decide nothing without it`},
		{n.AddMember(ctx, &waldenv1.MemberContext{Id: "solo", RaftAddr: "x"}), raftnode.ErrMemberExists, `add member "solo": a member with that id is already in the cluster`},
		{n.AddMember(ctx, &waldenv1.MemberContext{Id: "x"}), raftnode.ErrInvalidMember, `add member "x": the member's description is invalid: raft_addr is empty`},
		{n.AddMember(ctx, &waldenv1.MemberContext{}), raftnode.ErrInvalidMember, `add member: the member's description is invalid: id is empty`},
	} {
		if !errors.Is(tc.err, tc.sentinel) || raftnode.Sentence(tc.err) != tc.sentence || !strings.HasPrefix(tc.err.Error(), "raftnode: ") {
			t.Errorf("%v: sentence %q, want %q (%v)", tc.err, raftnode.Sentence(tc.err), tc.sentence, tc.sentinel)
		}
	}

	n.Stop()
	if _, err := n.Propose(ctx, noop("late")); !errors.Is(err, raftnode.ErrStopped) {
		t.Fatalf("propose after stop: %v", err)
	}
	select {
	case <-n.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
}

func TestNewNodeRejectsBadInput(t *testing.T) {
	nw := raftnodetest.NewNetwork(1)
	if _, err := raftnode.NewNode(raftnode.Config{NodeID: "c1"}, newTestSM(), raftnodetest.NewMemStorage(), nw.Transport("c1")); !errors.Is(err, raftnode.ErrInvalidConfig) {
		t.Fatalf("missing cluster name: %v", err)
	}
	if _, err := raftnode.NewNode(raftnode.Config{ClusterName: "demo", NodeID: "c1"}, nil, raftnodetest.NewMemStorage(), nw.Transport("c1")); err == nil {
		t.Fatal("nil state machine accepted")
	}
}

func TestNodeMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	nw := raftnodetest.NewNetwork(1)
	n, err := raftnode.NewNode(raftnode.Config{
		ClusterName: "demo", NodeID: "solo", TickInterval: 5 * time.Millisecond,
		InitialCluster: []*waldenv1.MemberContext{{Id: "solo", RaftAddr: "mem"}},
		SnapshotCount:  5, Logger: testLogger(t), Registerer: reg,
	}, newTestSM(), raftnodetest.NewMemStorage(), nw.Transport("solo"))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	testutil.EventuallyTrue(t, 5*time.Second, "self-election", n.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 8 {
		if _, err := n.Propose(ctx, noop(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := make(map[string]float64)
	for _, f := range families {
		m := f.GetMetric()[0]
		switch {
		case m.GetGauge() != nil:
			values[f.GetName()] = m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			values[f.GetName()] = m.GetCounter().GetValue()
		case m.GetHistogram() != nil:
			values[f.GetName()] = float64(m.GetHistogram().GetSampleCount())
		}
	}
	checks := map[string]func(float64) bool{
		"walden_raft_term":                      func(v float64) bool { return v >= 1 },
		"walden_raft_leader_changes_total":      func(v float64) bool { return v >= 1 },
		"walden_raft_commit_index":              func(v float64) bool { return v >= 9 },
		"walden_raft_applied_index":             func(v float64) bool { return v >= 9 },
		"walden_raft_proposals_committed_total": func(v float64) bool { return v == 8 },
		"walden_raft_proposals_failed_total":    func(v float64) bool { return v == 0 },
		"walden_raft_proposal_duration_seconds": func(v float64) bool { return v == 8 },
		"walden_raft_snapshots_total":           func(v float64) bool { return v >= 1 },
		"walden_raft_peer_send_failures_total":  func(v float64) bool { return v == 0 },
		"walden_raft_has_leader":                func(v float64) bool { return v == 1 },
	}
	for name, ok := range checks {
		v, found := values[name]
		if !found || !ok(v) {
			t.Errorf("%s = %v (exported: %v)", name, v, found)
		}
	}
	// A node that fails to start leaves nothing registered behind.
	reg2 := prometheus.NewRegistry()
	if _, err := raftnode.NewNode(raftnode.Config{ClusterName: "demo", NodeID: "x", Registerer: reg2, Logger: testLogger(t)},
		newTestSM(), &brokenStorage{raftnodetest.NewMemStorage()}, nw.Transport("x")); err == nil {
		t.Fatal("NewNode over a broken storage succeeded")
	}
	if fams, _ := reg2.Gather(); len(fams) != 0 {
		t.Fatalf("%d metric families left registered by a failed NewNode", len(fams))
	}
	// A second node on the same registry is refused, naming the problem.
	if _, err := raftnode.NewNode(raftnode.Config{ClusterName: "demo", NodeID: "other", Registerer: reg, Logger: testLogger(t)},
		newTestSM(), raftnodetest.NewMemStorage(), nw.Transport("other")); err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Fatalf("duplicate registration: %v", err)
	}
}

// failingStorage fails every Save after the first ok ones.
type failingStorage struct {
	*raftnodetest.MemStorage
	mu sync.Mutex
	ok int
}

func (s *failingStorage) Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ok == 0 {
		return errors.New("test: disk full")
	}
	s.ok--
	return s.MemStorage.Save(hs, ents, snap)
}

func TestNodeStopsOnStorageError(t *testing.T) {
	nw := raftnodetest.NewNetwork(1)
	st := &failingStorage{MemStorage: raftnodetest.NewMemStorage(), ok: 1000}
	n, err := raftnode.NewNode(raftnode.Config{
		ClusterName: "demo", NodeID: "solo", TickInterval: 5 * time.Millisecond,
		InitialCluster: []*waldenv1.MemberContext{{Id: "solo", RaftAddr: "mem"}}, Logger: testLogger(t),
	}, newTestSM(), st, nw.Transport("solo"))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	testutil.EventuallyTrue(t, 5*time.Second, "self-election", n.IsLeader)
	st.mu.Lock()
	st.ok = 0
	st.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.Propose(ctx, noop("lost")); !errors.Is(err, raftnode.ErrStopped) {
		t.Fatalf("propose when the disk fails: %v, want ErrStopped", err)
	}
	select {
	case <-n.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after a storage error")
	}
	if n.Ready() || n.IsLeader() {
		t.Fatal("stopped member still ready or leading")
	}
}

// brokenStorage cannot read its state.
type brokenStorage struct{ *raftnodetest.MemStorage }

func (s *brokenStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	return nil, nil, errors.New("test: unreadable")
}
