package raftnode_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"walden/raftnode"
)

// The leader of a two-voter cluster removes itself. The removal is
// committed by both voters, but the survivor only learns so from the
// leader: if the leader stops before telling it, the survivor keeps the old
// configuration, in which it cannot win an election without the stopped
// member, and the cluster never has a leader again.
func TestClusterLeaderRemovesItselfFromTwoVoters(t *testing.T) {
	for round := range 3 {
		c := newTestCluster(t, nil, "c1", "c2")
		leader := c.leaderAmong("c1", "c2")
		c.mustPropose(leader, "before")
		survivor := "c1"
		if leader == "c1" {
			survivor = "c2"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.node(leader).RemoveMember(ctx, leader); err != nil && !errors.Is(err, raftnode.ErrStopped) {
			cancel()
			t.Fatalf("round %d: remove %s: %v", round, leader, err)
		}
		cancel()
		select {
		case <-c.node(leader).Done():
		case <-time.After(testDeadline):
			t.Fatalf("round %d: removed leader %s did not stop", round, leader)
		}
		c.stop(leader)
		if got := c.leaderAmong(survivor); got != survivor {
			t.Fatalf("round %d: leader %q, want %q", round, got, survivor)
		}
		c.mustPropose(survivor, "after")
		if voter, _ := c.node(survivor).Role(raftnode.RaftID(leader)); voter {
			t.Fatalf("round %d: %s still a voter on %s", round, leader, survivor)
		}
		c.stopAll()
	}
}
