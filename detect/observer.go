package detect

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

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
		return fmt.Errorf("%w: %s: HTTP %d", ErrProbe, addr, resp.StatusCode)
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
	// SuspectAfter is the number of consecutive failed probes after which
	// this coordinator observes the broker suspect. Default 3.
	SuspectAfter int
	// ProposeTimeout bounds one ObserveBroker proposal. Default 2s.
	ProposeTimeout time.Duration
	Logger         *slog.Logger
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
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Observer is one coordinator's failure observer. It probes every
// registered broker's agent each ProbeInterval, folds in gossip verdicts
// (SetGossip, fed by the consumer of gossip events), and proposes an
// ObserveBroker entry whenever its view differs from its committed
// observation — so that a lost proposal, or an observation reset by a
// re-registration, is repaired at the next round.
type Observer struct {
	cfg     ObserverConfig
	state   BrokerSource
	propose ProposeFunc
	prober  Prober
	log     *slog.Logger

	mu     sync.Mutex
	gossip map[string]gossipVerdict // by gossip name
	probes map[string]*probeState   // by broker id
}

type gossipVerdict struct {
	state GossipState
	at    time.Time
}

type probeState struct {
	epoch  uint64
	ok     bool      // at least one probe answered at this epoch
	lastOK time.Time // when a probe last answered
	// proposeFailing is set while proposals of this broker's observation
	// fail (a partitioned member logs the first failure only).
	proposeFailing bool
	failures       int
	lastErr        string
}

// NewObserver returns an observer; Run starts it.
func NewObserver(cfg ObserverConfig, state BrokerSource, propose ProposeFunc, prober Prober) *Observer {
	cfg.defaults()
	if prober == nil {
		prober = HTTPProber{}
	}
	return &Observer{
		cfg: cfg, state: state, propose: propose, prober: prober,
		log:    cfg.Logger.With("component", "observer", "node_id", cfg.NodeID),
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
	o.gossip[name] = gossipVerdict{state: st, at: time.Now()}
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
		id := b.GetBrokerId()
		seen[id] = true
		if !observed(b) {
			continue
		}
		state, reason, ok := o.view(b, results[i], b.GetAgentAddr() != "")
		if !ok || state == committedState(b, o.cfg.NodeID) {
			continue
		}
		o.log.Info("observation changed", "broker_id", id, "epoch", b.GetEpoch(), "state", state, "reason", reason,
			"committed", committedState(b, o.cfg.NodeID))
		pctx, cancel := context.WithTimeout(ctx, o.cfg.ProposeTimeout)
		_, err := o.propose(pctx, &waldenv1.Command{Op: &waldenv1.Command_ObserveBroker{ObserveBroker: &waldenv1.ObserveBroker{
			ObserverId: o.cfg.NodeID, BrokerId: id, State: state, Reason: reason,
		}}})
		cancel()
		o.mu.Lock()
		ps := o.probes[id]
		first := ps != nil && err != nil && !ps.proposeFailing
		if ps != nil {
			ps.proposeFailing = err != nil
		}
		o.mu.Unlock()
		switch {
		case first:
			o.log.Warn("propose observation failed; retrying every round", "broker_id", id, "state", state, "err", err)
		case err != nil:
			o.log.Debug("propose observation failed again", "broker_id", id, "state", state, "err", err)
		}
	}
	o.mu.Lock()
	for id := range o.probes {
		if !seen[id] {
			delete(o.probes, id)
		}
	}
	o.mu.Unlock()
}

// observed reports whether b needs observing: registered, not fenced and
// not in maintenance.
func observed(b *waldenv1.Broker) bool {
	return !b.GetFenced() && !b.GetMaintenance()
}

func committedState(b *waldenv1.Broker, nodeID string) string {
	for _, o := range b.GetObservations() {
		if o.GetObserverId() == nodeID {
			return o.GetState()
		}
	}
	return ""
}

// view folds one probe result into the broker's probe history and returns
// this coordinator's view. ok is false while there is nothing to say yet
// (no probe answered and none has failed enough).
func (o *Observer) view(b *waldenv1.Broker, probeErr error, probed bool) (state, reason string, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ps := o.probes[b.GetBrokerId()]
	if ps == nil || ps.epoch != b.GetEpoch() {
		ps = &probeState{epoch: b.GetEpoch()}
		o.probes[b.GetBrokerId()] = ps
	}
	if probed {
		if probeErr == nil {
			ps.ok, ps.failures, ps.lastErr, ps.lastOK = true, 0, "", time.Now()
		} else {
			ps.failures++
			ps.lastErr = probeErr.Error()
		}
	}
	if g := o.gossip[GossipName(b)]; g.at.After(ps.lastOK) {
		switch g.state {
		case GossipDead:
			return StateDead, "gossip: dead", true
		case GossipLeft:
			return StateDead, reasonLeft, true
		}
	}
	if ps.failures >= o.cfg.SuspectAfter {
		return StateSuspect, fmt.Sprintf("probe: %d consecutive failures: %s", ps.failures, ps.lastErr), true
	}
	if ps.failures == 0 && ps.ok {
		return StateAlive, "probe ok", true
	}
	// Between 1 and SuspectAfter-1 failures: keep the committed view.
	return "", "", false
}
