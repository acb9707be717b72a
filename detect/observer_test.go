package detect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"walden/fsm"
	"walden/internal/testutil"
	"walden/lease"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// clusterState is the real state machine of a cluster of c1, c2 and c3,
// applying every proposal at the next index in the current term.
type clusterState struct {
	mu       sync.Mutex
	st       *fsm.State
	index    uint64
	term     uint64
	proposed []*waldenv1.Command
	fail     error // the next proposal fails with it
}

func newClusterState(t *testing.T, p *waldenv1.Policy) *clusterState {
	t.Helper()
	s := &clusterState{st: fsm.New("test"), term: 1}
	for i, id := range []string{"c1", "c2", "c3"} {
		s.index++
		cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(uint64(i + 1))}}}
		if err := s.st.ApplyConfChange(s.index, cc, &waldenv1.ConfChangeContext{Member: &waldenv1.MemberContext{Id: id}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if p != nil {
		s.must(t, &waldenv1.Command{Op: &waldenv1.Command_SeedPolicy{SeedPolicy: &waldenv1.SeedPolicy{Policy: p, SeededBy: "c1"}}})
	}
	return s
}

func (s *clusterState) Brokers() []*waldenv1.Broker { return s.st.Brokers() }
func (s *clusterState) ActiveJobs() int             { return s.st.ActiveJobs() }
func (s *clusterState) Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool) {
	return s.st.Policy()
}

func (s *clusterState) LeaseHorizon() (int64, bool) { return s.st.LeaseHorizon() }

func (s *clusterState) broker(id string) *waldenv1.Broker {
	b, _ := s.st.Broker(id)
	return b
}

func (s *clusterState) propose(_ context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proposed = append(s.proposed, cmd)
	if err := s.fail; err != nil {
		s.fail = nil
		return nil, err
	}
	s.index++
	if cmd.GetProposerId() == "" {
		cmd.ProposerId = "c1"
	}
	fsm.PrepareProposal(cmd) // as raftnode does
	return s.st.Apply(s.index, s.term, cmd)
}

