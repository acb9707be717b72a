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

// TestRemovedFollowerThatMissedItsRemovalStops: the leader removes a
// follower that hears nothing from it (its progress probing, every message
// to it lost), so the follower never receives the entry that removes it,
// and no member sends to it once the removal is applied. The follower still
// asks the others for pre-votes; they refuse a member they know was
// removed, and it stops on that answer, without disturbing the others.
func TestRemovedFollowerThatMissedItsRemovalStops(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	c.mustPropose(leader, "before")
	var removed, other string
	for _, id := range []string{"c1", "c2", "c3"} {
		switch {
		case id == leader:
		case removed == "":
			removed = id
		default:
			other = id
		}
	}
	c.net.Drop(leader, removed, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.node(leader).RemoveMember(ctx, removed); err != nil {
		t.Fatalf("remove %s: %v", removed, err)
	}
	term := c.node(leader).Status().Term
	select {
	case <-c.node(removed).Done():
	case <-time.After(testDeadline):
		t.Fatalf("%s, removed while it heard nothing from the leader, did not stop", removed)
	}
	if err := c.node(removed).Err(); err != nil {
		t.Fatalf("%s stopped with a fault: %v", removed, err)
	}
	if voter, _ := c.node(removed).Role(raftnode.RaftID(removed)); !voter {
		t.Fatalf("%s applied its removal: the test did not keep it from it", removed)
	}
	c.stop(removed)
	if got := c.leaderAmong(leader, other); got != leader {
		t.Fatalf("leader %s after the removed member stopped, want %s", got, leader)
	}
	if got := c.node(leader).Status().Term; got != term {
		t.Fatalf("term moved from %d to %d: the removed member disturbed the others", term, got)
	}
	c.mustPropose(leader, "after")
	c.converged(leader, other)
}

// TestRemovalReportsFollowTheMembersOwnLog: a peer's refusal for a removal
// that this member has applied itself is ignored (its own configuration
// decides: a lagging peer may not know yet that it was added again); a
// refusal for a removal beyond its log stops it after the usual linger.
func TestRemovalReportsFollowTheMembersOwnLog(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	c.mustPropose(leader, "before")
	c.converged("c1", "c2", "c3")
	var follower string
	for _, id := range []string{"c1", "c2", "c3"} {
		if id != leader {
			follower = id
		}
	}
	n := c.node(follower)
	applied := n.Status().AppliedIndex
	n.ReportRemoved(raftnode.RaftID(leader), applied)
	select {
	case <-n.Done():
		t.Fatalf("%s stopped on a refusal for a removal at index %d, which it applied", follower, applied)
	case <-time.After(4 * n.ElectionTimeout()):
	}
	c.mustPropose(leader, "still three")

	n.ReportRemoved(raftnode.RaftID(leader), applied+1000)
	select {
	case <-n.Done():
	case <-time.After(testDeadline):
		t.Fatalf("%s kept running after a peer said it was removed beyond its log", follower)
	}
	if err := n.Err(); err != nil {
		t.Fatalf("%s stopped with a fault: %v", follower, err)
	}
}
