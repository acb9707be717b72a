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
type BrokerSource interface {
	Brokers() []*waldenv1.Broker
}

// ObservedState is what the observer reads of the committed state.
type ObservedState interface {
	BrokerSource
	// Policy is the cluster's effective policy and whether it is seeded.
	Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool)
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
	// the broker suspect. Default 3.
	SuspectAfter int
	// ProposeTimeout bounds one ObserveBroker proposal. Default 2s.
	ProposeTimeout time.Duration
	// Grantor is this coordinator's side of the brokers' quorum leases: the
	// observer attests through it that a grant expired, and withdraws the
	// attestation when the broker renews again. Nil: no attestations.
	Grantor *lease.Grantor
	// Clock is the boot clock silences are measured on; default
	// lease.BootClock.
	Clock  lease.Clock
	Logger *slog.Logger
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
		prober = HTTPProber{}
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

// Run probes and proposes until ctx is done.
func (o *Observer) Run(ctx context.Context) {
	t := time.NewTicker(o.cfg.ProbeInterval)
	defer t.Stop()
	for {
		o.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round probes every observed broker once (concurrently, each bounded by
// ProbeTimeout) and proposes the observations that changed.
func (o *Observer) Round(ctx context.Context) {
	brokers := o.state.Brokers()
	p, _, seeded := o.state.Policy()
	var wg sync.WaitGroup
	results := make([]error, len(brokers))
	for i, b := range brokers {
		if !observed(b) || b.GetAgentAddr() == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, o.cfg.ProbeTimeout)
			defer cancel()
			results[i] = o.prober.Probe(pctx, b.GetAgentAddr())
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	seen := map[string]bool{}
	for i, b := range brokers {
		seen[b.GetBrokerId()] = true
		if !observed(b) {
			o.retire(b)
			continue
		}
		o.observe(ctx, b, results[i], p, seeded)
	}
	o.mu.Lock()
	for id := range o.probes {
		if !seen[id] {
			delete(o.probes, id)
		}
	}
	o.mu.Unlock()
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

// observe plans this coordinator's observation of b from one probe result
// and proposes it when it differs from the committed one.
func (o *Observer) observe(ctx context.Context, b *waldenv1.Broker, probeErr error, p *waldenv1.Policy, seeded bool) {
	pr, ok := o.Plan(b, probeErr, b.GetAgentAddr() != "", p, seeded)
	if !ok {
		return
	}
	id, op := b.GetBrokerId(), pr.Observe
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
		o.log.Warn("propose observation failed; retrying every round", "broker_id", id, "state", op.GetState(), "err", err)
	case err != nil:
		o.log.Debug("propose observation failed again", "broker_id", id, "state", op.GetState(), "err", err)
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
	id, epoch := b.GetBrokerId(), b.GetEpoch()
	k := lease.Key{Broker: id, Epoch: epoch}
	newEpoch := o.track(b)
	if o.cfg.Grantor != nil {
		if newEpoch {
			if err := o.cfg.Grantor.Retire(id, epoch); err != nil {
				o.log.Warn("could not forget the lease promises of an old epoch", "broker_id", id, "err", err)
			}
		}
		o.cfg.Grantor.Seen(k)
	}
	state, reason, unheard := o.view(b, probeErr, probed)
	committed := committedObservation(b, o.cfg.NodeID)
	attested, withdraw := committed.GetLeaseExpired(), false
	if o.cfg.Grantor != nil && seeded {
		ttl := time.Duration(p.GetLeaseTtlMs()) * time.Millisecond
		drift := time.Duration(p.GetDriftMarginMs()) * time.Millisecond
		requested := b.GetFailoverRequested() != nil && b.GetFailoverRequested().GetEpoch() == epoch
		promised := o.cfg.Grantor.Promised(k)
		switch {
		case (attested || promised) && !requested && o.cfg.Grantor.HeardWithin(k, ttl):
			// The broker renews with this coordinator again: withdraw, and
			// grant again once the withdrawal is applied.
			attested, withdraw = false, true
		case attested || promised:
			attested = true
		case o.cfg.Grantor.ShouldAttest(k, ttl, drift, requested):
			attested = true
		}
		if attested && !committed.GetLeaseExpired() {
			if err := o.cfg.Grantor.Promise(k); err != nil {
				o.log.Warn("cannot attest the broker's lease expired", "broker_id", id, "epoch", epoch, "err", err)
				attested = false
			}
		}
	}
	if state == "" {
		state = committed.GetState()
		if state == "" && !attested {
			return Proposal{}, false // nothing to say yet
		}
		if state == "" {
			state, reason = StateAlive, "no probe answered yet"
		}
	}
	if committed != nil && state == committed.GetState() && attested == committed.GetLeaseExpired() && !withdraw {
		return Proposal{}, false
	}
	o.log.Info("observation changed", "broker_id", id, "epoch", epoch, "state", state, "lease_expired", attested,
		"withdraw", withdraw, "reason", reason, "committed", committed.GetState(), "unheard_for", unheard)
	return Proposal{Withdraw: withdraw, Observe: &waldenv1.ObserveBroker{
		ObserverId: o.cfg.NodeID, BrokerId: id, Epoch: epoch, State: state, Reason: reason,
		LeaseExpired: attested, ExpectedIndex: committed.GetIndex(), UnheardForMs: unheard.Milliseconds(),
	}}, true
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

// view folds one probe result into the broker's probe history and returns
// this coordinator's view and how long it has not heard the broker (no
// answered probe, no lease renewal). state is "" while there is nothing to
// say yet (no probe answered and none has failed enough).
func (o *Observer) view(b *waldenv1.Broker, probeErr error, probed bool) (state, reason string, unheard time.Duration) {
	now := o.cfg.Clock.Now()
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
	last := ps.first
	if ps.ok {
		last = max(last, ps.lastOK)
	}
	renewed := false
	if o.cfg.Grantor != nil {
		if at, ok := o.cfg.Grantor.Heard(lease.Key{Broker: b.GetBrokerId(), Epoch: b.GetEpoch()}); ok {
			last = max(last, at)
			renewed = now-at < time.Duration(o.cfg.SuspectAfter)*o.cfg.ProbeInterval
		}
	}
	unheard = max(now-last, 0)
	if g, ok := o.gossip[GossipName(b)]; ok && g.at >= ps.lastOK && !renewed {
		switch g.state {
		case GossipDead:
			return StateDead, "gossip: dead", unheard
		case GossipLeft:
			return StateDead, reasonLeft, unheard
		}
	}
	switch {
	case ps.failures >= o.cfg.SuspectAfter && !renewed:
		return StateSuspect, fmt.Sprintf("%d probes failed in a row (%s)", ps.failures, ps.lastErr), unheard
	case ps.failures == 0 && ps.ok:
		return StateAlive, "probe ok", unheard
	case renewed:
		return StateAlive, "lease renewals heard", unheard
	}
	// Between 1 and SuspectAfter-1 failures: keep the committed view.
	return "", "", unheard
}