func (s *clusterState) must(t *testing.T, cmd *waldenv1.Command) *waldenv1.Result {
	t.Helper()
	r, err := s.propose(context.Background(), cmd)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fence declares broker failed at epoch as the cluster would: a majority
// of the voters attest that their grants expired, and the decision carries
// the term.
func (s *clusterState) fence(t *testing.T, broker string, epoch uint64) {
	t.Helper()
	for _, id := range []string{"c1", "c2", "c3"} {
		b, _ := s.st.Broker(broker)
		s.must(t, &waldenv1.Command{ProposerId: id, Op: &waldenv1.Command_ObserveBroker{ObserveBroker: &waldenv1.ObserveBroker{
			ObserverId: id, BrokerId: broker, Epoch: epoch, ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD,
			LeaseExpired: true, ExpectedIndex: committedObservation(b, id).GetIndex()}}})
	}
	s.must(t, &waldenv1.Command{Op: &waldenv1.Command_DeclareFailed{DeclareFailed: &waldenv1.DeclareFailed{BrokerId: broker, Epoch: epoch, Term: s.term}}})
}

func (s *clusterState) register(t *testing.T, id string) uint64 {
	t.Helper()
	return s.must(t, &waldenv1.Command{Op: &waldenv1.Command_RegisterBroker{RegisterBroker: &waldenv1.RegisterBroker{
		BrokerId: id, AgentAddr: "127.0.0.1:1"}}}).GetRegisterBroker().GetEpoch()
}

func (s *clusterState) count(is func(*waldenv1.Command) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.proposed {
		if is(c) {
			n++
		}
	}
	return n
}

func (s *clusterState) observeCount() int {
	return s.count(func(c *waldenv1.Command) bool { return c.GetObserveBroker() != nil })
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

func mine(b *waldenv1.Broker, id string) *waldenv1.Observation { return committedObservation(b, id) }

func TestObserverProposesOnlyChanges(t *testing.T) {
	st := newClusterState(t, policy.Defaults())
	st.register(t, "b1")
	pr := &switchProber{}
	clk := &lease.ManualClock{T: time.Hour}
	o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: time.Second, SuspectAfter: 3, Clock: clk}, st, st.propose, pr)
	ctx := context.Background()
	state := func() waldenv1.ObservationState { return mine(st.broker("b1"), "c1").GetObservationState() }
	round := func() { clk.Advance(time.Second); o.Round(ctx) }

	round()
	if state() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE || st.observeCount() != 1 {
		t.Fatalf("first round: %q, %d proposals", state(), st.observeCount())
	}
	round()
	if st.observeCount() != 1 {
		t.Fatal("an unchanged view was proposed again")
	}
	pr.set(true)
	round()
	round()
	if state() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
		t.Fatal("suspect before SuspectAfter failures")
	}
	round()
	if state() != waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT || st.observeCount() != 2 {
		t.Fatalf("after 3 failures: %q, %d proposals", state(), st.observeCount())
	}
	// The silence is counted from the last answered probe: 3 rounds.
	if got := mine(st.broker("b1"), "c1").GetUnheardForMs(); got != 3000 {
		t.Fatalf("reported silence %dms, want 3000", got)
	}
	// A lost proposal is repaired at the next round.
	pr.set(false)
	st.mu.Lock()
	st.fail = errors.New("proposal dropped")
	st.mu.Unlock()
	round()
	if state() != waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT {
		t.Fatal("failed proposal applied")
	}
	round()
	if state() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
		t.Fatalf("not repaired: %q", state())
	}
	// Gossip's dead verdict counts until a probe answers after it.
	o.SetGossip("agent/b1", GossipDead)
	pr.set(true)
	round()
	if state() != waldenv1.ObservationState_OBSERVATION_STATE_DEAD {
		t.Fatalf("gossip dead: %q", state())
	}
	pr.set(false)
	round()
	if state() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
		t.Fatalf("probe after gossip dead: %q", state())
	}
	// A re-registration clears the observations; they are made again at
	// the new epoch.
	epoch := st.register(t, "b1")
	round()
	if o := mine(st.broker("b1"), "c1"); o.GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE || o.GetEpoch() != epoch {
		t.Fatalf("after re-registration: %v", o)
	}
	// Fenced brokers are not observed.
	st.fence(t, "b1", epoch)
	n := st.observeCount()
	pr.set(true)
	for range 4 {
		round()
	}
	if st.observeCount() != n {
		t.Fatal("a fenced broker was observed")
	}
}

// TestObserverAttestsAndWithdraws: the coordinator attests only once its own
// grant plus drift is over and the broker stays silent, promises durably
// first, refuses grants while it has promised, and withdraws when the broker
// renews with it again, granting again only after the withdrawal applied.
func TestObserverAttestsAndWithdraws(t *testing.T) {
	p := policy.Defaults() // lease_ttl 3s, drift_margin 500ms
	st := newClusterState(t, p)
	epoch := st.register(t, "b1")
	clk := &lease.ManualClock{T: time.Hour}
	store := &lease.MemStore{}
	g, err := lease.NewGrantor(clk, store, 3*time.Second, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	g.ClusterHorizon(3500 * time.Millisecond) // the observer tells it from the state, too
	pr := &switchProber{}
	o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: time.Second, Grantor: g, Clock: clk}, st, st.propose, pr)
	ctx := context.Background()
	k := lease.Key{Broker: "b1", Epoch: epoch}
	clk.Advance(3500 * time.Millisecond) // the quiet period after start
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	pr.set(true)
	attested := func() bool { return mine(st.broker("b1"), "c1").GetLeaseExpired() }
	for range 3 {
		clk.Advance(time.Second)
		o.Round(ctx)
	}
	if attested() {
		t.Fatal("attested 3s after a 3s grant (drift 500ms)")
	}
	clk.Advance(600 * time.Millisecond)
	o.Round(ctx)
	if !attested() || !g.Promised(k) {
		t.Fatalf("not attested 3.6s after the grant: %v, promised %t", mine(st.broker("b1"), "c1"), g.Promised(k))
	}
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); !errors.Is(err, lease.ErrPromised) {
		t.Fatalf("granted after attesting: %v", err)
	}
	// The refused renewal was heard: the next round withdraws.
	pr.set(false)
	clk.Advance(time.Second)
	o.Round(ctx)
	if attested() || g.Promised(k) {
		t.Fatalf("not withdrawn after a renewal: %v, promised %t", mine(st.broker("b1"), "c1"), g.Promised(k))
	}
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); err != nil {
		t.Fatalf("grant after the withdrawal: %v", err)
	}
}

