package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"

	"walden/config"
	"walden/gossip"
	"walden/httplimit"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
)

// Clock reads the monotonic clock. The agent compares only readings of one
// Clock with each other, never with wall-clock time from another machine.
type Clock interface {
	// Now returns the current time; with the real clock it carries Go's
	// monotonic reading, so that Sub and Before ignore wall-clock steps.
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Options are the parts of an Agent that are not configuration.
type Options struct {
	// Logger receives the agent's structured log; nil discards it.
	Logger *slog.Logger
	// Clock is the monotonic clock of the lease; nil means time.Now.
	Clock Clock
	// DialOptions are added to the options of the gRPC connections to the
	// coordinators (after the transport credentials from the tls keys).
	DialOptions []grpc.DialOption
	// RegisterBackoffMax bounds the wait between registration attempts.
	// Default 2s.
	RegisterBackoffMax time.Duration
	// Metrics, when set, is served at GET /metrics on the agent's local
	// endpoint (the process's Prometheus registry).
	Metrics http.Handler
	// HTTPLimits bound the local HTTP endpoint; zero means
	// DefaultHTTPLimits.
	HTTPLimits httplimit.Limits
}

// DefaultHTTPLimits bound the agent's HTTP endpoint: its clients are one
// broker and the coordinators' probes, which send their headers at once and
// ask every second, so a few hundred connections, a short header time and a
// short idle time are plenty. A flood of connections then holds at most
// MaxConns file descriptors, each for a few seconds.
var DefaultHTTPLimits = httplimit.Limits{MaxConns: 256, ReadHeaderTimeout: 2 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10}

// Lease is the broker's lease as the agent knows it at one instant.
type Lease struct {
	// BrokerID is the broker the lease belongs to.
	BrokerID string
	// Epoch is the broker's fencing token (0 before the first registration).
	// It changes when the broker registers again after being fenced: every
	// request of the broker must carry the current one.
	Epoch uint64
	// Valid says the broker may acknowledge writes with Epoch now: the
	// cluster confirmed the lease less than lease_ttl - safety_margin ago,
	// measured from when the confirming request was sent.
	Valid bool
	// Remaining is how long the lease stays valid without another renewal;
	// 0 when not valid.
	Remaining time.Duration
	// Fenced says the cluster refused Epoch (NODE_FENCED or EPOCH_EXPIRED):
	// the broker was failed over. It stays set until the agent has
	// registered again with a new epoch.
	Fenced bool
}

// state is the agent's view of its lease, guarded by Agent.mu.
type state struct {
	registered bool
	epoch      uint64
	ttl        time.Duration
	recovered  int64
	// confirmedSent is when the last renewal that succeeded for epoch was
	// sent; zero when no renewal succeeded yet for this epoch.
	confirmedSent time.Time
	// confirmedTTL is the lease that renewal granted.
	confirmedTTL time.Duration
	fenced       bool
	stopped      bool
}

// Agent holds one broker's registration and lease. Its methods are safe for
// concurrent use.
type Agent struct {
	cfg    *config.Agent
	log    *slog.Logger
	clock  Clock
	coords *coordinators
	opts   Options

	mu      sync.Mutex
	st      state
	changed chan struct{} // closed and replaced at every change of st
	hooks   []func(Lease)
	events  chan Lease // epoch changes for the hook dispatcher

	lifecycle sync.Mutex
	started   bool
	stopDone  bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	ln        net.Listener
	httpSrv   *http.Server
	pool      *gossip.Pool
	addr      string
}

// New checks cfg and returns an Agent that has not started yet. It reads the
// tls files, if any, and nothing else.
func New(cfg *config.Agent, opts Options) (*Agent, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.RegisterBackoffMax <= 0 {
		opts.RegisterBackoffMax = 2 * time.Second
	}
	creds, err := mtls.ClientCreds(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := mtls.CheckGossipKey(cfg.TLS, cfg.Gossip.EncryptionKeyFile); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	log := opts.Logger.With("broker_id", cfg.BrokerID)
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts.DialOptions...)
	return &Agent{
		cfg:     cfg,
		log:     log,
		clock:   opts.Clock,
		coords:  newCoordinators(cfg.Coordinators, dial, log),
		opts:    opts,
		changed: make(chan struct{}),
		events:  make(chan Lease, 64),
	}, nil
}

// Run starts the agent, blocks until ctx is done, then stops it gracefully
// (leaving gossip).
func (a *Agent) Run(ctx context.Context) error {
	if err := a.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	return a.Stop(true)
}

// Start binds the local HTTP endpoint, joins gossip and starts registering
// and renewing in the background. It returns once the endpoint is bound.
func (a *Agent) Start() error {
	a.lifecycle.Lock()
	defer a.lifecycle.Unlock()
	if a.started {
		return fmt.Errorf("%w: already started", ErrStart)
	}
	if a.stopDone {
		return fmt.Errorf("%w: %w", ErrStart, ErrStopped)
	}
	a.started = true
	ln, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w: listen %s: %w", ErrStart, a.cfg.Listen, err)
	}
	a.ln = ln
	a.addr = ln.Addr().String()
	lim := a.opts.HTTPLimits
	if lim == (httplimit.Limits{}) {
		lim = DefaultHTTPLimits
	}
	ln = httplimit.Listener(ln, lim)
	a.httpSrv = httplimit.Server(a.Handler(), lim, slog.NewLogLogger(a.log.With("component", "http").Handler(), slog.LevelWarn))

	g := a.cfg.Gossip
	g.EncryptionKeyFile = a.cfg.GossipKeyFile() // beside tls.ca_file unless named
	g.ClusterName = a.cfg.ClusterName
	g.NodeName = a.cfg.GossipNodeName()
	g.Meta = gossip.Meta{Role: gossip.RoleAgent, ID: a.cfg.BrokerID, AgentAddr: a.addr}
	g.Logger = a.log.With("component", "gossip")
	pool, err := gossip.Start(g)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("%w: gossip: %w", ErrStart, err)
	}
	a.pool = pool

	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	a.wg.Add(3)
	go func() {
		defer a.wg.Done()
		if err := a.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("lease endpoint stopped", "err", err)
		}
	}()
	go func() {
		defer a.wg.Done()
		a.loop(ctx)
	}()
	go func() {
		defer a.wg.Done()
		a.dispatch(ctx)
	}()
	a.log.Info("agent started", "listen", a.addr, "gossip", pool.Addr(), "coordinators", a.cfg.Coordinators)
	return nil
}

