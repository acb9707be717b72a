package detect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
)

// Prober probes a broker's agent directly. Probe returns nil when the agent
// answered within ctx.
type Prober interface {
	Probe(ctx context.Context, addr string) error
}

// HTTPProber probes GET http://addr/healthz. Any HTTP answer below 500
// counts: the agent process is alive and reachable (its lease validity is a
// separate matter).
type HTTPProber struct {
	Client *http.Client
	// Path is the probed path; default "/healthz".
	Path string
}

// NewHTTPProber returns the prober of an observer: its client keeps one
// persistent connection per agent, reused by every probe of it (a probe
// every second over a new connection would leave each coordinator with
// thousands of sockets in TIME_WAIT at a few hundred brokers), with no
// bound on the number of agents it keeps connections to, at most two
// connections to one agent, and every phase of a probe bounded by timeout.
func NewHTTPProber(timeout time.Duration) HTTPProber {
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
		MaxIdleConns:          0, // no bound over all agents
		MaxIdleConnsPerHost:   1,
		MaxConnsPerHost:       2,
		IdleConnTimeout:       probeIdleTimeout,
		ResponseHeaderTimeout: timeout,
		DisableCompression:    true,
	}
	return HTTPProber{Client: &http.Client{Transport: tr}}
}

// probeIdleTimeout closes a probe connection unused this long (a broker no
// longer probed); agents close theirs after 5s idle, which a probe every
// second never reaches.
const probeIdleTimeout = 30 * time.Second

// Probe implements Prober.
func (p HTTPProber) Probe(ctx context.Context, addr string) error {
	path := p.Path
	if path == "" {
		path = "/healthz"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrProbe, addr, err)
	}
	c := p.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrProbe, addr, err)
	}
	// Read the body to its end so that the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	if resp.StatusCode >= 500 {
		return fmt.Errorf("%w: %s: %w", ErrProbe, addr, &probeStatusError{code: resp.StatusCode})
	}
	return nil
}

// ProberFunc adapts a function to Prober.
type ProberFunc func(ctx context.Context, addr string) error

// Probe implements Prober.
func (f ProberFunc) Probe(ctx context.Context, addr string) error { return f(ctx, addr) }

// BrokerSource is the committed broker registry (package fsm's State).
// The observer and the decider only read what Brokers returns, so it may be
// a copy shared with other readers (fsm.State.BrokersView).
type BrokerSource interface {
	Brokers() []*waldenv1.Broker
}

// ObservedState is what the observer reads of the committed state.
type ObservedState interface {
	BrokerSource
	// Policy is the cluster's effective policy and whether it is seeded.
	Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool)
	// LeaseHorizon is the longest lease_ttl + drift_margin the cluster
	// ever used, in milliseconds, and whether the policy is seeded
	// (fsm.State.LeaseHorizon).
	LeaseHorizon() (int64, bool)
}

// ProposeFunc replicates a command through raft and returns its result.
type ProposeFunc func(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error)

// GossipState is what gossip last said of a member: alive, dead or left.
type GossipState int

// Gossip states of a broker's agent.
const (
	GossipUnknown GossipState = iota
	GossipAlive
	GossipDead
	GossipLeft
)

// ObserverConfig configures an Observer.
type ObserverConfig struct {
	// NodeID is this coordinator's member id (the observer id).
	NodeID string
	// ProbeInterval is the period of the direct probes. Default 1s.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe. Default 500ms.
	ProbeTimeout time.Duration
	// SuspectAfter is the number of consecutive failed probes (with no
	// lease renewal heard meanwhile) after which this coordinator observes
	// the broker suspect. Default 3; fewer when the policy's
	// failure_timeout is shorter than SuspectAfter+1 probe intervals
	// (suspectAfter).
	SuspectAfter int
	// ProposeTimeout bounds one ObserveBroker proposal. Default 2s.
	ProposeTimeout time.Duration
	// ProbeConcurrency bounds the probes in flight at once. A round of n
	// probes that all hang lasts ceil(n/ProbeConcurrency) probe timeouts.
	// Default 256.
	ProbeConcurrency int
	// ProposeConcurrency bounds the observation proposals in flight at
	// once (raft commits them together). Default 32.
	ProposeConcurrency int
	// Grantor is this coordinator's side of the brokers' quorum leases: the
	// observer attests through it that a grant expired, and withdraws the
	// attestation when the broker renews again. Nil: no attestations.
	Grantor *lease.Grantor
	// Clock is the boot clock silences are measured on, and the one its
	// readings are handed to Grantor with: it must be Grantor's. Default
	// Grantor's clock, or lease.BootClock without a Grantor.
	Clock lease.Clock
	// StartIndex is the last raft index this member's log held when its
	// process started: an epoch registered at a higher index was granted
	// only by this process, so an attestation for it can say whether this
	// member ever granted it a lease (Observation.never_granted).
	StartIndex uint64
	Logger     *slog.Logger
}

