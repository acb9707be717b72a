package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"

	"walden/authz"
	"walden/config"
	"walden/connlimit"
	"walden/coordclient"
	"walden/gossip"
	"walden/httplimit"
	"walden/lease"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// Options are the parts of an Agent that are not configuration.
type Options struct {
	// Logger receives the agent's structured log; nil discards it.
	Logger *slog.Logger
	// Clock is the clock of the lease; nil means lease.BootClock, which
	// keeps running while the host is suspended (a lease that looks valid
	// after a resume would be a lie: the cluster's clocks ran on).
	Clock lease.Clock
	// DialOptions are added to the options of the gRPC connections to the
	// coordinators (after the transport credentials from the tls keys).
	DialOptions []grpc.DialOption
	// Dial, when set, opens the TCP connections that renewals travel over
	// on their own (renewals.transport auto or frames; the gRPC
	// connections follow DialOptions). Default: a plain TCP dial.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// TLS, when set, returns the client side of mutual TLS for each new
	// connection that renewals travel over on their own: a process that
	// reads its certificates again (SIGHUP) passes the current ones, as its
	// DialOptions do for the gRPC connections. Default: the tls files as
	// read by New.
	TLS func() *tls.Config
	// RegisterBackoffMax bounds the wait between registration attempts.
	// Default 2s.
	RegisterBackoffMax time.Duration
	// CallIdleTimeout is how long a gRPC connection to a coordinator stays
	// open with no call or stream on it before it closes (the next call
	// opens another). Default DefaultCallIdleTimeout.
	CallIdleTimeout time.Duration
	// Metrics, when set, is served at GET /metrics on the agent's local
	// endpoint (the process's Prometheus registry).
	Metrics http.Handler
	// HTTPLimits bound the local HTTP endpoint; zero means the
	// configuration's limits.http (DefaultHTTPLimits when it has none).
	HTTPLimits httplimit.Limits
	// ListenerMetrics, when set, counts what the endpoint's limits
	// refused (listener "agent_http").
	ListenerMetrics *connlimit.Metrics
	// ObserveRenewal, when set, is told the outcome of every renewal with
	// one coordinator: "granted", "refused" (the coordinator answered with a
	// refusal) or "failed" (no answer in time). It must not block.
	ObserveRenewal func(result string)
	// BrokerObserver, when set, is told what the supervision of a watched
	// broker does (its state, the watchdog's kills, failed checks).
	BrokerObserver BrokerObserver
	// WatchdogCommand is the command line of the watchdog process, which
	// must run RunWatchdog; default: the running executable with the
	// arguments "agent watchdog" (walden's hidden command).
	WatchdogCommand []string
	// BrokerStdout and BrokerStderr receive the output of a broker the
	// agent starts; default the agent's own.
	BrokerStdout, BrokerStderr *os.File
}

// DefaultCallIdleTimeout is how long a gRPC connection of the agent to a
// coordinator stays open with no call or stream on it. The one a
// registration goes over carries a call once an epoch (its retries come at
// most RegisterBackoffMax apart) and nothing more until the broker is
// failed over: the renewals travel on connections of their own. Left open
// for gRPC's default of 30 minutes, it holds on each coordinator that
// answered it a server transport (three goroutines and HTTP/2 buffers per
// broker, a third of a coordinator's goroutines at 1,000 brokers); closed,
// it costs the next registration one TCP and TLS handshake. The gRPC
// connections renewals fall back to (renewals.transport stream or call, or
// a coordinator that serves no frames) stay open while they carry them, as
// an open stream is never idle and one call each comes every third of
// lease_ttl (a reconnection each when that is longer than this), and close
// once the renewals have gone back to frames.
const DefaultCallIdleTimeout = 30 * time.Second

// DefaultHTTPLimits bound the agent's HTTP endpoint (httplimit.AgentDefaults:
// its clients are one broker and the coordinators' probes).
var DefaultHTTPLimits = httplimit.AgentDefaults()

// Lease is the broker's lease as the agent knows it at one instant.
type Lease struct {
	// BrokerID is the broker the lease belongs to.
	BrokerID string
	// Epoch is the broker's fencing token (0 before the first registration).
	// It changes when the broker registers again after being fenced: every
	// request of the broker must carry the current one.
	Epoch uint64
	// Valid says the broker may acknowledge writes with Epoch now: a
	// majority of the voting coordinators granted the lease less than
	// lease_ttl - safety_margin ago, each measured from when the renewal it
	// granted was sent.
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
	// holder has the coordinators' grants of the current epoch.
	holder  *lease.Holder
	fenced  bool
	stopped bool
	// valid is the validity last logged (transitions are logged).
	valid bool
	// failureTimeout is the cluster's failure_timeout, as the last
	// registration answered it (0: not said).
	failureTimeout time.Duration
}