// Addr is the bound address of the local HTTP endpoint ("" before Start).
func (a *Agent) Addr() string {
	a.lifecycle.Lock()
	defer a.lifecycle.Unlock()
	return a.addr
}

// Stop stops renewing and serving. With graceful set the agent first leaves
// the gossip pool, so that coordinators see the broker leave rather than
// die; without it the agent disappears as if its host had crashed. The
// lease is no longer valid once Stop returns. Calling it again does nothing.
func (a *Agent) Stop(graceful bool) error {
	a.lifecycle.Lock()
	defer a.lifecycle.Unlock()
	if a.stopDone {
		return nil
	}
	a.stopDone = true
	a.markStopped()
	if a.cancel == nil { // never started, or Start failed
		return nil
	}
	a.cancel()
	var errs []error
	if graceful {
		if err := a.pool.Leave(time.Second); err != nil {
			errs = append(errs, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := a.httpSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("agent: http shutdown: %w", err))
		}
		cancel()
	} else {
		_ = a.httpSrv.Close()
	}
	if err := a.pool.Shutdown(); err != nil {
		errs = append(errs, err)
	}
	a.wg.Wait()
	a.coords.close()
	a.log.Info("agent stopped", "graceful", graceful)
	return errors.Join(errs...)
}

func (a *Agent) markStopped() {
	a.mu.Lock()
	a.st.stopped = true
	a.notifyLocked()
	a.mu.Unlock()
}

// notifyLocked wakes every waiter on a.changed; a.mu must be held.
func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// Lease returns the lease at this instant.
func (a *Agent) Lease() Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leaseLocked(a.clock.Now())
}

// leaseLocked computes the lease at now; a.mu must be held.
func (a *Agent) leaseLocked(now time.Time) Lease {
	l := Lease{BrokerID: a.cfg.BrokerID, Epoch: a.st.epoch, Fenced: a.st.fenced}
	if !a.st.registered || a.st.fenced || a.st.stopped || a.st.confirmedSent.IsZero() {
		return l
	}
	until := a.st.confirmedSent.Add(a.st.confirmedTTL - a.cfg.LeaseSafetyMargin)
	if now.Before(until) {
		l.Valid = true
		l.Remaining = until.Sub(now)
	}
	return l
}

// RecoveredWALOffset is the WAL offset up to which a recovery uploaded the
// broker's WAL, as answered by the last registration; -1 when no recovery
// ran (or before the first registration). A broker trims its WAL to it
// before it serves.
func (a *Agent) RecoveredWALOffset() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.st.registered {
		return -1
	}
	return a.st.recovered
}

