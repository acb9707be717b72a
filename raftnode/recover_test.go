package raftnode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
	"walden/raftnode"
	"walden/raftnode/raftnodetest"
)

func noopCount(t *testing.T, n *raftnode.Node) uint64 {
	t.Helper()
	data, err := n.SnapshotForTest()
	if err != nil {
		t.Fatal(err)
	}
	st := new(waldenv1.StateSnapshot)
	if err := proto.Unmarshal(data, st); err != nil {
		t.Fatal(err)
	}
	return st.GetNoopCount()
}

// TestForceNewClusterAfterLosingTwoOfThree: with two of three members gone
// for good, the survivor's log is rewritten to a cluster of one; it elects
// itself, keeps every entry it had (the uncommitted tail included), serves
// writes, and takes a new member again.
func TestForceNewClusterAfterLosingTwoOfThree(t *testing.T) {
	c := newTestCluster(t, func(cfg *raftnode.Config) { cfg.SnapshotCount, cfg.SnapshotCatchUpEntries = 15, 5 }, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	for i := range 40 {
		c.mustPropose(leader, fmt.Sprintf("p%d", i))
	}
	c.converged(c.ids()...)
	c.stopAll()

	dir := c.member("c2").dir
	st, err := raftlog.Open(dir, c.name, "c2", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	removed, err := raftnode.ForceNewCluster(st, "c2", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 {
		t.Fatalf("removed %x, want c1 and c3", removed)
	}
	// A second run finds the member alone and changes nothing.
	if again, err := raftnode.ForceNewCluster(st, "c2", nil); err != nil || len(again) != 0 {
		t.Fatalf("second run: %x %v", again, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	c.start("c2")
	if l := c.leaderAmong("c2"); l != "c2" {
		t.Fatalf("leader %s", l)
	}
	testutil.EventuallyTrue(t, testDeadline, "c2 ready", func() bool { return c.node("c2").Ready() })
	if got := noopCount(t, c.node("c2")); got != 40 {
		t.Fatalf("%d noops after the forced restart, want 40", got)
	}
	st2 := c.node("c2").Status()
	if len(st2.Members) != 1 || st2.Members[0].GetId() != "c2" {
		t.Fatalf("members %v", st2.Members)
	}
	c.mustPropose("c2", "after")
	if got := noopCount(t, c.node("c2")); got != 41 {
		t.Fatalf("%d noops after a write, want 41", got)
	}
}

// TestForceNewClusterRefusesANonVoter: a member that is not a voter of its
// log (here: an empty log) cannot become the only one.
func TestForceNewClusterRefusesANonVoter(t *testing.T) {
	if _, err := raftnode.ForceNewCluster(raftnodetest.NewMemStorage(), "c1", nil); !errors.Is(err, raftnode.ErrNotVoterInLog) {
		t.Fatalf("empty log: %v, want ErrNotVoterInLog", err)
	}
}

// TestWriteRestoredState: three members restored from the same snapshot
// data agree on their logs and elect a leader among themselves; the state
// is the snapshot's.
func TestWriteRestoredState(t *testing.T) {
	src := newTestCluster(t, nil, "a1")
	src.leaderAmong("a1")
	for i := range 7 {
		src.mustPropose("a1", fmt.Sprintf("p%d", i))
	}
	data, err := src.node("a1").SnapshotForTest()
	if err != nil {
		t.Fatal(err)
	}
	index := src.node("a1").Status().AppliedIndex
	src.stopAll()

	// The new cluster's name and members replace the old ones (the backup
	// package rewrites them; here by hand).
	c := defineTestCluster(t, nil, "c1", "c2", "c3")
	snap := new(waldenv1.StateSnapshot)
	if err := proto.Unmarshal(data, snap); err != nil {
		t.Fatal(err)
	}
	snap.ClusterName = c.name
	snap.Members = nil
	for _, m := range c.initial {
		snap.Members = append(snap.Members, &waldenv1.Member{Id: m.GetId(), RaftId: raftnode.RaftID(m.GetId()), RaftAddr: m.GetRaftAddr(), AdminAddr: m.GetAdminAddr()})
	}
	data, err = proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := fsm.New(c.name).Restore(data); err != nil {
		t.Fatalf("rewritten snapshot refused: %v", err)
	}
	for _, id := range []string{"c1", "c2", "c3"} {
		dir := filepath.Join(t.TempDir(), id)
		st, err := raftlog.Open(dir, c.name, id, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := raftnode.WriteRestoredState(st, index, c.initial, data); err != nil {
			t.Fatal(err)
		}
		if err := raftnode.WriteRestoredState(st, index, c.initial, data); !errors.Is(err, raftnode.ErrStorageNotEmpty) {
			t.Fatalf("second restore into the same storage: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		c.members[id] = &testMember{id: id, dir: dir}
		c.mu.Unlock()
		c.start(id)
	}
	leader := c.leaderAmong("c1", "c2", "c3")
	if got := noopCount(t, c.node(leader)); got != 7 {
		t.Fatalf("%d noops restored, want 7", got)
	}
	c.mustPropose(leader, "after")
	c.converged("c1", "c2", "c3")
	if got := noopCount(t, c.node("c3")); got != 8 {
		t.Fatalf("%d noops after a write, want 8", got)
	}
	if n := len(c.node("c1").Status().Members); n != 3 {
		t.Fatalf("%d members", n)
	}
}

// TestReaddedMemberKeepsRunning: a member removed and added again under the
// same name (a replacement with an empty data dir) replays its own removal
// and then its addition from the leader's log; it must keep running and
// become a voter, or the cluster would count a dead voter.
func TestReaddedMemberKeepsRunning(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	other := "c3"
	if leader == other {
		other = "c2"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.node(leader).RemoveMember(ctx, other); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.node(other).Done():
	case <-time.After(testDeadline):
		t.Fatalf("removed %s did not stop", other)
	}
	c.stop(other)
	if err := os.RemoveAll(c.member(other).dir); err != nil {
		t.Fatal(err)
	}
	if err := c.node(leader).AddMember(ctx, &waldenv1.MemberContext{Id: other, RaftAddr: "mem://" + other}); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.joining = map[string]bool{other: true}
	c.mu.Unlock()
	c.start(other)
	testutil.EventuallyTrue(t, testDeadline, other+" promoted to voter", func() bool {
		voter, _ := c.node(leader).Role(raftnode.RaftID(other))
		return voter
	})
	// A member that applied its own removal stops two election timeouts
	// later: it must still run well after that.
	select {
	case <-c.node(other).Done():
		t.Fatalf("%s stopped after it was added again", other)
	case <-time.After(4 * c.node(other).ElectionTimeout()):
	}
	c.mustPropose(leader, "after")
	c.converged(c.ids()...)
}
