package detect

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// fakeState is a broker registry that applies ObserveBroker and
// DeclareFailed like the state machine does (for these tests).
type fakeState struct {
	mu       sync.Mutex
	brokers  map[string]*waldenv1.Broker
	proposed []*waldenv1.Command
	jobs     int
	fail     error // next proposal fails with it
}

func (s *fakeState) Brokers() []*waldenv1.Broker {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*waldenv1.Broker
	for _, b := range s.brokers {
		out = append(out, proto.Clone(b).(*waldenv1.Broker))
	}
	return out
}

func (s *fakeState) ActiveJobs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobs
}

func (s *fakeState) propose(_ context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proposed = append(s.proposed, cmd)
	if err := s.fail; err != nil {
		s.fail = nil
		return nil, err
	}
	switch op := cmd.GetOp().(type) {
	case *waldenv1.Command_ObserveBroker:
		b := s.brokers[op.ObserveBroker.GetBrokerId()]
		var kept []*waldenv1.Observation
		for _, o := range b.GetObservations() {
			if o.GetObserverId() != op.ObserveBroker.GetObserverId() {
				kept = append(kept, o)
			}
		}
		b.Observations = append(kept, &waldenv1.Observation{ObserverId: op.ObserveBroker.GetObserverId(), State: op.ObserveBroker.GetState(), Reason: op.ObserveBroker.GetReason()})
	case *waldenv1.Command_DeclareFailed:
		b := s.brokers[op.DeclareFailed.GetBrokerId()]
		if b.GetFenced() || b.GetEpoch() != op.DeclareFailed.GetEpoch() {
			return nil, errors.New("EPOCH_EXPIRED")
		}
		b.Epoch++
		b.Fenced, b.State = true, StateFailed
		s.jobs++
		return &waldenv1.Result{Value: &waldenv1.Result_DeclareFailed{DeclareFailed: &waldenv1.DeclareFailedResult{NewEpoch: b.Epoch}}}, nil
	}
	return &waldenv1.Result{}, nil
}

func (s *fakeState) observeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.proposed {
		if c.GetObserveBroker() != nil {
			n++
		}
	}
	return n
}

type switchProber struct {
	mu   sync.Mutex
	down bool
}

func (p *switchProber) set(down bool) { p.mu.Lock(); p.down = down; p.mu.Unlock() }

func (p *switchProber) Probe(context.Context, string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return ErrProbe
	}
	return nil
}

func TestObserverProposesOnlyChanges(t *testing.T) {
	st := &fakeState{brokers: map[string]*waldenv1.Broker{"b1": {BrokerId: "b1", Epoch: 1, AgentAddr: "127.0.0.1:1"}}}
	pr := &switchProber{}
	o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: time.Second, SuspectAfter: 3}, st, st.propose, pr)
	ctx := context.Background()
	state := func() string { return committedState(st.Brokers()[0], "c1") }

	o.Round(ctx)
	if state() != StateAlive || st.observeCount() != 1 {
		t.Fatalf("first round: %q, %d proposals", state(), st.observeCount())
	}
	o.Round(ctx)
	if st.observeCount() != 1 {
		t.Fatal("an unchanged view was proposed again")
	}
	pr.set(true)
	o.Round(ctx)
	o.Round(ctx)
	if state() != StateAlive {
		t.Fatal("suspect before SuspectAfter failures")
	}
	o.Round(ctx)
	if state() != StateSuspect || st.observeCount() != 2 {
		t.Fatalf("after 3 failures: %q, %d proposals", state(), st.observeCount())
	}
	// A lost proposal is repaired at the next round.
	pr.set(false)
	st.mu.Lock()
	st.fail = errors.New("proposal dropped")
	st.mu.Unlock()
	o.Round(ctx)
	if state() != StateSuspect {
		t.Fatal("failed proposal applied")
	}
	o.Round(ctx)
	if state() != StateAlive {
		t.Fatalf("not repaired: %q", state())
	}
	// Gossip's dead verdict counts until a probe answers after it.
	o.SetGossip("agent/b1", GossipDead)
	pr.set(true)
	o.Round(ctx)
	if state() != StateDead {
		t.Fatalf("gossip dead: %q", state())
	}
	pr.set(false)
	o.Round(ctx)
	if state() != StateAlive {
		t.Fatalf("probe after gossip dead: %q", state())
	}
	// A reset by re-registration (observations cleared) is repaired.
	st.mu.Lock()
	st.brokers["b1"].Observations = nil
	st.brokers["b1"].Epoch = 2
	st.mu.Unlock()
	o.Round(ctx)
	if state() != StateAlive {
		t.Fatalf("after re-registration: %q", state())
	}
	// Fenced brokers are not observed.
	st.mu.Lock()
	st.brokers["b1"].Fenced = true
	n := len(st.proposed)
	st.mu.Unlock()
	pr.set(true)
	for range 4 {
		o.Round(ctx)
	}
	if len(st.proposed) != n {
		t.Fatal("a fenced broker was observed")
	}
}