func (c *ObserverConfig) defaults() {
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = time.Second
	}
	if c.ProbeTimeout <= 0 || c.ProbeTimeout >= c.ProbeInterval {
		c.ProbeTimeout = c.ProbeInterval / 2
	}
	if c.SuspectAfter <= 0 {
		c.SuspectAfter = 3
	}
	if c.ProposeTimeout <= 0 {
		c.ProposeTimeout = 2 * time.Second
	}
	if c.ProbeConcurrency <= 0 {
		c.ProbeConcurrency = 256
	}
	if c.ProposeConcurrency <= 0 {
		c.ProposeConcurrency = 32
	}
	if c.Clock == nil && c.Grantor != nil {
		c.Clock = c.Grantor.Clock()
	}
	if c.Clock == nil {
		c.Clock = lease.BootClock
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Observer is one coordinator's failure observer. It probes every
// registered broker's agent each ProbeInterval, folds in gossip verdicts
// (SetGossip, fed by the consumer of gossip events) and the lease renewals
// it heard, and proposes an ObserveBroker entry whenever its view differs
// from its committed observation — so that a lost proposal, or an
// observation reset by a re-registration, is repaired at the next round.
//
// It also carries this coordinator's part of the quorum lease: once its
// grant for a broker epoch is over (lease.Grantor.ShouldAttest), it promises
// durably to grant that epoch nothing more and attests so in its
// observation; when the broker renews with it again it withdraws the
// attestation, and lifts the promise only once the withdrawal is applied.
type Observer struct {
	cfg     ObserverConfig
	state   ObservedState
	propose ProposeFunc
	prober  Prober
	log     *slog.Logger

	mu     sync.Mutex
	gossip map[string]gossipVerdict // by gossip name
	probes map[string]*probeState   // by broker id
}

type gossipVerdict struct {
	state GossipState
	at    time.Duration
}

type probeState struct {
	epoch  uint64
	first  time.Duration // when this epoch was first observed here
	ok     bool          // at least one probe answered at this epoch
	lastOK time.Duration // when a probe last answered
	// proposeFailing is set while proposals of this broker's observation
	// fail (a partitioned member logs the first failure only).
	proposeFailing bool
	failures       int
	lastErr        string
}

// NewObserver returns an observer; Run starts it.
func NewObserver(cfg ObserverConfig, state ObservedState, propose ProposeFunc, prober Prober) *Observer {
	cfg.defaults()
	if prober == nil {
		prober = NewHTTPProber(cfg.ProbeTimeout)
	}
	return &Observer{
		cfg: cfg, state: state, propose: propose, prober: prober,
		log:    cfg.Logger.With("component", "observer"),
		gossip: map[string]gossipVerdict{},
		probes: map[string]*probeState{},
	}
}

// SetGossip records gossip's verdict on the member named name. It never
// blocks on I/O. A dead or left verdict stands until a direct probe of the
// broker answers after it (fresher evidence wins: memberlist may keep
// refusing a restarted agent's name for a while).
func (o *Observer) SetGossip(name string, st GossipState) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.gossip[name] = gossipVerdict{state: st, at: o.cfg.Clock.Now()}
}

// GossipName is the gossip member name of a broker's agent: its registered
// gossip_name, or "agent/<broker_id>".
func GossipName(b *waldenv1.Broker) string {
	if n := b.GetGossipName(); n != "" {
		return n
	}
	return "agent/" + b.GetBrokerId()
}