// Agent holds one broker's registration and lease. Its methods are safe for
// concurrent use.
type Agent struct {
	cfg    *config.Agent
	log    *slog.Logger
	clock  lease.Clock
	coords *coordinators
	// conns are the direct connections to each coordinator the lease is
	// renewed with, by admin address.
	conns *coordclient.Conns
	// tls returns the client side of mutual TLS with the coordinators
	// (nil: off) for each connection renewals travel over on their own.
	tls  func() *tls.Config
	opts Options

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

	// sup watches the broker (nil when the configuration has no broker
	// section).
	sup *supervisor
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
		opts.Clock = lease.BootClock
	} else if cfg.Watchdog.Enabled {
		// The watchdog process reads the boot clock: the deadlines it is
		// given must be readings of it.
		return nil, fmt.Errorf("%w: watchdog.enabled needs the boot clock (Options.Clock must be unset)", ErrInvalidConfig)
	}
	if opts.RegisterBackoffMax <= 0 {
		opts.RegisterBackoffMax = 2 * time.Second
	}
	if opts.CallIdleTimeout <= 0 {
		opts.CallIdleTimeout = DefaultCallIdleTimeout
	}
	tlsConfigs, err := mtls.Load(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	creds := mtls.Creds(tlsConfigs.Client)
	if err := mtls.CheckGossipKey(cfg.TLS, cfg.Gossip.EncryptionKeyFile); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	// The coordinators let an agent act for the broker its certificate names.
	if err := mtls.CheckIdentity(cfg.TLS, authz.Identity{Role: authz.RoleAgent, BrokerID: cfg.BrokerID}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	log := opts.Logger.With("broker_id", cfg.BrokerID)
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
		// A fixed window: the answers are a few bytes, and grpc's estimate
		// of the bandwidth-delay product would cost a ping and its answer
		// after each of them.
		grpc.WithInitialWindowSize(renewalWindow), grpc.WithInitialConnWindowSize(renewalWindow),
		// The registration's connection closes once used (renewals go on
		// connections of their own): see DefaultCallIdleTimeout.
		grpc.WithIdleTimeout(opts.CallIdleTimeout)}, opts.DialOptions...)
	if len(opts.WatchdogCommand) == 0 {
		opts.WatchdogCommand = defaultWatchdogCommand()
	}
	if opts.BrokerStdout == nil {
		opts.BrokerStdout = os.Stdout
	}
	if opts.BrokerStderr == nil {
		opts.BrokerStderr = os.Stderr
	}
	a := &Agent{
		cfg:     cfg,
		log:     log,
		clock:   opts.Clock,
		coords:  newCoordinators(cfg.Coordinators, dial, log),
		conns:   coordclient.NewConns(dial...),
		tls:     renewalTLS(opts.TLS, tlsConfigs.Client),
		opts:    opts,
		st:      state{holder: lease.NewHolder(cfg.LeaseSafetyMargin)},
		changed: make(chan struct{}),
		events:  make(chan Lease, 64),
	}
	if cfg.Broker.Watched() || cfg.Watchdog.Enabled {
		a.sup = newSupervisor(a)
	}
	return a, nil
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
		lim = a.cfg.Limits.HTTP
	}
	if lim == (httplimit.Limits{}) {
		lim = DefaultHTTPLimits
	}
	ln = httplimit.ListenerWith(a.opts.ListenerMetrics, "agent_http", ln, lim)
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
	if a.sup != nil {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.sup.run(ctx)
		}()
	}
	if a.cfg.Automq.Configured() && !a.cfg.Watchdog.Enabled {
		a.log.Warn("the AutoMQ broker acknowledges writes without asking for its lease and the watchdog is off: only the coordinators' machine or volume fencing protects its WAL (automq.external_fencing)")
	}
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
	if a.sup != nil && a.cancel != nil {
		// The broker stops first, while its lease is still renewed: a
		// broker that does not check its lease must not outlive it.
		a.sup.stop(graceful)
	}
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
	a.conns.Close()
	a.log.Info("agent stopped", "graceful", graceful)
	return errors.Join(errs...)
}