type fakeCluster struct {
	mu     sync.Mutex
	leader bool
	term   uint64
}

func (c *fakeCluster) Leadership() (bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader, c.term
}
func (c *fakeCluster) Voters() []string      { return []string{"c1", "c2", "c3"} }
func (c *fakeCluster) LiveMembers() []string { return []string{"c1", "c2", "c3"} }

// TestDeciderLoop drives the loop with a fake clock: the decision comes only
// after failure_timeout from when the leader saw the quorum, a leader change
// restarts the clock, and a decision is proposed once.
func TestDeciderLoop(t *testing.T) {
	st := &fakeState{brokers: map[string]*waldenv1.Broker{"b1": {BrokerId: "b1", Epoch: 1, State: StateSuspect,
		Observations: []*waldenv1.Observation{{ObserverId: "c2", State: StateSuspect}, {ObserverId: "c3", State: StateDead}}}}}
	var mu sync.Mutex
	now := time.Unix(5_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cl := &fakeCluster{leader: true, term: 3}
	p := &waldenv1.Policy{FailureTimeoutMs: 1500, LeaseTtlMs: 600, DriftMarginMs: 200, MaxConcurrentRecoveries: 4, MaxFailedFraction: 0.5, CooldownMs: 60000}
	leases := NewLeaseTable(clock())
	d := NewDecider(DeciderConfig{NodeID: "c1", Now: clock}, cl, st, func() *waldenv1.Policy { return p }, leases, st.propose)
	ctx := context.Background()
	declared := func() int {
		st.mu.Lock()
		defer st.mu.Unlock()
		n := 0
		for _, c := range st.proposed {
			if c.GetDeclareFailed() != nil {
				n++
			}
		}
		return n
	}
	d.Tick(ctx)
	advance(1400 * time.Millisecond)
	d.Tick(ctx)
	// Leadership lost and regained: the clock starts again.
	cl.mu.Lock()
	cl.leader = false
	cl.mu.Unlock()
	d.Tick(ctx)
	if d.Leading() {
		t.Fatal("leading without leadership")
	}
	cl.mu.Lock()
	cl.leader, cl.term = true, 5
	cl.mu.Unlock()
	advance(100 * time.Millisecond)
	d.Tick(ctx)
	advance(1400 * time.Millisecond)
	d.Tick(ctx)
	if declared() != 0 {
		t.Fatal("decided before a full failure_timeout under the new leader")
	}
	advance(100 * time.Millisecond)
	d.Tick(ctx)
	if declared() != 1 {
		t.Fatalf("declared %d times", declared())
	}
	for range 5 {
		advance(time.Second)
		d.Tick(ctx)
	}
	if declared() != 1 || st.Brokers()[0].GetEpoch() != 2 {
		t.Fatalf("declared %d times, epoch %d", declared(), st.Brokers()[0].GetEpoch())
	}
}

func TestObserverAndDeciderRunConcurrently(t *testing.T) {
	st := &fakeState{brokers: map[string]*waldenv1.Broker{"b1": {BrokerId: "b1", Epoch: 1, AgentAddr: "127.0.0.1:1"}}}
	o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: 5 * time.Millisecond}, st, st.propose, &switchProber{})
	d := NewDecider(DeciderConfig{NodeID: "c1", Interval: 5 * time.Millisecond}, &fakeCluster{leader: true, term: 1}, st,
		func() *waldenv1.Policy { return &waldenv1.Policy{FailureTimeoutMs: 1000, LeaseTtlMs: 300} }, NewLeaseTable(time.Now()), st.propose)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan struct{}, 3)
	go func() { o.Run(ctx); done <- struct{}{} }()
	go func() { d.Run(ctx); done <- struct{}{} }()
	go func() {
		for ctx.Err() == nil {
			o.SetGossip("agent/b1", GossipAlive)
		}
		done <- struct{}{}
	}()
	for range 3 {
		<-done
	}
	if committedState(st.Brokers()[0], "c1") != StateAlive {
		t.Fatal("observer did not observe")
	}
}