// Run probes and proposes until ctx is done. Each round's probes are
// spread over part of the interval (probeSpread), so that a coordinator of
// thousands of brokers probes at an even pace rather than in one burst a
// second; each broker keeps its place in the round, hence its period.
func (o *Observer) Run(ctx context.Context) {
	t := time.NewTicker(o.cfg.ProbeInterval)
	defer t.Stop()
	for {
		o.round(ctx, o.probeSpread())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probeSpread is how long Run takes to start a round's probes: half of
// what is left of the interval after a probe's timeout, so that a round
// whose last probe hangs still ends within the interval.
func (o *Observer) probeSpread() time.Duration {
	return max(o.cfg.ProbeInterval-o.cfg.ProbeTimeout, 0) / 2
}

// Round probes every observed broker once (at most ProbeConcurrency at a
// time, each bounded by ProbeTimeout) and proposes the observations that
// changed (at most ProposeConcurrency at a time).
func (o *Observer) Round(ctx context.Context) { o.round(ctx, 0) }

// round is Round, starting the probes evenly over spread.
func (o *Observer) round(ctx context.Context, spread time.Duration) {
	brokers := o.state.Brokers()
	p, _, seeded := o.state.Policy()
	results := make([]error, len(brokers))
	probed := make([]bool, len(brokers))
	var todo []int
	// One reading of the boot clock for the whole choice, and one for the
	// whole plan once the probes are done: a reading is a system call,
	// and a round goes over every broker.
	now := o.cfg.Clock.Now()
	for i, b := range brokers {
		// A broker that renewed its lease with this coordinator within the
		// last interval is known alive: its probe would only repeat it
		// (and counts as heard meanwhile, view).
		if observed(b) && b.GetAgentAddr() != "" && !o.renewedLately(b, now) {
			todo = append(todo, i)
			probed[i] = true
		}
	}
	o.forEach(ctx, len(todo), o.cfg.ProbeConcurrency, spread, func(k int) {
		i := todo[k]
		pctx, cancel := context.WithTimeout(ctx, o.cfg.ProbeTimeout)
		defer cancel()
		results[i] = o.prober.Probe(pctx, brokers[i].GetAgentAddr())
	})
	if ctx.Err() != nil {
		return
	}
	seen := make(map[string]bool, len(brokers))
	var plans []Proposal
	now = o.cfg.Clock.Now()
	for i, b := range brokers {
		seen[b.GetBrokerId()] = true
		if !observed(b) {
			o.retire(b)
			continue
		}
		if pr, ok := o.PlanAt(b, results[i], probed[i], p, seeded, now); ok {
			plans = append(plans, pr)
		}
	}
	// Every planned proposal is made, each bounded by ctx (a round cut
	// short proposes what it planned, as each failing at once).
	o.forEach(context.Background(), len(plans), o.cfg.ProposeConcurrency, 0, func(k int) { o.proposePlan(ctx, plans[k]) })
	o.mu.Lock()
	for id := range o.probes {
		if !seen[id] {
			delete(o.probes, id)
		}
	}
	o.mu.Unlock()
}

// renewedLately reports whether this coordinator heard b renew its lease
// within the probe interval before now.
func (o *Observer) renewedLately(b *waldenv1.Broker, now time.Duration) bool {
	return o.cfg.Grantor != nil && o.cfg.Grantor.HeardWithinAt(lease.Key{Broker: b.GetBrokerId(), Epoch: b.GetEpoch()}, o.cfg.ProbeInterval, now)
}

// forEach calls f(0) … f(n-1) from at most workers goroutines, starting
// the calls evenly over spread (0: as fast as the workers take them), and
// returns when every call returned. It stops starting calls once ctx ends.
func (o *Observer) forEach(ctx context.Context, n, workers int, spread time.Duration, f func(int)) {
	if n == 0 {
		return
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				f(k)
			}
		}()
	}
	start := time.Now()
	for k := 0; k < n && ctx.Err() == nil; k++ {
		if spread > 0 {
			if d := time.Until(start.Add(spread * time.Duration(k) / time.Duration(n))); d > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(d):
				}
			}
		}
		select {
		case work <- k:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
}

