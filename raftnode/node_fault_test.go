package raftnode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// waitStopped waits until member id stopped on its own and returns the
// fault it reports.
func (c *testCluster) waitStopped(id string) error {
	c.t.Helper()
	n := c.node(id)
	select {
	case <-n.Done():
	case <-time.After(testDeadline):
		c.t.Fatalf("%s did not stop", id)
	}
	return n.Err()
}

// TestUndecodableEntryStopsTheMember: a committed entry whose command does
// not decode stops the member that applies it, before it applies anything
// after it, with a message that names the entry's index and the member's
// data dir. (The leader applies it first; a follower stops too once it
// learns the entry is committed, which needs a leader: with the leader
// stopped, the two followers elect one and stop in turn, or one of them
// has stopped already and the other waits. None applies anything else.)
func TestUndecodableEntryStopsTheMember(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	c.mustPropose(leader, "before")
	c.converged("c1", "c2", "c3")
	// Bytes that are not a Command, proposed below the node's encoding (as
	// a damaged log would hand them to the apply path).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	index := c.node(leader).Status().CommitIndex + 1
	if err := c.node(leader).RaftProposeForTest(ctx, []byte{0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	err := c.waitStopped(leader)
	if !errors.Is(err, raftnode.ErrCorruptEntry) {
		t.Fatalf("%s stopped with %v, want ErrCorruptEntry", leader, err)
	}
	for _, want := range []string{fmt.Sprintf("raft entry %d ", index), c.member(leader).dir, "member remove " + leader} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not name %q", err, want)
		}
	}
	for _, id := range []string{"c1", "c2", "c3"} {
		if got := c.member(id).sm.AppliedIndex(); got >= index {
			t.Errorf("%s applied index %d, at or beyond the undecodable entry %d", id, got, index)
		}
		if err := c.node(id).Err(); err != nil && !errors.Is(err, raftnode.ErrCorruptEntry) {
			t.Errorf("%s stopped with %v", id, err)
		}
	}
}

// copyDir copies the data directory src (files and the raft log's
// subdirectory) to a new directory dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	copyTree(t, src, dst)
}

// replaceDir makes dir hold exactly what from holds (nothing when from is
// "").
func replaceDir(t *testing.T, dir, from string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if from != "" {
		copyDir(t, from, dir)
	}
}

// TestLogWentBackwardsIsRefused restarts a follower on an older copy of its
// data dir, then on a wiped one: each time the leader's heartbeat says the
// follower acknowledged entries its log no longer holds, and the follower
// stops with ErrLogWentBackwards and the way back (raft itself panics on
// it). The other two go on; the documented way back (remove, empty dir,
// add) brings the member back.
func TestLogWentBackwardsIsRefused(t *testing.T) {
	// The leader must keep what the follower acknowledged: a slow election
	// timeout (1 s) keeps a loaded machine from changing leaders meanwhile.
	c := newTestCluster(t, func(cfg *raftnode.Config) { cfg.ElectionTicks = 100 }, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	follower := "c3"
	if leader == follower {
		follower = "c2"
	}
	for _, p := range []string{"a", "b", "c"} {
		c.mustPropose(leader, p)
	}
	c.converged("c1", "c2", "c3")
	c.stop(follower)
	older := filepath.Join(t.TempDir(), "older")
	copyDir(t, c.member(follower).dir, older)
	c.start(follower)
	for _, p := range []string{"d", "e", "f", "g"} {
		c.mustPropose(leader, p)
	}
	c.converged("c1", "c2", "c3")

	for _, tc := range []struct{ name, from string }{{"older copy", older}, {"wiped", ""}} {
		c.stop(follower)
		replaceDir(t, c.member(follower).dir, tc.from)
		c.start(follower)
		err := c.waitStopped(follower)
		if !errors.Is(err, raftnode.ErrLogWentBackwards) {
			t.Fatalf("%s: %s stopped with %v, want ErrLogWentBackwards", tc.name, follower, err)
		}
		for _, want := range []string{c.member(follower).dir, "member remove " + follower, "member add " + follower} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: message %q does not name %q", tc.name, err, want)
			}
		}
		c.mustPropose(leader, "still deciding after "+tc.name)
	}
	c.stop(follower)

	// The way back: remove the member, empty its dir, add it, start it as a
	// joining member.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.node(leader).RemoveMember(ctx, follower); err != nil {
		t.Fatalf("remove %s: %v", follower, err)
	}
	replaceDir(t, c.member(follower).dir, "")
	if err := c.node(leader).AddMember(ctx, &waldenv1.MemberContext{Id: follower, RaftAddr: "mem://" + follower, AdminAddr: "admin://" + follower}); err != nil {
		t.Fatalf("add %s: %v", follower, err)
	}
	c.mu.Lock()
	c.joining = map[string]bool{follower: true}
	c.mu.Unlock()
	c.start(follower)
	c.mustPropose(leader, "back")
	c.converged("c1", "c2", "c3")
	if err := c.node(follower).Err(); err != nil {
		t.Fatalf("%s after the way back: %v", follower, err)
	}
}