// TestObserverRestartKeepsPromise: a coordinator that attested, restarts
// (memory lost, promise kept in its store) and hears the broker again must
// refuse grants until it withdrew through raft.
func TestObserverRestartKeepsPromise(t *testing.T) {
	st := newClusterState(t, policy.Defaults())
	epoch := st.register(t, "b1")
	clk := &lease.ManualClock{T: time.Hour}
	store := &lease.MemStore{}
	g, _ := lease.NewGrantor(clk, store, 3*time.Second, 500*time.Millisecond)
	pr := &switchProber{down: true}
	o := NewObserver(ObserverConfig{NodeID: "c1", Grantor: g, Clock: clk}, st, st.propose, pr)
	for range 6 {
		clk.Advance(time.Second)
		o.Round(context.Background())
	}
	k := lease.Key{Broker: "b1", Epoch: epoch}
	if !mine(st.broker("b1"), "c1").GetLeaseExpired() {
		t.Fatal("no attestation")
	}
	g2, _ := lease.NewGrantor(clk, store, 3*time.Second, 500*time.Millisecond)
	g2.ClusterHorizon(3500 * time.Millisecond)
	clk.Advance(4 * time.Second)
	if err := g2.Grant(k, 3*time.Second, 500*time.Millisecond); !errors.Is(err, lease.ErrPromised) {
		t.Fatalf("the restarted coordinator granted a promised epoch: %v", err)
	}
	o2 := NewObserver(ObserverConfig{NodeID: "c1", Grantor: g2, Clock: clk}, st, st.propose, &switchProber{})
	clk.Advance(time.Second)
	o2.Round(context.Background())
	if g2.Promised(k) || mine(st.broker("b1"), "c1").GetLeaseExpired() {
		t.Fatal("not withdrawn after the restart")
	}
}

