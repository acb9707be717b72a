package raftnode_test

import (
	"fmt"
	"sync"
	"testing"
)

// TestClusterConcurrentProposalsAreBatchedAndAnswered proposes from many
// goroutines at once, mostly on the leader (where proposals are stepped into
// raft in batches) and some through followers: every proposer gets the
// result of its own entry, and every member applies every payload once, in
// the same order.
func TestClusterConcurrentProposalsAreBatchedAndAnswered(t *testing.T) {
	c := newTestCluster(t, nil, "c1", "c2", "c3")
	leader := c.leaderAmong("c1", "c2", "c3")
	const proposers, each = 32, 8
	var (
		mu      sync.Mutex
		counts  = make(map[uint64]string) // Noop count in the result -> payload
		indexes = make(map[uint64]bool)
		wg      sync.WaitGroup
	)
	for p := range proposers {
		via := leader
		if p%8 == 7 {
			for _, id := range c.ids() {
				if id != leader {
					via = id // forwarded one by one
				}
			}
		}
		wg.Go(func() {
			for i := range each {
				payload := fmt.Sprintf("p%d-%d", p, i)
				res, err := c.propose(via, payload)
				if err != nil {
					t.Errorf("propose %s via %s: %v", payload, via, err)
					return
				}
				mu.Lock()
				if other, dup := counts[res.GetNoop().GetCount()]; dup {
					t.Errorf("%s and %s got the same result count %d", payload, other, res.GetNoop().GetCount())
				}
				counts[res.GetNoop().GetCount()] = payload
				if indexes[res.GetIndex()] {
					t.Errorf("%s got index %d twice", payload, res.GetIndex())
				}
				indexes[res.GetIndex()] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(counts) != proposers*each {
		t.Fatalf("%d distinct results, want %d", len(counts), proposers*each)
	}
	c.converged("c1", "c2", "c3")
	byCount := make([]string, 0, len(counts))
	for i := 1; i <= len(counts); i++ {
		byCount = append(byCount, counts[uint64(i)])
	}
	for _, id := range c.ids() {
		got := payloads(c.member(id).sm.commands())
		if len(got) != len(byCount) {
			t.Fatalf("%s applied %d commands, want %d", id, len(got), len(byCount))
		}
		for i := range got {
			// The Noop count is the position in the applied order, so each
			// proposer was answered with the result of its own entry.
			if got[i] != byCount[i] {
				t.Fatalf("%s applied %q as command %d, its proposer was answered for %q", id, got[i], i+1, byCount[i])
			}
		}
	}
}