func (a *Agent) markStopped() {
	a.mu.Lock()
	a.st.stopped = true
	a.notifyLocked()
	a.mu.Unlock()
	a.leaseChanged()
}

// leaseChanged tells the broker's supervision that the lease may have
// changed (the watchdog's deadline follows it).
func (a *Agent) leaseChanged() {
	if a.sup != nil {
		a.sup.leaseChanged()
	}
}

// brokerDown voids the lease of epoch at once: the broker died, the agent
// renews it no more.
func (a *Agent) brokerDown(epoch uint64) {
	a.mu.Lock()
	if a.st.epoch == epoch {
		a.st.holder.Revoke()
		a.notifyLocked()
	}
	a.mu.Unlock()
	a.leaseChanged()
	a.noteValidity()
}

// Broker returns the watched broker's status (State BrokerNotWatched when
// the configuration has no broker section).
func (a *Agent) Broker() BrokerStatus {
	if a.sup == nil {
		return BrokerStatus{State: BrokerNotWatched}
	}
	return a.sup.status()
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
func (a *Agent) leaseLocked(now time.Duration) Lease {
	l := Lease{BrokerID: a.cfg.BrokerID, Epoch: a.st.epoch, Fenced: a.st.fenced}
	if !a.st.registered || a.st.fenced || a.st.stopped {
		return l
	}
	l.Valid, l.Remaining = a.st.holder.Valid(now)
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
		// A broker that died is registered again only once the cluster
		// could fail it over (the supervisor opens the gate).
		if a.sup != nil && !a.sup.waitGate(ctx) {
			return
		}
		epoch, ttl, ok := a.register(ctx)
		if !ok {
			if ctx.Err() == nil {
				continue // the gate closed meanwhile
			}
			return
		}
		rctx := ctx
		if a.sup != nil {
			rctx = a.sup.renewing(ctx)
		}
		a.renew(rctx, epoch, ttl)
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
		Automq:      a.automqNode(),
	}
	waitingLogged := false
	for attempt := 1; ; attempt++ {
		if a.sup != nil && !a.sup.gateIsOpen() {
			return 0, 0, false
		}
		var resp *waldenv1.RegisterResponse
		err := a.coords.call(ctx, 2*time.Second, func(ctx context.Context, cl waldenv1.AgentClient, opts ...grpc.CallOption) error {
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
		} else if reason := refusalReason(err); reason == reasonRecoveryRunning || reason == reasonRestoreReconciling {
			if !waitingLogged {
				what := "a recovery job for it is running"
				if reason == reasonRestoreReconciling {
					what = "the cluster, restored from a backup, reconciles its catalog"
				}
				a.log.Info("registration waits while "+what, "err", err)
				waitingLogged = true
			}
		} else {
			lvl := slog.LevelDebug
			if attempt%10 == 1 { // the first failure, then about every 20s
				lvl = slog.LevelWarn
			}
			a.log.Log(ctx, lvl, "registration failed; retrying", "attempt", attempt, "err", err)
		}
		// From 50ms, doubling, jittered: many agents do not register in
		// lock-step.
		wait := Backoff(attempt, 50*time.Millisecond, a.opts.RegisterBackoffMax)
		select {
		case <-ctx.Done():
			return 0, 0, false
		case <-time.After(wait):
		}
	}
}

// registered records a new registration: a new epoch, not fenced, and no
// valid lease until a majority of the coordinators granted it.
func (a *Agent) registered(resp *waldenv1.RegisterResponse, ttl time.Duration) {
	a.mu.Lock()
	changed := !a.st.registered || a.st.epoch != resp.GetEpoch()
	a.st.registered = true
	a.st.epoch = resp.GetEpoch()
	a.st.ttl = ttl
	a.st.recovered = resp.GetRecoveredWalOffset()
	a.st.failureTimeout = time.Duration(resp.GetFailureTimeoutMs()) * time.Millisecond
	a.st.fenced = false
	a.st.holder.SetEpoch(resp.GetEpoch())
	a.st.holder.Revoke()
	l := a.leaseLocked(a.clock.Now())
	a.notifyLocked()
	a.mu.Unlock()
	a.leaseChanged()
	a.log.Info("registered", "epoch", resp.GetEpoch(), "lease_ttl", ttl, "recovered_wal_offset", resp.GetRecoveredWalOffset())
	if w := a.cfg.Watchdog; w.Enabled && ttl <= a.cfg.LeaseSafetyMargin+w.KillMargin {
		a.log.Error("lease_safety_margin + watchdog.kill_margin is not less than the cluster's lease_ttl: the broker can never run",
			"lease_safety_margin", a.cfg.LeaseSafetyMargin, "kill_margin", w.KillMargin, "lease_ttl", ttl)
	}
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

// renew renews the lease of epoch with every coordinator in parallel — the
// configured ones and every voter a coordinator names — until one of them
// refuses the epoch for good (then it returns, so that loop registers
// again) or ctx ends. Each coordinator is renewed on its own: a slow or
// unreachable one costs only its own grant.
func (a *Agent) renew(ctx context.Context, epoch uint64, ttl time.Duration) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	refused := make(chan refusalOf, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	started := map[string]bool{}
	discovered := make(chan []string, 1)
	start := func(addr string) {
		if started[addr] {
			return
		}
		started[addr] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.renewWith(ctx, addr, epoch, ttl, refused, discovered)
		}()
	}
	for _, addr := range a.cfg.Coordinators {
		start(addr)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case addrs := <-discovered:
			for _, addr := range addrs {
				start(addr)
			}
		case r := <-refused:
			cancel()
			a.refused(epoch, r.reason, r.err)
			return
		}
	}
}