// TestObserverAttestsRequestedFailover: after an operator's request the
// coordinator attests once its grant is over, even while the broker talks.
func TestObserverAttestsRequestedFailover(t *testing.T) {
	st := newClusterState(t, policy.Defaults())
	epoch := st.register(t, "b1")
	clk := &lease.ManualClock{T: time.Hour}
	g, _ := lease.NewGrantor(clk, &lease.MemStore{}, 3*time.Second, 500*time.Millisecond)
	g.ClusterHorizon(3500 * time.Millisecond)
	o := NewObserver(ObserverConfig{NodeID: "c1", Grantor: g, Clock: clk}, st, st.propose, &switchProber{})
	k := lease.Key{Broker: "b1", Epoch: epoch}
	clk.Advance(3600 * time.Millisecond)
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	st.must(t, &waldenv1.Command{Op: &waldenv1.Command_RequestFailover{RequestFailover: &waldenv1.RequestFailover{BrokerId: "b1", Epoch: epoch}}})
	for range 3 {
		clk.Advance(time.Second)
		_ = g.Grant(k, 3*time.Second, 500*time.Millisecond) // the broker keeps renewing: heard, refused or not
		o.Round(context.Background())
	}
	if mine(st.broker("b1"), "c1").GetLeaseExpired() {
		t.Fatal("attested while its last grant may be live")
	}
	clk.Advance(4 * time.Second)
	o.Round(context.Background())
	if !mine(st.broker("b1"), "c1").GetLeaseExpired() {
		t.Fatal("a requested failover was not attested once the grant was over")
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

// TestDeciderLoop drives the loop on the real state machine with a fake
// clock: the leader seeds the policy first; the decision comes only after
// failure_timeout of silence judged from the leader's election and a
// majority of attestations; it carries the term and is proposed once.
func TestDeciderLoop(t *testing.T) {
	st := newClusterState(t, nil)
	epoch := st.register(t, "b1")
	clk := &lease.ManualClock{T: time.Hour}
	cl := &fakeCluster{leader: true, term: 3}
	st.term = 3
	seed := policy.Defaults()
	seed.FailureTimeoutMs, seed.LeaseTtlMs, seed.DriftMarginMs = 1500, 600, 200
	d := NewDecider(DeciderConfig{NodeID: "c1", Seed: seed, Clock: clk}, cl, st, st.propose)
	ctx := context.Background()
	d.Tick(ctx)
	if p, _, seeded := st.Policy(); !seeded || p.GetFailureTimeoutMs() != 1500 {
		t.Fatalf("policy not seeded from the leader's config: %v %t", p, seeded)
	}
	for _, id := range []string{"c2", "c3"} {
		st.must(t, &waldenv1.Command{ProposerId: id, Op: &waldenv1.Command_ObserveBroker{ObserveBroker: &waldenv1.ObserveBroker{
			ObserverId: id, BrokerId: "b1", Epoch: epoch, ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, UnheardForMs: 500}}})
	}
	declared := func() int { return st.count(func(c *waldenv1.Command) bool { return c.GetDeclareFailed() != nil }) }
	d.Tick(ctx)
	clk.Advance(900 * time.Millisecond)
	d.Tick(ctx)
	// Leadership lost and regained: silences are judged from the election.
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
	st.term = 5
	clk.Advance(100 * time.Millisecond)
	d.Tick(ctx)
	clk.Advance(900 * time.Millisecond)
	d.Tick(ctx)
	if declared() != 0 {
		t.Fatal("decided before a full failure_timeout under the new leader")
	}
	clk.Advance(200 * time.Millisecond)
	d.Tick(ctx)
	if declared() != 0 || d.Holds()["b1"].Reason != HoldLease {
		t.Fatalf("decided without attestations (holds %v)", d.Holds())
	}
	for _, id := range []string{"c2", "c3"} {
		cur := mine(st.broker("b1"), id)
		st.must(t, &waldenv1.Command{ProposerId: id, Op: &waldenv1.Command_ObserveBroker{ObserveBroker: &waldenv1.ObserveBroker{
			ObserverId: id, BrokerId: "b1", Epoch: epoch, ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, UnheardForMs: 1500, LeaseExpired: true, ExpectedIndex: cur.GetIndex()}}})
	}
	d.Tick(ctx)
	if declared() != 1 {
		t.Fatalf("declared %d times (holds %v)", declared(), d.Holds())
	}
	for range 5 {
		clk.Advance(time.Second)
		d.Tick(ctx)
	}
	b := st.broker("b1")
	if declared() != 1 || !b.GetFenced() {
		t.Fatalf("declared %d times, broker %v", declared(), b)
	}
	// The decision entry carried the leader's term.
	for _, c := range st.proposed {
		if df := c.GetDeclareFailed(); df != nil && df.GetTerm() != 5 {
			t.Fatalf("decision of term %d, want 5", df.GetTerm())
		}
	}
}

func TestObserverAndDeciderRunConcurrently(t *testing.T) {
	st := newClusterState(t, policy.Defaults())
	st.register(t, "b1")
	g, _ := lease.NewGrantor(lease.BootClock, &lease.MemStore{}, 0, 0)
	o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: 5 * time.Millisecond, Grantor: g}, st, st.propose, &switchProber{})
	d := NewDecider(DeciderConfig{NodeID: "c1", Interval: 5 * time.Millisecond}, &fakeCluster{leader: true, term: 1}, st, st.propose)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{}, 4)
	go func() { o.Run(ctx); done <- struct{}{} }()
	go func() { d.Run(ctx); done <- struct{}{} }()
	go func() {
		for ctx.Err() == nil {
			o.SetGossip("agent/b1", GossipAlive)
		}
		done <- struct{}{}
	}()
	go func() {
		for ctx.Err() == nil {
			_ = g.Grant(lease.Key{Broker: "b1", Epoch: 1}, time.Second, 0)
			_ = d.Holds()
		}
		done <- struct{}{}
	}()
	// All of them run side by side for a while at least, until the
	// observer's view is committed (a loaded machine may take long).
	time.Sleep(100 * time.Millisecond)
	testutil.EventuallyTrue(t, 10*time.Second, "the observer observes b1 alive", func() bool {
		return mine(st.broker("b1"), "c1").GetObservationState() == waldenv1.ObservationState_OBSERVATION_STATE_ALIVE
	})
	cancel()
	for range 4 {
		<-done
	}
}