// retire drops the lease memory of a fenced broker's epochs (they are never
// granted again) once.
func (o *Observer) retire(b *waldenv1.Broker) {
	o.mu.Lock()
	ps := o.probes[b.GetBrokerId()]
	done := ps != nil && ps.epoch == b.GetEpoch() && ps.first < 0
	if !done {
		o.probes[b.GetBrokerId()] = &probeState{epoch: b.GetEpoch(), first: -1}
	}
	o.mu.Unlock()
	if !done && o.cfg.Grantor != nil {
		if err := o.cfg.Grantor.Retire(b.GetBrokerId(), 0); err != nil {
			o.log.Warn("could not forget the lease promises of a fenced broker", "broker_id", b.GetBrokerId(), "err", err)
		}
	}
}

// Proposal is an observation the observer wants committed. Withdraw says
// that it withdraws an attestation: once it applied, Withdrawn must be
// called so that the coordinator grants the epoch again.
type Proposal struct {
	Observe  *waldenv1.ObserveBroker
	Withdraw bool
}

// proposePlan proposes a planned observation and, once a withdrawal
// applied, lifts the promise it withdraws.
func (o *Observer) proposePlan(ctx context.Context, pr Proposal) {
	op := pr.Observe
	id := op.GetBrokerId()
	pctx, cancel := context.WithTimeout(ctx, o.cfg.ProposeTimeout)
	_, err := o.propose(pctx, &waldenv1.Command{Op: &waldenv1.Command_ObserveBroker{ObserveBroker: op}})
	cancel()
	if err == nil && pr.Withdraw {
		o.Withdrawn(op)
	}
	o.mu.Lock()
	ps := o.probes[id]
	first := ps != nil && err != nil && !ps.proposeFailing
	if ps != nil {
		ps.proposeFailing = err != nil
	}
	o.mu.Unlock()
	switch {
	case first:
		o.log.Warn("propose observation failed; retrying every round", "broker_id", id, "state", op.GetObservationState().Name(), "err", err)
	case err != nil:
		o.log.Debug("propose observation failed again", "broker_id", id, "state", op.GetObservationState().Name(), "err", err)
	}
}

// Withdrawn lifts the lease promise of an applied withdrawal.
func (o *Observer) Withdrawn(op *waldenv1.ObserveBroker) {
	if err := o.cfg.Grantor.Withdrawn(lease.Key{Broker: op.GetBrokerId(), Epoch: op.GetEpoch()}); err != nil {
		o.log.Warn("could not lift the lease promise after its withdrawal", "broker_id", op.GetBrokerId(), "epoch", op.GetEpoch(), "err", err)
		return
	}
	o.log.Info("attestation withdrawn: granting the broker's lease again", "broker_id", op.GetBrokerId(), "epoch", op.GetEpoch())
}

// Plan folds one probe result of b (probed false: none was made) into the
// broker's history, works out this coordinator's observation — its state,
// its silence and its attestation — and returns the proposal to make when
// it differs from the committed one (ok false: nothing to propose). An
// attestation is promised durably before it is returned. Plan does no I/O
// but the promise.
func (o *Observer) Plan(b *waldenv1.Broker, probeErr error, probed bool, p *waldenv1.Policy, seeded bool) (Proposal, bool) {
	return o.PlanAt(b, probeErr, probed, p, seeded, o.cfg.Clock.Now())
}

// PlanAt is Plan at now, a reading of the observer's clock taken after the
// probe result was known (a round takes one for all its brokers). A
// reading taken before the moment of the plan can only make the attestation
// come later (ShouldAttestAt) and a broker look heard more lately.
func (o *Observer) PlanAt(b *waldenv1.Broker, probeErr error, probed bool, p *waldenv1.Policy, seeded bool, now time.Duration) (Proposal, bool) {
	id, epoch := b.GetBrokerId(), b.GetEpoch()
	k := lease.Key{Broker: id, Epoch: epoch}
	o.followEpoch(b, k)
	s := o.record(b, probeErr, probed, now)
	v := judge(s, o.suspectAfter(p, seeded), o.cfg.ProbeInterval)
	committed := committedObservation(b, o.cfg.NodeID)
	attested, withdraw := o.attestation(b, k, committed, p, seeded, s.now)
	state, reason, ok := settle(v, committed, attested, withdraw)
	if !ok {
		return Proposal{}, false
	}
	o.log.Info("observation changed", "broker_id", id, "epoch", epoch, "state", state.Name(), "lease_expired", attested,
		"withdraw", withdraw, "reason", reason, "committed", committed.GetObservationState().Name(), "unheard_for", v.unheard)
	return Proposal{Withdraw: withdraw, Observe: &waldenv1.ObserveBroker{
		ObserverId: o.cfg.NodeID, BrokerId: id, Epoch: epoch, ObservationState: state, Reason: reason,
		LeaseExpired: attested, ExpectedIndex: committed.GetIndex(), UnheardForMs: v.unheard.Milliseconds(),
		NeverGranted: attested && o.neverGranted(b, k),
	}}, true
}

