package detect

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"walden/lease"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// TestHTTPProberKeepsOneConnectionPerAgent probes 150 agents (more than
// the 100 idle connections net/http's default client keeps in all) three
// times each: every agent sees one connection, not one per probe.
func TestHTTPProberKeepsOneConnectionPerAgent(t *testing.T) {
	const agents, rounds = 150, 3
	var conns atomic.Int64
	var servers []*httptest.Server
	for range agents {
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }))
		s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		}
		s.Start()
		defer s.Close()
		servers = append(servers, s)
	}
	p := NewHTTPProber(time.Second)
	for range rounds {
		for _, s := range servers {
			if err := p.Probe(context.Background(), s.Listener.Addr().String()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := conns.Load(); n != agents {
		t.Fatalf("%d connections for %d probes of %d agents, want one per agent", n, agents*rounds, agents)
	}
}

// blockingProber holds every probe until released and records how many
// were in flight at once.
type blockingProber struct {
	mu        sync.Mutex
	inFlight  int
	most      int
	probed    map[string]int
	release   chan struct{}
	reachedAt chan struct{} // closed once want probes are in flight
	reached   sync.Once
	want      int
}

func (p *blockingProber) Probe(ctx context.Context, addr string) error {
	p.mu.Lock()
	p.inFlight++
	p.most = max(p.most, p.inFlight)
	p.probed[addr]++
	if p.inFlight == p.want {
		p.reached.Do(func() { close(p.reachedAt) })
	}
	p.mu.Unlock()
	select {
	case <-p.release:
	case <-ctx.Done():
	}
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
	return nil
}

// TestObserverBoundsProbesInFlight runs a round over 100 brokers whose
// probes hang: never more than ProbeConcurrency are in flight, and every
// broker is probed once.
func TestObserverBoundsProbesInFlight(t *testing.T) {
	st := newClusterState(t, policy.Defaults())
	for i := range 100 {
		st.must(t, &waldenv1.Command{Op: &waldenv1.Command_RegisterBroker{RegisterBroker: &waldenv1.RegisterBroker{
			BrokerId: fmt.Sprintf("b%03d", i), AgentAddr: fmt.Sprintf("127.0.0.1:%d", 1000+i)}}})
	}
	pr := &blockingProber{probed: map[string]int{}, release: make(chan struct{}), reachedAt: make(chan struct{}), want: 8}
	o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: time.Second, ProbeTimeout: 900 * time.Millisecond, ProbeConcurrency: 8}, st, st.propose, pr)
	done := make(chan struct{})
	go func() { o.Round(context.Background()); close(done) }()
	select {
	case <-pr.reachedAt:
	case <-time.After(10 * time.Second):
		t.Fatal("the probes never reached the bound")
	}
	close(pr.release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("round did not end")
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.most != 8 {
		t.Fatalf("%d probes in flight at most, want the bound 8", pr.most)
	}
	if len(pr.probed) != 100 {
		t.Fatalf("%d brokers probed, want 100", len(pr.probed))
	}
	for addr, n := range pr.probed {
		if n != 1 {
			t.Fatalf("%s probed %d times in one round", addr, n)
		}
	}
}

// countingProber fails every probe and counts them by address.
type countingProber struct {
	mu     sync.Mutex
	probed map[string]int
}

func (p *countingProber) Probe(_ context.Context, addr string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probed[addr]++
	return ErrProbe
}

func (p *countingProber) count(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.probed[addr]
}

// TestObserverSkipsProbeOfRenewingBroker: a broker that renewed with this
// coordinator within the interval is not probed, and the probes that
// failed before the renewal do not count towards suspicion; once the
// renewals stop it is probed again and suspected after SuspectAfter
// failures.
func TestObserverSkipsProbeOfRenewingBroker(t *testing.T) {
	st := newClusterState(t, policy.Defaults())
	epoch := st.register(t, "b1")
	clk := &lease.ManualClock{T: time.Hour}
	g, err := lease.NewGrantor(clk, &lease.MemStore{}, 3*time.Second, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	pr := &countingProber{probed: map[string]int{}}
	o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: time.Second, SuspectAfter: 3, Grantor: g, Clock: clk}, st, st.propose, pr)
	ctx := context.Background()
	state := func() waldenv1.ObservationState { return mine(st.broker("b1"), "c1").GetObservationState() }
	round := func() { clk.Advance(time.Second); o.Round(ctx) }
	renew := func() { _ = g.Grant(lease.Key{Broker: "b1", Epoch: epoch}, 3*time.Second, 500*time.Millisecond) }

	round()
	round() // two failed probes, no renewal: not suspected yet
	if n := pr.count("127.0.0.1:1"); n != 2 {
		t.Fatalf("%d probes, want 2", n)
	}
	for range 5 {
		clk.Advance(time.Second)
		renew() // within the round's interval
		o.Round(ctx)
	}
	if n := pr.count("127.0.0.1:1"); n != 2 {
		t.Fatalf("probed %d times while it renewed every round, want no probe after the first 2", n)
	}
	if s := state(); s == waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT {
		t.Fatalf("suspected while renewing")
	}
	// The renewals stop: it takes 3 fresh failed probes to suspect it.
	round()
	round()
	if s := state(); s == waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT {
		t.Fatalf("suspected after %d failed probes since the last renewal, want %d", pr.count("127.0.0.1:1")-2, 3)
	}
	round()
	if s := state(); s != waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT {
		t.Fatalf("state %q after 3 failed probes and no renewal for 4 s, want suspect", s.Name())
	}
}

// TestObserverSuspectsInTimeForAShortFailureTimeout: with failure_timeout
// 2s and probes every second, three failed probes would come after the
// timeout; one failed probe with no renewal for an interval is suspicion
// enough. With the default 5s it still takes three.
func TestObserverSuspectsInTimeForAShortFailureTimeout(t *testing.T) {
	for _, tc := range []struct {
		timeout time.Duration
		rounds  int
	}{{2 * time.Second, 1}, {3 * time.Second, 2}, {5 * time.Second, 3}} {
		t.Run(tc.timeout.String(), func(t *testing.T) {
			p := policy.Defaults()
			p.FailureTimeoutMs = tc.timeout.Milliseconds()
			p.LeaseTtlMs = 1000
			st := newClusterState(t, p)
			st.register(t, "b1")
			clk := &lease.ManualClock{T: time.Hour}
			pr := &countingProber{probed: map[string]int{}}
			o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: time.Second, Clock: clk}, st, st.propose, pr)
			for r := 1; r <= tc.rounds; r++ {
				if s := mine(st.broker("b1"), "c1").GetObservationState(); s == waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT {
					t.Fatalf("suspect after %d failed probes, want %d", r-1, tc.rounds)
				}
				clk.Advance(time.Second)
				o.Round(context.Background())
			}
			if s := mine(st.broker("b1"), "c1").GetObservationState(); s != waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT {
				t.Fatalf("state %q after %d failed probes, want suspect", s.Name(), tc.rounds)
			}
		})
	}
}
