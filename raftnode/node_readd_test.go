package raftnode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
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
	// Each membership change has a deadline of its own: on a loaded machine
	// the waits between them (the removal taking effect, the promotion) may
	// take longer than one change should.
	op := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		t.Cleanup(cancel)
		return ctx
	}
	if err := c.node(leader).RemoveMember(op(), victim); err != nil {
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
	if err := c.node(leader).AddMember(op(), &waldenv1.MemberContext{Id: victim, RaftAddr: "mem://" + victim, AdminAddr: "admin://" + victim}); err != nil {
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
	if err := c.node(victim).AddMember(op(), &waldenv1.MemberContext{Id: "c4", RaftAddr: "mem://c4"}); err != nil {
		t.Fatalf("add c4 through %s: %v", victim, err)
	}
	// The addition returned once the proposer applied it. The leader may
	// apply it later, and until it has told raft so (Advance), raft drops
	// the next membership change forwarded to it (one change at a time),
	// which its proposer would wait out to its deadline (forwardProposal).
	// Servers make every change on the leader, which returns once it
	// applied it.
	testutil.EventuallyTrue(t, testDeadline, "the leader to apply c4's addition", func() bool {
		l := c.node(leader)
		voter, learner := l.Role(raftnode.RaftID("c4"))
		return (voter || learner) && l.RaftApplied() >= l.Status().AppliedIndex
	})
	// A forwarded proposal may still be lost (a leader change on a loaded
	// machine): the removal is asked again once, and an earlier attempt
	// that committed late makes c4 unknown to the second.
	err := c.node(victim).RemoveMember(op(), "c4")
	if errors.Is(err, context.DeadlineExceeded) {
		t.Logf("remove c4 through %s: %v; asking again", victim, err)
		if err = c.node(victim).RemoveMember(op(), "c4"); errors.Is(err, raftnode.ErrUnknownMember) {
			err = nil
		}
	}
	if err != nil {
		t.Fatalf("remove c4 through %s: %v", victim, err)
	}
	c.converged("c1", "c2", "c3")
}

// TestVoterChangesAreSpaced (issue 21, finding 3): with VoterChangeWait,
// the leader refuses a second voter change inside the wait with the time
// left, promotes a learner only once the wait has passed since the
// previous voter change, and membership changes are made on the leader.
func TestVoterChangesAreSpaced(t *testing.T) {
	const wait = 1500 * time.Millisecond
	c := newTestCluster(t, func(cfg *raftnode.Config) {
		cfg.VoterChangeWait = func() time.Duration { return wait }
	}, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	c.mustPropose(leader, "before")
	var victim, follower string
	for _, id := range []string{"c1", "c2", "c3"} {
		switch {
		case id == leader:
		case victim == "":
			victim = id
		default:
			follower = id
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.node(follower).RemoveMember(ctx, victim); !errors.Is(err, raftnode.ErrNotLeader) {
		t.Fatalf("removal on a follower: %v, want ErrNotLeader", err)
	}
	// The leader started less than the wait ago: it does not know when the
	// last voter change was, so it waits from its start.
	testutil.EventuallyTrue(t, testDeadline, "the wait after the start to pass", func() bool {
		left, _ := c.node(leader).VoterChangeIn()
		return left == 0
	})
	if err := c.node(leader).RemoveMember(ctx, victim); err != nil {
		t.Fatalf("remove %s: %v", victim, err)
	}
	removedAt := time.Now()
	c.stop(victim)
	if err := os.RemoveAll(c.member(victim).dir); err != nil {
		t.Fatal(err)
	}
	// A second voter change inside the wait: refused, with the time left.
	err := c.node(leader).RemoveMember(ctx, follower)
	var soon *raftnode.VoterChangeTooSoonError
	if !errors.As(err, &soon) || soon.Left <= 0 || soon.Left > wait || soon.Wait != wait {
		t.Fatalf("second voter change inside the wait: %v", err)
	}
	if !strings.Contains(err.Error(), "try again in") {
		t.Fatalf("the refusal does not say when to try again: %v", err)
	}
	if voter, _ := c.node(leader).Role(raftnode.RaftID(follower)); !voter {
		t.Fatalf("%s was removed although refused", follower)
	}
	// Adding a learner changes no voter: allowed at once. Its promotion
	// waits for the rest of the wait.
	if err := c.node(leader).AddMember(ctx, &waldenv1.MemberContext{Id: victim, RaftAddr: "mem://" + victim}); err != nil {
		t.Fatalf("add %s as a learner: %v", victim, err)
	}
	c.mu.Lock()
	c.joining = map[string]bool{victim: true}
	c.mu.Unlock()
	c.start(victim)
	testutil.EventuallyTrue(t, testDeadline, victim+" promoted to voter", func() bool {
		voter, _ := c.node(leader).Role(raftnode.RaftID(victim))
		return voter
	})
	if since := time.Since(removedAt); since < wait {
		t.Fatalf("%s promoted %s after the removal, inside the wait of %s", victim, since, wait)
	}
	if _, err := c.propose(victim, "through the replacement"); err != nil {
		t.Fatalf("proposal through %s: %v", victim, err)
	}
}
