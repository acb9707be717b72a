package raftnode_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"walden/raftnode"
)

// counter reads a counter of reg by name (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// Concurrent linearizable reads share ReadIndex rounds, and every one of
// them still sees what was committed before it was called.
func TestConcurrentLinearizableReadsShareRounds(t *testing.T) {
	regs := map[string]*prometheus.Registry{}
	var mu sync.Mutex
	c := newTestCluster(t, func(cfg *raftnode.Config) {
		mu.Lock()
		defer mu.Unlock()
		regs[cfg.NodeID] = prometheus.NewRegistry()
		cfg.Registerer = regs[cfg.NodeID]
	}, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	var follower string
	for _, id := range c.ids() {
		if id != leader {
			follower = id
			break
		}
	}
	// Slow the leader's messages to the follower: a round takes a while,
	// and the reads called meanwhile must wait for the next round.
	c.net.Delay(leader, follower, 20*time.Millisecond, 0)
	n := c.node(follower)
	reg := regs[follower]
	rounds0, reads0 := counter(t, reg, "walden_raft_read_index_rounds_total"), counter(t, reg, "walden_raft_linearizable_reads_total")

	const readers = 100
	written := c.mustPropose(leader, "before-the-reads").GetIndex()
	start := make(chan struct{})
	errs := make(chan error, readers)
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := n.LinearizableRead(ctx); err != nil {
				errs <- err
				return
			}
			if got := n.Status().AppliedIndex; got < written {
				t.Errorf("after a linearizable read %s applied %d < %d, committed before the read", follower, got, written)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("linearizable read: %v", err)
	}
	rounds := counter(t, reg, "walden_raft_read_index_rounds_total") - rounds0
	reads := counter(t, reg, "walden_raft_linearizable_reads_total") - reads0
	t.Logf("%d concurrent reads served by %.0f ReadIndex rounds", readers, rounds)
	if reads != readers {
		t.Fatalf("reads served %.0f, want %d", reads, readers)
	}
	if rounds < 1 || rounds > readers/4 {
		t.Fatalf("%d concurrent reads took %.0f ReadIndex rounds: they are not shared", readers, rounds)
	}

	// A write after the rounds, then one read: it gets a round of its own
	// and sees the write.
	written = c.mustPropose(leader, "after-the-reads").GetIndex()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.LinearizableRead(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.Status().AppliedIndex; got < written {
		t.Fatalf("applied %d < %d after the read", got, written)
	}
}

// A read whose caller gives up does not hold the reads after it: a round
// nobody waits for is abandoned, and the next callers get a round of their
// own.
func TestAbandonedLinearizableReadFreesTheNext(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	var follower string
	for _, id := range c.ids() {
		if id != leader {
			follower = id
			break
		}
	}
	n := c.node(follower)
	// The follower's read requests cannot reach the leader: a read waits
	// until its caller gives up.
	c.net.Drop(follower, leader, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := n.LinearizableRead(ctx)
	cancel()
	if err == nil {
		t.Fatal("a read answered without reaching the leader")
	}
	c.net.Heal()
	written := c.mustPropose(leader, "after-heal").GetIndex()
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.LinearizableRead(ctx); err != nil {
		t.Fatalf("read after the abandoned one: %v", err)
	}
	if got := n.Status().AppliedIndex; got < written {
		t.Fatalf("applied %d < %d after the read", got, written)
	}
}