// followEpoch keeps the probe history and this coordinator's lease grants
// on b's current epoch: a new epoch starts a new history and forgets the
// promises of the older ones.
func (o *Observer) followEpoch(b *waldenv1.Broker, k lease.Key) {
	newEpoch := o.track(b)
	if o.cfg.Grantor == nil {
		return
	}
	if ms, ok := o.state.LeaseHorizon(); ok {
		o.cfg.Grantor.ClusterHorizon(time.Duration(ms) * time.Millisecond)
	}
	if newEpoch {
		if err := o.cfg.Grantor.Retire(k.Broker, k.Epoch); err != nil {
			o.log.Warn("could not forget the lease promises of an old epoch", "broker_id", k.Broker, "err", err)
		}
	}
	o.cfg.Grantor.Seen(k)
}

// attestation works out whether this coordinator attests that its grant
// for k expired (promising so durably before it says so the first time),
// and whether it withdraws an attestation because the broker renews with it
// again.
func (o *Observer) attestation(b *waldenv1.Broker, k lease.Key, committed *waldenv1.Observation, p *waldenv1.Policy, seeded bool, now time.Duration) (attested, withdraw bool) {
	attested = committed.GetLeaseExpired()
	if o.cfg.Grantor == nil || !seeded {
		return attested, false
	}
	ttl := time.Duration(p.GetLeaseTtlMs()) * time.Millisecond
	drift := time.Duration(p.GetDriftMarginMs()) * time.Millisecond
	requested := b.GetFailoverRequested() != nil && b.GetFailoverRequested().GetEpoch() == k.Epoch
	promised := o.cfg.Grantor.Promised(k)
	switch {
	case (attested || promised) && !requested && o.cfg.Grantor.HeardWithin(k, ttl):
		// The broker renews with this coordinator again: withdraw, and
		// grant again once the withdrawal is applied.
		attested, withdraw = false, true
	case attested || promised:
		attested = true
	case o.cfg.Grantor.ShouldAttestAt(k, ttl, drift, requested, now):
		attested = true
	}
	if attested && !committed.GetLeaseExpired() {
		if err := o.cfg.Grantor.Promise(k); err != nil {
			o.log.Warn("cannot attest the broker's lease expired", "broker_id", k.Broker, "epoch", k.Epoch, "err", err)
			attested = false
		}
	}
	return attested, withdraw
}

// settle is the observation state and reason to propose: the view's, or the
// committed state while the view has nothing to say. ok is false when there
// is nothing to say at all, or when it is the committed observation already.
func settle(v judgement, committed *waldenv1.Observation, attested, withdraw bool) (state waldenv1.ObservationState, reason string, ok bool) {
	state, reason = v.state, v.reason
	if state == waldenv1.ObservationState_OBSERVATION_STATE_UNSPECIFIED {
		state = committed.GetObservationState()
		if state == waldenv1.ObservationState_OBSERVATION_STATE_UNSPECIFIED && !attested {
			return state, reason, false // nothing to say yet
		}
		if state == waldenv1.ObservationState_OBSERVATION_STATE_UNSPECIFIED {
			state, reason = waldenv1.ObservationState_OBSERVATION_STATE_ALIVE, "no probe answered yet"
		}
	}
	if committed != nil && state == committed.GetObservationState() && attested == committed.GetLeaseExpired() && !withdraw {
		return state, reason, false
	}
	return state, reason, true
}