type refusalOf struct {
	reason refusal.Reason
	err    error
}

// renewWith renews the lease of epoch with the coordinator at addr every
// third of the granted TTL, or sooner on the coordinator's renewal slot
// (lease.NextRenewal). An attempt is bounded by a sixth of it. After a
// failure it tries again, for as long as it takes, after RenewalBackoff:
// the first retry within a twelfth of the TTL, each next wait twice as long
// up to a third (the renewal interval), jittered, until a grant; a
// coordinator that refuses because it restarted less than a lease ago, and
// says when it grants again, is asked again then (QuietRetry). The lease
// rests on a majority, so no single coordinator's trouble needs more; and
// a fleet behind an overloaded coordinator then sends it about its normal
// load, not four times it, and not in lock-step.
//
// This keeps the ordinary case as it was: a renewal sent at ttl/3 that is
// lost gives up at ttl/2, and its first retry is sent by 7ttl/12 (no later
// than with a fixed retry every twelfth) and answered by 3ttl/4 at the
// latest, while the grant of the renewal before it counts until
// ttl - lease_safety_margin at the agent (2.5s of 3s by default) and the
// coordinator's until ttl after it got it: one lost renewal costs nothing.
func (a *Agent) renewWith(ctx context.Context, addr string, epoch uint64, ttl time.Duration, refused chan<- refusalOf, discovered chan<- []string) {
	req := &waldenv1.RenewLeaseRequest{BrokerId: a.cfg.BrokerID, Epoch: epoch}
	log := a.log.With("coordinator", addr)
	r := NewRenewer(RenewerOptions{Conn: func() (*grpc.ClientConn, error) { return a.conns.Get(addr) },
		Addr: addr, TLS: a.tls, Dial: a.opts.Dial, Transport: a.cfg.Renewals.Transport, Log: log})
	defer r.Close()
	failures := 0
	var coordinator string
	for {
		perTry := max(ttl/6, 50*time.Millisecond)
		sent := a.clock.Now()
		resp, err := r.Renew(ctx, req, perTry)
		if ctx.Err() != nil {
			return
		}
		var wait time.Duration
		a.observeRenewal(err)
		switch reason := refusalReason(err); {
		case err == nil:
			if granted := time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond; granted > 0 {
				ttl = granted
			}
			coordinator = resp.GetCoordinatorId()
			a.granted(lease.Grant{Coordinator: coordinator, Epoch: epoch, Sent: sent, TTL: ttl}, resp, discovered)
			if failures > 0 {
				log.Info("lease renewed by this coordinator again", "epoch", epoch, "coordinator_id", coordinator, "failed_attempts", failures)
			}
			failures = 0
			wait = lease.NextRenewal(ttl, a.clock.Now()-sent, time.Duration(resp.GetRenewInUs())*time.Microsecond)
		case reason == reasonNodeFenced || reason == reasonEpochExpired || reason == reasonUnknownNode:
			select {
			case refused <- refusalOf{reason: reason, err: err}:
			default:
			}
			return
		default:
			failures++
			if coordinator != "" && (reason == reasonLeaseAttested || reason == reasonFailoverRequested) {
				a.lost(coordinator)
			}
			l := a.Lease()
			lvl := slog.LevelDebug
			if failures == 1 || !l.Valid {
				lvl = slog.LevelWarn
			}
			wait = RenewalBackoff(failures, ttl)
			if q, ok := QuietRetry(err, ttl); ok {
				wait = q
			}
			log.Log(ctx, lvl, "lease renewal failed", "epoch", epoch, "coordinator_id", coordinator, "attempt", failures,
				"valid", l.Valid, "remaining", l.Remaining, "next_attempt_in", wait, "err", err)
		}
		a.noteValidity()
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Millisecond)):
		}
	}
}