func TestProbeReasonsAreForPeople(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	err = HTTPProber{}.Probe(context.Background(), addr)
	if got := probeReason(err, time.Second); got != "connection refused" {
		t.Fatalf("refused: %q (from %v)", got, err)
	}
	if got := probeReason(fmt.Errorf("%w: x: %w", ErrProbe, context.DeadlineExceeded), 500*time.Millisecond); got != "no answer within 500ms" {
		t.Fatalf("timeout: %q", got)
	}
	if got := probeReason(fmt.Errorf("%w: x: %w", ErrProbe, &probeStatusError{code: 503}), time.Second); got != "HTTP 503" {
		t.Fatalf("status: %q", got)
	}
}

// TestObserverSaysItNeverGranted (issue 21): an attestation says the
// member never granted the epoch a lease when its process started before
// the epoch's registration and granted it nothing; not when it granted
// it, nor when the registration is older than its process (a former run
// may have granted it).
func TestObserverSaysItNeverGranted(t *testing.T) {
	for _, c := range []struct {
		name       string
		grant      bool
		startIndex uint64
		want       bool
	}{
		{"registered after the start, never granted", false, 0, true},
		{"granted", true, 0, false},
		{"registered before the start", false, 1 << 40, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := newClusterState(t, policy.Defaults())
			epoch := st.register(t, "b1")
			clk := &lease.ManualClock{T: time.Hour}
			g, _ := lease.NewGrantor(clk, &lease.MemStore{}, 3*time.Second, 500*time.Millisecond)
			g.ClusterHorizon(3500 * time.Millisecond)
			clk.Advance(3500 * time.Millisecond)
			if c.grant {
				if err := g.Grant(lease.Key{Broker: "b1", Epoch: epoch}, 3*time.Second, 500*time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			o := NewObserver(ObserverConfig{NodeID: "c1", Grantor: g, Clock: clk, StartIndex: c.startIndex}, st, st.propose, &switchProber{down: true})
			for range 8 {
				clk.Advance(time.Second)
				o.Round(context.Background())
			}
			ob := mine(st.broker("b1"), "c1")
			if !ob.GetLeaseExpired() || ob.GetNeverGranted() != c.want {
				t.Fatalf("observation %v, want never_granted %t", ob, c.want)
			}
		})
	}
}

// countingClock counts its readings.
type countingClock struct {
	lease.ManualClock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Duration {
	c.reads.Add(1)
	return c.ManualClock.Now()
}

// TestObserverRoundReadsTheClockTwice: a round reads the boot clock once to
// choose the brokers it probes and once to plan, however many brokers it
// observes (a reading is a system call; a round per second over thousands
// of brokers made them a seventh of a coordinator's CPU), and a broker
// that renewed lately is still spared its probe and seen alive.
func TestObserverRoundReadsTheClockTwice(t *testing.T) {
	p := policy.Defaults()
	st := newClusterState(t, p)
	const n = 50
	clk := &countingClock{ManualClock: lease.ManualClock{T: time.Hour}}
	g, err := lease.NewGrantor(clk, &lease.MemStore{}, 3*time.Second, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	g.ClusterHorizon(3500 * time.Millisecond)
	clk.Advance(3500 * time.Millisecond) // the quiet period after start
	for i := range n {
		id := fmt.Sprintf("b%d", i)
		epoch := st.register(t, id)
		if err := g.Grant(lease.Key{Broker: id, Epoch: epoch}, 3*time.Second, 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	pr := &countingProber{probed: map[string]int{}} // a probe would fail
	o := NewObserver(ObserverConfig{NodeID: "c1", ProbeInterval: time.Second, Grantor: g, Clock: clk}, st, st.propose, pr)
	ctx := context.Background()
	o.Round(ctx) // the first round observes every broker alive
	clk.reads.Store(0)
	clk.Advance(100 * time.Millisecond)
	o.Round(ctx)
	if got := clk.reads.Load(); got != 2 {
		t.Fatalf("a round over %d brokers read the clock %d times, want 2", n, got)
	}
	pr.mu.Lock()
	probed := len(pr.probed)
	pr.mu.Unlock()
	if probed != 0 {
		t.Fatalf("%d brokers that renewed within the probe interval were probed", probed)
	}
	for i := range n {
		if s := mine(st.broker(fmt.Sprintf("b%d", i)), "c1").GetObservationState(); s != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
			t.Fatalf("b%d observed %v", i, s)
		}
	}
}