// neverGranted reports whether this member never granted k a lease: its
// process started before k's registration (so it made every grant of k
// there was from it) and has granted k nothing.
func (o *Observer) neverGranted(b *waldenv1.Broker, k lease.Key) bool {
	if o.cfg.Grantor == nil || b.GetRegisteredIndex() <= o.cfg.StartIndex {
		return false
	}
	_, granted := o.cfg.Grantor.Remaining(k)
	return !granted
}

// track makes sure the probe history is of b's current epoch; it reports
// whether it had to start a new one.
func (o *Observer) track(b *waldenv1.Broker) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	ps := o.probes[b.GetBrokerId()]
	if ps != nil && ps.epoch == b.GetEpoch() && ps.first >= 0 {
		return false
	}
	o.probes[b.GetBrokerId()] = &probeState{epoch: b.GetEpoch(), first: o.cfg.Clock.Now()}
	return true
}

// observed reports whether b needs observing: registered and not fenced
// (a broker in maintenance is observed too: a manual failover needs its
// attestations).
func observed(b *waldenv1.Broker) bool {
	return !b.GetFenced()
}

// probeReason says in a few words why a probe failed, for the observation's
// reason (people read it in events and the web view).
func probeReason(err error, timeout time.Duration) string {
	var status *probeStatusError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer within %s", timeout)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.As(err, &status):
		return fmt.Sprintf("HTTP %d", status.code)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err.Error()
	}
	return strings.TrimPrefix(err.Error(), ErrProbe.Error()+": ")
}

// probeStatusError is an answer of 500 or above.
type probeStatusError struct{ code int }

func (e *probeStatusError) Error() string { return fmt.Sprintf("HTTP %d", e.code) }

// committedObservation returns this observer's committed observation of b
// at its current epoch, or nil.
func committedObservation(b *waldenv1.Broker, nodeID string) *waldenv1.Observation {
	for _, o := range b.GetObservations() {
		if o.GetObserverId() == nodeID && o.GetEpoch() == b.GetEpoch() {
			return o
		}
	}
	return nil
}

// record folds one probe result (probed false: none was made) into the
// broker's probe history and returns what this coordinator knows of the
// broker now: the history, the last lease renewal it heard and gossip's
// verdict. A renewal heard within the last probe interval breaks the run of
// failed probes: those before it are not consecutive with the ones to come.
func (o *Observer) record(b *waldenv1.Broker, probeErr error, probed bool, now time.Duration) sightings {
	o.mu.Lock()
	defer o.mu.Unlock()
	ps := o.probes[b.GetBrokerId()]
	if probed {
		if probeErr == nil {
			ps.ok, ps.failures, ps.lastErr, ps.lastOK = true, 0, "", now
		} else {
			ps.failures++
			ps.lastErr = probeReason(probeErr, o.cfg.ProbeTimeout)
		}
	}
	s := sightings{now: now, first: ps.first}
	if o.cfg.Grantor != nil {
		s.renewedAt, s.renewalHeard = o.cfg.Grantor.Heard(lease.Key{Broker: b.GetBrokerId(), Epoch: b.GetEpoch()})
		if s.renewalHeard && now-s.renewedAt < o.cfg.ProbeInterval {
			ps.failures, ps.lastErr = 0, ""
		}
	}
	s.probeOK, s.lastOK, s.failures, s.lastErr = ps.ok, ps.lastOK, ps.failures, ps.lastErr
	s.gossip, s.gossipHeard = o.gossip[GossipName(b)]
	return s
}

// sightings is what one coordinator knows of a broker at one moment (times
// on its boot clock): its probe history at the broker's epoch, the last
// lease renewal it heard, and gossip's verdict. judge turns it into a view.
type sightings struct {
	now time.Duration
	// first is when this epoch was first observed here.
	first time.Duration
	// probeOK: at least one probe answered at this epoch, the last at
	// lastOK; failures probes failed in a row since, the last with lastErr.
	probeOK  bool
	lastOK   time.Duration
	failures int
	lastErr  string
	// renewedAt is when the broker last renewed its lease here
	// (renewalHeard false: never at this epoch).
	renewedAt    time.Duration
	renewalHeard bool
	// gossip is gossip's last verdict on the broker's agent (gossipHeard
	// false: none).
	gossip      gossipVerdict
	gossipHeard bool
}

