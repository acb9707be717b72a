package raftnode_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"walden/raftnode"
)

// TestClusterUpgradesFormat1 starts a 3-member cluster on copies of data
// directories written in format 1 by the bbolt-only storage (50 Noops
// applied, snapshots taken) and checks that it carries on from their state.
func TestClusterUpgradesFormat1(t *testing.T) {
	c := defineTestCluster(t, func(cfg *raftnode.Config) { cfg.SnapshotCount, cfg.SnapshotCatchUpEntries = 20, 5 }, "c1", "c2", "c3")
	for _, id := range []string{"c1", "c2", "c3"} {
		dir := filepath.Join(t.TempDir(), id)
		copyTree(t, filepath.Join("testdata", "v1", "cluster", id), dir)
		c.members[id] = &testMember{id: id, dir: dir}
	}
	for _, id := range c.ids() {
		c.start(id)
	}
	leader := c.leaderAmong("c1", "c2", "c3")
	// The fsm counts Noops: 50 were applied in format 1.
	if res := c.mustPropose(leader, "after-upgrade"); res.GetNoop().GetCount() != 51 {
		t.Fatalf("first Noop after the upgrade is number %d, want 51", res.GetNoop().GetCount())
	}
	c.converged("c1", "c2", "c3")
	for i := range 30 {
		c.mustPropose(leader, fmt.Sprintf("more-%d", i))
	}
	c.converged("c1", "c2", "c3")
	c.stopAll()
	for _, id := range c.ids() {
		c.start(id)
	}
	leader = c.leaderAmong("c1", "c2", "c3")
	if res := c.mustPropose(leader, "after-restart"); res.GetNoop().GetCount() != 82 {
		t.Fatalf("Noop after the restart is number %d, want 82", res.GetNoop().GetCount())
	}
	c.converged("c1", "c2", "c3")
}