// OnEpochChange registers fn to be called with the lease each time the
// broker gets a new epoch (the first registration and every registration
// after a fencing). Calls come from one goroutine, in order, and must not
// block for long. Register hooks before Start to see the first epoch.
func (a *Agent) OnEpochChange(fn func(Lease)) {
	a.mu.Lock()
	a.hooks = append(a.hooks, fn)
	a.mu.Unlock()
}

func (a *Agent) dispatch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case l := <-a.events:
			a.mu.Lock()
			hooks := append([]func(Lease){}, a.hooks...)
			a.mu.Unlock()
			for _, fn := range hooks {
				fn(l)
			}
		}
	}
}

// Check returns nil when the broker may acknowledge a write with the current
// epoch now, else ErrNotRegistered, ErrFenced, ErrLeaseExpired or ErrStopped
// (wrapped with the epoch).
func (a *Agent) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.leaseLocked(a.clock.Now())
	switch {
	case a.st.stopped:
		return ErrStopped
	case l.Fenced:
		return fmt.Errorf("%w: epoch %d refused by the cluster", ErrFenced, l.Epoch)
	case !a.st.registered:
		return ErrNotRegistered
	case !l.Valid:
		return fmt.Errorf("%w: epoch %d", ErrLeaseExpired, l.Epoch)
	}
	return nil
}

// WaitRegistered blocks until the broker is registered and its lease has
// been confirmed by a renewal (Lease().Valid), and returns that lease. It
// returns ctx's error when ctx ends first and ErrStopped when the agent
// stops.
func (a *Agent) WaitRegistered(ctx context.Context) (Lease, error) {
	for {
		a.mu.Lock()
		l := a.leaseLocked(a.clock.Now())
		stopped, ch := a.st.stopped, a.changed
		a.mu.Unlock()
		if l.Valid {
			return l, nil
		}
		if stopped {
			return l, ErrStopped
		}
		select {
		case <-ctx.Done():
			return l, fmt.Errorf("agent: wait registered: %w", ctx.Err())
		case <-ch:
		}
	}
}

// loop registers, renews until the epoch is refused, and registers again,
// until ctx ends.
func (a *Agent) loop(ctx context.Context) {
	for ctx.Err() == nil {
		epoch, ttl, ok := a.register(ctx)
		if !ok {
			return
		}
		a.renew(ctx, epoch, ttl)
	}
}

// register asks the cluster for a new epoch until it answers or ctx ends.
func (a *Agent) register(ctx context.Context) (epoch uint64, ttl time.Duration, ok bool) {
	req := &waldenv1.RegisterRequest{
		ClusterName: a.cfg.ClusterName,
		BrokerId:    a.cfg.BrokerID,
		AgentAddr:   a.addr,
		BrokerAddr:  a.cfg.BrokerAddr,
		Wal:         &waldenv1.WalLocation{VolumeId: a.cfg.WAL.VolumeID, Path: a.cfg.WAL.Path},
		GossipName:  a.cfg.GossipNodeName(),
	}
	backoff := 50 * time.Millisecond
	waitingLogged := false
	for attempt := 1; ; attempt++ {
		var resp *waldenv1.RegisterResponse
		_, err := a.coords.call(ctx, 2*time.Second, a.clock.Now, func(ctx context.Context, cl waldenv1.AgentClient, opts ...grpc.CallOption) error {
			var err error
			resp, err = cl.Register(ctx, req, opts...)
			return err
		})
		if err == nil {
			ttl = time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond
			if ttl <= 0 {
				a.log.Error("registration answered without a lease_ttl; retrying", "epoch", resp.GetEpoch())
			} else {
				a.registered(resp, ttl)
				return resp.GetEpoch(), ttl, true
			}
		} else if ctx.Err() != nil {
			return 0, 0, false
		} else if reason := refusalReason(err); reason == reasonRecoveryRunning {
			if !waitingLogged {
				a.log.Info("registration waits while a recovery job for it is running", "err", err)
				waitingLogged = true
			}
		} else {
			lvl := slog.LevelDebug
			if attempt%10 == 1 { // the first failure, then about every 20s
				lvl = slog.LevelWarn
			}
			a.log.Log(ctx, lvl, "registration failed; retrying", "attempt", attempt, "err", err)
		}
		// Jitter (half the backoff) keeps many agents from registering in
		// lock-step.
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, a.opts.RegisterBackoffMax)
		select {
		case <-ctx.Done():
			return 0, 0, false
		case <-time.After(wait):
		}
	}
}