// judgement is one coordinator's view of a broker: its state, the reason in
// a few words, and how long it has not heard the broker (no answered probe,
// no lease renewal). state is unspecified while there is nothing to say yet
// (no probe answered and none has failed enough).
type judgement struct {
	state   waldenv1.ObservationState
	reason  string
	unheard time.Duration
}

// judging is what every rule of judge looks at: the sightings, the
// silence, and whether a renewal heard lately vouches for the broker.
type judging struct {
	sightings
	suspectAfter int
	// renewed: a lease renewal was heard within suspectAfter probe
	// intervals.
	renewed bool
}

// rule is one input of the judgement: it names the state it sees (ok) or
// has nothing to say.
type rule func(j judging) (state waldenv1.ObservationState, reason string, ok bool)

// rules are judge's rules in order of precedence: the first that has
// something to say gives the view.
var rules = []rule{byGossip, byFailedProbes, byAnsweredProbe, byRenewals}

// judge is a coordinator's view of a broker from its sightings: the first
// of rules that has something to say, and the silence since the last
// contact (an answered probe, a renewal, or the epoch's first sight here).
// It is pure.
func judge(s sightings, suspectAfter int, probeInterval time.Duration) judgement {
	last := s.first
	if s.probeOK {
		last = max(last, s.lastOK)
	}
	j := judging{sightings: s, suspectAfter: suspectAfter}
	if s.renewalHeard {
		last = max(last, s.renewedAt)
		j.renewed = s.now-s.renewedAt < time.Duration(suspectAfter)*probeInterval
	}
	v := judgement{unheard: max(s.now-last, 0)}
	for _, r := range rules {
		if state, reason, ok := r(j); ok {
			v.state, v.reason = state, reason
			break
		}
	}
	return v
}

// byGossip: gossip's dead or left verdict, unless a probe answered after it
// or the broker renews its lease lately.
func byGossip(j judging) (waldenv1.ObservationState, string, bool) {
	if !j.gossipHeard || j.gossip.at < j.lastOK || j.renewed {
		return 0, "", false
	}
	switch j.gossip.state {
	case GossipDead:
		return waldenv1.ObservationState_OBSERVATION_STATE_DEAD, "gossip: dead", true
	case GossipLeft:
		return waldenv1.ObservationState_OBSERVATION_STATE_DEAD, reasonLeft, true
	}
	return 0, "", false
}

// byFailedProbes: suspect after suspectAfter failed probes in a row, unless
// the broker renews its lease lately.
func byFailedProbes(j judging) (waldenv1.ObservationState, string, bool) {
	if j.failures < j.suspectAfter || j.renewed {
		return 0, "", false
	}
	return waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, fmt.Sprintf("%d probes failed in a row (%s)", j.failures, j.lastErr), true
}

// byAnsweredProbe: alive when the last probe answered.
func byAnsweredProbe(j judging) (waldenv1.ObservationState, string, bool) {
	return waldenv1.ObservationState_OBSERVATION_STATE_ALIVE, "probe ok", j.failures == 0 && j.probeOK
}

// byRenewals: alive while the broker renews its lease lately. Between 1 and
// suspectAfter-1 failures without it, no rule speaks: the committed view
// stands.
func byRenewals(j judging) (waldenv1.ObservationState, string, bool) {
	return waldenv1.ObservationState_OBSERVATION_STATE_ALIVE, "lease renewals heard", j.renewed
}

// suspectAfter is the number of consecutive failed probes, with no renewal
// heard for as many intervals, after which this coordinator observes a
// broker suspect: SuspectAfter, or fewer when the policy's failure_timeout
// is shorter than SuspectAfter+1 probe intervals. The suspicion must be
// committed before the silence reaches failure_timeout (the decision
// counts the silence from the last contact, not from the suspicion), or a
// short timeout would wait for the probes rather than for itself. At
// least 1.
func (o *Observer) suspectAfter(p *waldenv1.Policy, seeded bool) int {
	n := o.cfg.SuspectAfter
	if !seeded {
		return n
	}
	fit := int(time.Duration(p.GetFailureTimeoutMs())*time.Millisecond/o.cfg.ProbeInterval) - 1
	return max(1, min(n, fit))
}
