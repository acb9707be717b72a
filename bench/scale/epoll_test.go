//go:build linux

package main

import (
	"context"
	"encoding/json"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"walden/internal/testutil"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
)

// grantBy is coordinator id's grant of a lease of ttl for renewal seq,
// with the voters of configuration conf (none: the connection's last).
func grantBy(id string, ttl time.Duration, seq, conf uint64, voters ...string) *waldenv1.RenewLeasesResponse {
	g := &waldenv1.RenewLeaseResponse{CoordinatorId: id, LeaseTtlMs: ttl.Milliseconds(), ConfIndex: conf}
	for _, v := range voters {
		g.Voters = append(g.Voters, &waldenv1.Voter{Id: v})
	}
	return &waldenv1.RenewLeasesResponse{Seq: seq, Grant: g}
}

// TestRenewLoop renews one agent with three coordinators of frames through
// the epoll loop, as package agent's Renewer does on the wire: the lease
// becomes valid on a majority of grants, the voters an answer leaves out
// are the connection's last (a late answer's included), an unanswered
// attempt fails and the next opens a new connection, a refusal for good
// ends the registration and its connections, and a registration given up
// (the agent killed) closes its connections at once. The lease is 3 s, so
// that an attempt has 500 ms for its answer and no answer of a loaded
// machine is taken for a lost one.
func TestRenewLoop(t *testing.T) {
	const ttl = 3 * time.Second
	var fence atomic.Bool
	var epochs [3]atomic.Uint64
	answer := func(i int, id string) func(int, *waldenv1.RenewLeasesRequest) []*waldenv1.RenewLeasesResponse {
		return func(conn int, m *waldenv1.RenewLeasesRequest) []*waldenv1.RenewLeasesResponse {
			if m.GetBrokerId() != "b1" {
				t.Errorf("renewal %+v, want broker b1", m)
			}
			epochs[i].Store(m.GetEpoch())
			switch {
			case id == "c1" && conn == 1 && m.GetSeq() == 2: // a late answer with new voters first, then this one without them
				return []*waldenv1.RenewLeasesResponse{grantBy(id, ttl, 1, 6, "c1", "c2", "c3", "c4"), grantBy(id, ttl, 2, 6)}
			case id == "c1" && conn == 1 && m.GetSeq() > 2:
				return []*waldenv1.RenewLeasesResponse{grantBy(id, ttl, m.GetSeq(), 6)}
			case id == "c3" && conn == 1 && m.GetSeq() == 2:
				return nil // no answer: the attempt times out
			case id == "c2" && fence.Load() && m.GetEpoch() == 7:
				return []*waldenv1.RenewLeasesResponse{{Seq: m.GetSeq(), Refusal: &waldenv1.RenewalRefusal{
					Code: uint32(codes.FailedPrecondition), Message: "fenced", Reason: "NODE_FENCED"}}}
			}
			return []*waldenv1.RenewLeasesResponse{grantBy(id, ttl, m.GetSeq(), 5, "c1", "c2", "c3")}
		}
	}
	var coords []*frameCoordinator
	p := &loadProc{out: json.NewEncoder(io.Discard), agents: map[string]*simAgent{}, refused: map[string]uint64{}}
	for i, id := range []string{"c1", "c2", "c3"} {
		c := newFrameCoordinator(t, answer(i, id))
		coords = append(coords, c)
		p.cfg.Coordinators = append(p.cfg.Coordinators, c.ln.Addr().String())
	}
	p.granted = make([]atomic.Uint64, 3)
	l, err := newRenewLoop(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go l.run()

	a := &simAgent{p: p, b: simBroker{ID: "b1", IP: "127.0.0.1"}, holder: lease.NewHolder(0)}
	register := func(epoch uint64) {
		a.mu.Lock()
		a.epoch, a.registered, a.wasValid = epoch, true, false
		a.holder.SetEpoch(epoch)
		a.mu.Unlock()
	}
	register(7)
	refused := make(chan bool, 1)
	go func() { refused <- l.renew(context.Background(), a, 7, ttl) }()

	testutil.EventuallyTrue(t, 20*time.Second, "a valid lease on the configuration of the late answer, a failed attempt and c3's second connection", func() bool {
		a.mu.Lock()
		v := a.holder.Voters()
		a.mu.Unlock()
		ok, _ := a.valid()
		return ok && v.Index == 6 && len(v.IDs) == 4 && p.failed.Load() >= 1 && len(coords[2].conns) == 2 &&
			p.granted[0].Load() >= 3 && p.granted[1].Load() >= 3 && p.granted[2].Load() >= 3
	})
	if got := len(coords[0].conns) + len(coords[1].conns); got != 2 {
		t.Fatalf("%d connections to c1 and c2; want one each (only c3's unanswered attempt opens another)", got)
	}
	if p.lapses.Load() != 0 {
		t.Fatalf("%d lapses while every coordinator granted", p.lapses.Load())
	}

	fence.Store(true)
	select {
	case ok := <-refused:
		if !ok {
			t.Fatal("renew ended without the refusal")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("NODE_FENCED did not end the registration")
	}
	if ok, _ := a.valid(); ok {
		t.Fatal("the lease is still valid after NODE_FENCED")
	}
	if got := p.refused["NODE_FENCED"]; got != 1 {
		t.Fatalf("NODE_FENCED counted %d times, want 1", got)
	}
	testutil.EventuallyTrue(t, 20*time.Second, "every connection of the fenced epoch ended", func() bool {
		return len(coords[0].ended) == 1 && len(coords[1].ended) == 1 && len(coords[2].ended) == 2
	})

	// A new epoch renews again, over new connections; the agent killed
	// closes them.
	register(8)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { refused <- l.renew(ctx, a, 8, ttl) }()
	testutil.EventuallyTrue(t, 20*time.Second, "grants of epoch 8 from every coordinator", func() bool {
		ok, _ := a.valid()
		return ok && epochs[0].Load() == 8 && epochs[1].Load() == 8 && epochs[2].Load() == 8
	})
	cancel()
	if ok := <-refused; ok {
		t.Fatal("renew reported a refusal when its context ended")
	}
	testutil.EventuallyTrue(t, 20*time.Second, "the connections of epoch 8 ended", func() bool {
		return len(coords[0].ended) == 2 && len(coords[1].ended) == 2 && len(coords[2].ended) == 3
	})
}

// lapseTTL is TestRenewLoopCountsTheLapseAGrantEnds's lease.
const lapseTTL = 600 * time.Millisecond

// TestRenewLoopCountsTheLapseAGrantEnds: a lease that ended before the
// grant that renews it arrived lapsed, though no attempt failed in between.
// With a margin of 450 ms of a 600 ms lease, each lease ends 150 ms after
// its renewal was sent, and the next renewal goes 200 ms after it: a grant
// that arrives within 150 ms makes the lease valid, and the next grant ends
// its lapse. Counted on the grants answered within 100 ms (the latency
// histogram), which a loaded machine may make fewer but not wrong.
func TestRenewLoopCountsTheLapseAGrantEnds(t *testing.T) {
	c := newFrameCoordinator(t, func(_ int, m *waldenv1.RenewLeasesRequest) []*waldenv1.RenewLeasesResponse {
		return []*waldenv1.RenewLeasesResponse{grantBy("c1", lapseTTL, m.GetSeq(), 5, "c1")}
	})
	p := &loadProc{out: json.NewEncoder(io.Discard), agents: map[string]*simAgent{}, refused: map[string]uint64{},
		cfg: loadConfig{Coordinators: []string{c.ln.Addr().String()}}, granted: make([]atomic.Uint64, 1)}
	l, err := newRenewLoop(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go l.run()
	a := &simAgent{p: p, b: simBroker{ID: "b1", IP: "127.0.0.1"}, holder: lease.NewHolder(450 * time.Millisecond),
		epoch: 7, registered: true}
	a.holder.SetEpoch(7)
	// fast counts the grants answered within 100 ms (latencyBuckets[6]).
	fast := func() uint64 {
		var n uint64
		for i := range 7 {
			n += p.latency[i].Load()
		}
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- l.renew(ctx, a, 7, lapseTTL) }()
	testutil.EventuallyTrue(t, 20*time.Second, "three grants within 100 ms", func() bool { return fast() >= 3 })
	cancel()
	<-done // the loop has let the registration go: the counts are final
	if got, n := p.lapses.Load(), fast(); got < n-1 {
		t.Fatalf("%d lapses counted over %d grants answered within 100 ms; want one for each but the last", got, n)
	}
}