// observeRenewal reports a renewal's outcome to Options.ObserveRenewal.
func (a *Agent) observeRenewal(err error) {
	if a.opts.ObserveRenewal == nil {
		return
	}
	switch {
	case err == nil:
		a.opts.ObserveRenewal("granted")
	case refusalReason(err) != "":
		a.opts.ObserveRenewal("refused")
	default:
		a.opts.ObserveRenewal("failed")
	}
}

// granted records a coordinator's grant and the voters it named, and
// reports the voters' addresses to renew with.
func (a *Agent) granted(g lease.Grant, resp *waldenv1.RenewLeaseResponse, discovered chan<- []string) {
	v := lease.Voters{Index: resp.GetConfIndex()}
	var addrs []string
	for _, m := range resp.GetVoters() {
		v.IDs = append(v.IDs, m.GetId())
		v.Incarnations = append(v.Incarnations, m.GetIncarnation())
		if m.GetAdminAddr() != "" {
			addrs = append(addrs, m.GetAdminAddr())
		}
	}
	a.mu.Lock()
	if a.st.epoch == g.Epoch && !a.st.fenced {
		was := a.leaseLocked(a.clock.Now()).Valid
		a.st.holder.Granted(g, v)
		a.st.ttl = g.TTL
		if !was && a.leaseLocked(a.clock.Now()).Valid {
			// Wake WaitRegistered: the lease may have been void until now.
			a.notifyLocked()
		}
	}
	a.mu.Unlock()
	a.leaseChanged()
	if len(addrs) > 0 {
		select {
		case discovered <- addrs:
		default:
		}
	}
}

// lost drops a coordinator's grant: it refused to renew.
func (a *Agent) lost(coordinator string) {
	a.mu.Lock()
	a.st.holder.Lost(coordinator)
	a.mu.Unlock()
	a.leaseChanged()
}

// noteValidity logs every change of the lease's validity, with what each
// voter's grant has left.
func (a *Agent) noteValidity() {
	a.mu.Lock()
	now := a.clock.Now()
	l := a.leaseLocked(now)
	changed := l.Valid != a.st.valid
	a.st.valid = l.Valid
	live := a.st.holder.Live(now)
	a.mu.Unlock()
	if !changed {
		return
	}
	if l.Valid {
		a.log.Info("lease valid: a majority of the coordinators granted it", "epoch", l.Epoch, "remaining", l.Remaining, "grants", live)
	} else {
		a.log.Warn("lease not valid: fewer than a majority of the coordinators' grants are live; the broker must not acknowledge writes",
			"epoch", l.Epoch, "grants", live)
	}
}

// refused records that the cluster refused epoch: the lease is void at once.
// NODE_FENCED and EPOCH_EXPIRED mean a failover happened (fenced); an
// unknown broker only needs to register again.
func (a *Agent) refused(epoch uint64, reason refusal.Reason, err error) {
	a.mu.Lock()
	if a.st.epoch == epoch {
		a.st.holder.Revoke()
		if reason != reasonUnknownNode {
			a.st.fenced = true
		}
		a.notifyLocked()
	}
	a.mu.Unlock()
	a.leaseChanged()
	a.log.Warn("the cluster refused the broker's epoch; stop acknowledging writes and register again",
		"epoch", epoch, "reason", reason, "err", err)
}

// renewalTLS is what the renewals' own connections read their TLS
// configuration from: current when set, else the one read at start (nil:
// TLS is off).
func renewalTLS(current func() *tls.Config, atStart *tls.Config) func() *tls.Config {
	if current != nil {
		return current
	}
	if atStart == nil {
		return nil
	}
	return func() *tls.Config { return atStart }
}
