package raftnode_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// TestMemberAddedAgainUnderItsNameCommits: the runbook's replacement under
// the old name. A follower is removed, its data directory wiped, and it is
// added again under the same name (so the same raft id) and started empty.
// It must become a voter whose proposals commit, like a member added under a
// new name.
func TestMemberAddedAgainUnderItsNameCommits(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	for i := range 5 {
		c.mustPropose(leader, fmt.Sprintf("p%d", i))
	}
	var victim string
	for _, id := range []string{"c1", "c2", "c3"} {
		if id != leader {
			victim = id
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.node(leader).RemoveMember(ctx, victim); err != nil {
		t.Fatalf("remove %s: %v", victim, err)
	}
	select {
	case <-c.node(victim).Done():
	case <-time.After(testDeadline):
		t.Fatalf("removed %s did not stop", victim)
	}
	c.stop(victim)
	if err := os.RemoveAll(c.member(victim).dir); err != nil {
		t.Fatal(err)
	}
	c.mustPropose(leader, "between")
	if err := c.node(leader).AddMember(ctx, &waldenv1.MemberContext{Id: victim, RaftAddr: "mem://" + victim, AdminAddr: "admin://" + victim}); err != nil {
		t.Fatalf("add %s again: %v", victim, err)
	}
	c.mu.Lock()
	c.joining = map[string]bool{victim: true}
	c.mu.Unlock()
	c.start(victim)
	testutil.EventuallyTrue(t, testDeadline, victim+" promoted to voter", func() bool {
		voter, learner := c.node(leader).Role(raftnode.RaftID(victim))
		return voter && !learner
	})
	for i := range 3 {
		if _, err := c.propose(victim, fmt.Sprintf("via-%s-%d", victim, i)); err != nil {
			t.Fatalf("proposal %d through %s, added again under its name: %v", i, victim, err)
		}
	}
	// Membership changes through it are forwarded too.
	if err := c.node(victim).AddMember(ctx, &waldenv1.MemberContext{Id: "c4", RaftAddr: "mem://c4"}); err != nil {
		t.Fatalf("add c4 through %s: %v", victim, err)
	}
	if err := c.node(victim).RemoveMember(ctx, "c4"); err != nil {
		t.Fatalf("remove c4 through %s: %v", victim, err)
	}
	c.converged("c1", "c2", "c3")
}