// registered records a new registration: a new epoch, not fenced, and no
// confirmed lease until the first renewal of that epoch succeeds.
func (a *Agent) registered(resp *waldenv1.RegisterResponse, ttl time.Duration) {
	a.mu.Lock()
	changed := !a.st.registered || a.st.epoch != resp.GetEpoch()
	a.st.registered = true
	a.st.epoch = resp.GetEpoch()
	a.st.ttl = ttl
	a.st.recovered = resp.GetRecoveredWalOffset()
	a.st.fenced = false
	a.st.confirmedSent = time.Time{}
	l := a.leaseLocked(a.clock.Now())
	a.notifyLocked()
	a.mu.Unlock()
	a.log.Info("registered", "epoch", resp.GetEpoch(), "lease_ttl", ttl, "recovered_wal_offset", resp.GetRecoveredWalOffset())
	if ttl <= a.cfg.LeaseSafetyMargin {
		a.log.Error("lease_safety_margin is not less than the cluster's lease_ttl: the lease can never be valid",
			"lease_safety_margin", a.cfg.LeaseSafetyMargin, "lease_ttl", ttl)
	}
	if changed {
		select {
		case a.events <- l:
		default:
			a.log.Warn("epoch change hooks are behind; dropped one notification", "epoch", l.Epoch)
		}
	}
}

// renew renews the lease of epoch every ttl/3 until the cluster refuses the
// epoch (then it returns, so that loop registers again) or ctx ends.
func (a *Agent) renew(ctx context.Context, epoch uint64, ttl time.Duration) {
	req := &waldenv1.RenewLeaseRequest{BrokerId: a.cfg.BrokerID, Epoch: epoch}
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		interval := ttl / 3
		var resp *waldenv1.RenewLeaseResponse
		sent, err := a.coords.call(ctx, interval, a.clock.Now, func(ctx context.Context, cl waldenv1.AgentClient, opts ...grpc.CallOption) error {
			var err error
			resp, err = cl.RenewLease(ctx, req, opts...)
			return err
		})
		if ctx.Err() != nil {
			return
		}
		if err == nil && resp.GetEpoch() != 0 && resp.GetEpoch() != epoch {
			err = fmt.Errorf("agent: renewal answered epoch %d for epoch %d", resp.GetEpoch(), epoch)
			a.refused(epoch, reasonEpochExpired, err)
			return
		}
		if err == nil {
			if granted := time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond; granted > 0 {
				ttl = granted
			}
			a.confirm(epoch, sent, ttl)
			if failures > 0 {
				a.log.Info("lease renewed again", "epoch", epoch, "failed_attempts", failures)
			}
			failures = 0
			timer.Reset(max(0, ttl/3-a.clock.Now().Sub(sent)))
			continue
		}
		switch reason := refusalReason(err); reason {
		case reasonNodeFenced, reasonEpochExpired, reasonUnknownNode:
			a.refused(epoch, reason, err)
			return
		}
		failures++
		l := a.Lease()
		if failures == 1 || !l.Valid {
			a.log.Warn("lease renewal failed", "epoch", epoch, "valid", l.Valid, "remaining", l.Remaining, "err", err)
		}
		// Retry sooner than the renewal interval while the lease lasts.
		timer.Reset(max(ttl/12, time.Millisecond))
	}
}

// confirm extends the lease of epoch to sent + ttl - safety margin, if that
// is later than what it already was.
func (a *Agent) confirm(epoch uint64, sent time.Time, ttl time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.st.epoch != epoch || a.st.fenced {
		return
	}
	if a.st.confirmedSent.IsZero() || sent.After(a.st.confirmedSent) {
		a.st.confirmedSent = sent
		a.st.confirmedTTL = ttl
		a.st.ttl = ttl
		// Wake WaitRegistered: the lease may have been void until now.
		a.notifyLocked()
	}
}

// refused records that the cluster refused epoch: the lease is void at once.
// NODE_FENCED and EPOCH_EXPIRED mean a failover happened (fenced); an
// unknown broker only needs to register again.
func (a *Agent) refused(epoch uint64, reason string, err error) {
	a.mu.Lock()
	if a.st.epoch == epoch {
		a.st.confirmedSent = time.Time{}
		if reason != reasonUnknownNode {
			a.st.fenced = true
		}
		a.notifyLocked()
	}
	a.mu.Unlock()
	a.log.Warn("the cluster refused the broker's epoch; stop acknowledging writes and register again",
		"epoch", epoch, "reason", reason, "err", err)
}
