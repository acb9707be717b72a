package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"

	"walden/authz"
	"walden/config"
	"walden/connlimit"
	"walden/fieldlimit"
	"walden/filecheck"
	"walden/fsm"
	"walden/httplimit"
	"walden/metrics"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
	"walden/raftnode"
	"walden/reconcile"
	"walden/recovery"
	"walden/renewframe"
	"walden/version"
	"walden/webui"
)

// ErrNodeStopped is returned by Run when the raft node stopped on its own
// (a fatal storage fault, which the error wraps, or this member was removed
// from the cluster).
var ErrNodeStopped = errors.New("server: raft node stopped")

// stopGrace bounds how long Stop waits for in-flight requests.
const stopGrace = 3 * time.Second

// Server is one running coordinator member.
type Server struct {
	cfg    *config.Server
	logger *slog.Logger

	tls      *tlsSetup
	storage  *raftlog.DiskStorage
	node     *raftnode.Node
	admin    *adminService
	detector *detector
	metrics  *memberMetrics
	recovery *recovery.Runner
	// reconciler reconciles a cluster restored from a backup (leader).
	reconciler *reconcile.Reconciler
	health     *health.Server
	adminGRPC  *grpc.Server
	// frames serves the agents' framed renewal connections on the admin
	// listener (nil when renewals.frames is off).
	frames   *renewalFrames
	raftGRPC *grpc.Server
	httpSrv  *http.Server
	// metricsSrv serves /metrics, /healthz and /readyz in plain HTTP
	// (listen.metrics), nil when off.
	metricsSrv *http.Server

	adminLis, raftLis, httpLis, metricsLis net.Listener
	// listeners counts what the listeners' limits refused.
	listeners *connlimit.Metrics
	// state is the replicated state this member applies.
	state *fsm.State
	// quiet, set by a test, runs no loop that proposes on its own.
	quiet bool

	stopOnce sync.Once
}

// New validates cfg, binds the listeners, opens the raft storage in
// data_dir (refusing a foreign or damaged one), and starts the raft node.
// Nothing is served until Run. Nothing in data_dir is touched when cfg is
// invalid, a TLS file is unusable or a listen address is taken.
//
// It builds the member in this order, undoing what it built when a step
// fails: the TLS files, the listeners, the storage, the listeners' limits,
// the raft transport and node, then the admin API with failure detection
// and recovery, and the HTTP servers.
func New(cfg *config.Server, logger *slog.Logger, opts ...Option) (_ *Server, err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	a := &assembly{o: o, base: logger}
	logger = logger.With("node_id", cfg.NodeID)
	tlsCfg, err := serverTLS(cfg)
	if err != nil {
		return nil, err
	}

	s := &Server{cfg: cfg, logger: logger, tls: tlsCfg}
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()
	if err := s.bind(o.listeners); err != nil {
		return nil, err
	}
	if a.startIndex, err = s.openStorage(a.base); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = s.storage.Close()
		}
	}()
	a.reg = prometheus.NewRegistry()
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.NewCollector())
	if err := s.limitListeners(a); err != nil {
		return nil, err
	}
	// Every RPC is authorized from the peer's certificate (TLS on).
	a.az = &authz.Authorizer{Secure: tlsCfg.Enabled(), Logger: logger.With("component", "authz")}
	if err := s.startRaft(a); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.node.Stop()
		}
	}()
	failovers := &failoversService{state: s.state}
	if err := s.adminAPI(a, failovers); err != nil {
		return nil, err
	}
	s.httpServers(a, failovers)
	return s, nil
}

// assembly is what New's steps share while they build a member.
type assembly struct {
	o options
	// base is the logger without node_id (raftnode adds it itself).
	base *slog.Logger
	reg  *prometheus.Registry
	// lm bounds every listener: connections in all and per source
	// address, handshake time, calls per connection, keepalive pings.
	lm *connlimit.Metrics
	az *authz.Authorizer
	// startIndex is the last index the raft log held when the process
	// started: an epoch registered beyond it was granted only by this
	// process, so its attestation can say it never granted it.
	startIndex uint64
}

// serverTLS loads the tls section and checks that the member's certificate
// names it (raft frames from any other name are refused by its peers) and
// that gossip's key file is as private as its certificates.
func serverTLS(cfg *config.Server) (*tlsSetup, error) {
	tlsCfg, err := loadTLS(cfg.TLS)
	if err != nil {
		return nil, err
	}
	if err := mtls.CheckIdentity(cfg.TLS, authz.Identity{Name: cfg.NodeID, Role: authz.RoleCoordinator}); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if _, on := cfg.GossipConfig(); on {
		if err := mtls.CheckGossipKey(cfg.TLS, cfg.Gossip.EncryptionKeyFile); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	return tlsCfg, nil
}

// bind binds the listen addresses the caller did not hand over bound.
func (s *Server) bind(given Listeners) error {
	cfg := s.cfg
	s.adminLis, s.raftLis, s.httpLis, s.metricsLis = given.Admin, given.Raft, given.HTTP, given.Metrics
	for _, l := range []struct {
		key, addr string
		lis       *net.Listener
	}{
		{"listen.admin", cfg.Listen.Admin, &s.adminLis},
		{"listen.raft", cfg.Listen.Raft, &s.raftLis},
		{"listen.http", cfg.Listen.HTTP, &s.httpLis},
		{"listen.metrics", cfg.Listen.Metrics, &s.metricsLis},
	} {
		if *l.lis != nil || l.addr == "" {
			continue
		}
		var err error
		if *l.lis, err = net.Listen("tcp", l.addr); err != nil {
			return fmt.Errorf("server: %s: %w", l.key, err)
		}
	}
	return nil
}

// openStorage opens the raft storage in data_dir, which holds the
// cluster's state: its owner's only (raftlog creates it 0700). It returns
// the last index the log holds.
func (s *Server) openStorage(base *slog.Logger) (uint64, error) {
	cfg := s.cfg
	if err := filecheck.CheckPrivateDir(cfg.DataDir, "data_dir"); err != nil {
		return 0, fmt.Errorf("server: %w", err)
	}
	st, err := raftlog.Open(cfg.DataDir, cfg.ClusterName, cfg.NodeID, base.With("component", "storage"))
	if err != nil {
		return 0, fmt.Errorf("server: data_dir %s refused: %w", cfg.DataDir, err)
	}
	s.storage = st
	startIndex, err := st.LastIndex()
	if err != nil {
		_ = st.Close()
		s.storage = nil
		return 0, fmt.Errorf("server: data_dir %s refused: %w", cfg.DataDir, err)
	}
	return startIndex, nil
}

// limitListeners bounds the admin and raft listeners (the HTTP ones are
// bounded where their servers are made) and registers the limits' metrics.
func (s *Server) limitListeners(a *assembly) error {
	lm := connlimit.NewMetrics()
	if err := registerAllCollectors(a.reg, lm.Collectors()); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	a.lm, s.listeners = lm, lm
	lim := s.cfg.Limits
	s.adminLis = lm.Listener(s.adminLis, connlimit.Admin, lim.Admin.MaxConns, lim.Admin.MaxConnsPerSource)
	s.raftLis = lm.Listener(s.raftLis, connlimit.Raft, lim.Raft.MaxConns, lim.Raft.MaxConnsPerSource)
	return nil
}

// listenLog is the logger of the listeners' refusals.
func (s *Server) listenLog() *slog.Logger { return s.logger.With("component", "listener") }

// startRaft makes the raft transport and its gRPC server (raft frames are
// accepted from coordinators only, each as the member its certificate
// names), the state machine, and starts the raft node.
func (s *Server) startRaft(a *assembly) error {
	cfg, lim := s.cfg, s.cfg.Limits.Raft
	trMetrics, err := raftnode.NewTransportMetrics(a.reg)
	if err != nil {
		return fmt.Errorf("server: transport metrics: %w", err)
	}
	raftCreds := s.tls.ClientCreds()
	if a.o.raftCreds != nil {
		raftCreds = a.o.raftCreds(raftCreds)
	}
	tr := raftnode.NewGRPCTransport(raftnode.GRPCTransportConfig{
		ClusterName: cfg.ClusterName,
		NodeID:      cfg.NodeID,
		Version:     version.Get().Version,
		Creds:       raftCreds,
		Logger:      a.base,
		Metrics:     trMetrics,
		CheckSender: authz.CheckMember,
	})
	s.raftGRPC = grpc.NewServer(append(append(raftnode.ServerOptions(), a.lm.ServerOptions(connlimit.Raft, lim)...),
		grpc.Creds(a.lm.Creds(connlimit.Raft, s.tls.ServerCreds(), s.listenLog())),
		grpc.ChainUnaryInterceptor(a.az.UnaryInterceptor(), fieldlimit.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(a.az.StreamInterceptor(), fieldlimit.StreamInterceptor()))...)
	tr.Register(s.raftGRPC)

	state := fsm.New(cfg.ClusterName)
	s.state, s.quiet = state, a.o.quiet
	rc := raftConfig(cfg, a.base, a.reg)
	rc.VoterChangeWait = voterChangeWait(cfg, state)
	if s.node, err = raftnode.NewNode(rc, state, s.storage, tr); err != nil {
		return fmt.Errorf("server: start raft node: %w", err)
	}
	return nil
}

// adminAPI makes the admin gRPC server and registers its services: failure
// detection (gossip, observer, decider, the Agent and Brokers APIs), the
// member's metrics, recovery (job loops and executor) and the Catalog,
// Jobs, Maintenance, Failovers and Watch APIs.
func (s *Server) adminAPI(a *assembly, failovers *failoversService) error {
	cfg, state, logger := s.cfg, s.state, s.logger
	s.health = health.NewServer()
	s.admin = newAdminService(s.node, cfg.NodeID, s.tls.ClientCreds(), logger.With("component", "admin"))
	var err error
	if s.adminGRPC, err = newAdminGRPC(s.admin, s.health, s.adminCreds(a), a.az, a.reg,
		logger.With("component", "grpc"), a.lm.ServerOptions(connlimit.Admin, cfg.Limits.Admin)...); err != nil {
		return fmt.Errorf("server: admin grpc: %w", err)
	}
	if err := s.detection(a); err != nil {
		return err
	}
	// The series that explain failovers.
	if s.metrics, err = newMemberMetrics(a.reg, state, s.node.Ready); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	if err = registerClusterCollector(a.reg, cfg.NodeID, state, s.node, s.detector); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	s.admin.restore = state.RestoreState
	if s.recovery, s.reconciler, err = newRecoveryRunner(cfg, s.node, state, s.metrics.recovery, logger); err != nil {
		return err
	}
	waldenv1.RegisterCatalogServer(s.adminGRPC, newCatalogService(s.detector.d, state))
	waldenv1.RegisterJobsServer(s.adminGRPC, &jobsService{d: s.detector.d, state: state, liveMembers: s.node.LiveMembers})
	waldenv1.RegisterMaintenanceServer(s.adminGRPC, &maintenanceService{d: s.detector.d, state: state})
	waldenv1.RegisterFailoversServer(s.adminGRPC, failovers)
	waldenv1.RegisterWatchServer(s.adminGRPC, &watchService{d: s.detector.d, state: state, nodeID: cfg.NodeID})
	return nil
}

// adminCreds are the admin listener's credentials: TLS (or plain) with
// its failed handshakes counted, and, with renewals.frames on, the agents'
// framed renewal connections served beside gRPC (renewalFrames; under TLS
// the handshake offers renewframe.ALPN besides "h2").
func (s *Server) adminCreds(a *assembly) credentials.TransportCredentials {
	if !s.cfg.Renewals.Frames {
		return a.lm.Creds(connlimit.Admin, s.tls.ServerCreds(), s.listenLog())
	}
	s.frames = newRenewalFrames(a.az, s.cfg.Limits.Admin.MaxConnectionIdle, s.logger.With("component", "renewals"))
	inner := a.lm.Creds(connlimit.Admin, s.tls.ServerCredsWith(renewframe.ALPN), s.listenLog())
	return s.frames.creds(inner, s.tls.Enabled())
}

// detection makes failure detection (gossip, observer, decider) with its
// metrics, and registers the Agent and Brokers APIs.
func (s *Server) detection(a *assembly) error {
	decisions := metrics.NewDecisions()
	if err := registerAllCollectors(a.reg, decisions.Collectors()); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	var err error
	if s.detector, err = newDetector(detectorDeps{cfg: s.cfg, admin: s.admin, node: s.node, state: s.state,
		adminAddr: s.adminLis.Addr().String(), prober: a.o.prober, decisions: decisions, logger: s.logger, startIndex: a.startIndex}); err != nil {
		return err
	}
	driftKeys := prometheus.NewGauge(prometheus.GaugeOpts{Name: "walden_policy_config_drift_keys",
		Help: "Number of policy keys on which this member's config file differs from the cluster's replicated policy (the file seeds the policy only when the cluster is founded)."})
	if err := a.reg.Register(driftKeys); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	s.detector.d.driftKeys = driftKeys
	if err := a.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "walden_lease_renewal_clock_readings_total",
		Help: "Boot-clock readings this member took to grant streamed and framed renewals: the renewals granted at about the same time share one, taken after they all arrived."},
		func() float64 { return float64(s.detector.agent.readings.Taken()) })); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	if s.frames != nil {
		s.frames.agent = s.detector.agent
	}
	waldenv1.RegisterAgentServer(s.adminGRPC, s.detector.agent)
	waldenv1.RegisterBrokersServer(s.adminGRPC, s.detector.brokers)
	return nil
}

// httpServers makes the HTTP servers of listen.http (the web view, the
// metrics and the health checks; TLS when on) and listen.metrics (plain
// HTTP also with TLS on, for probes and scrapers: no web view). Both
// listeners are bounded (httplimit): header size and time, idle keep-alive
// time, connections open at once.
func (s *Server) httpServers(a *assembly, failovers *failoversService) {
	lim := s.cfg.Limits
	if s.httpLis != nil {
		s.httpLis = httplimit.ListenerWith(a.lm, "http", s.httpLis, lim.HTTP)
		if s.tls.Enabled() {
			s.httpLis = tls.NewListener(s.httpLis, s.tls.ServerConfig())
		}
		s.httpSrv = httplimit.Server(newHTTPHandler(a.reg, s.node, webui.Handler(webui.Options{
			Source:    &webSource{admin: s.admin, brokers: s.detector.brokers, failovers: failovers, state: s.state},
			Authorize: webAuthorize,
		})), lim.HTTP, slog.NewLogLogger(s.logger.With("component", "http").Handler(), slog.LevelWarn))
	}
	if s.metricsLis != nil {
		s.metricsLis = httplimit.ListenerWith(a.lm, "metrics", s.metricsLis, lim.Metrics)
		s.metricsSrv = httplimit.Server(newHTTPHandler(a.reg, s.node, nil), lim.Metrics,
			slog.NewLogLogger(s.logger.With("component", "metrics-http").Handler(), slog.LevelWarn))
	}
}

// raftConfig turns the server config into the node's.
func raftConfig(cfg *config.Server, logger *slog.Logger, reg prometheus.Registerer) raftnode.Config {
	rc := raftnode.DefaultConfig()
	rc.ClusterName = cfg.ClusterName
	rc.NodeID = cfg.NodeID
	rc.Version = version.Get().Version
	rc.DataDir = cfg.DataDir
	for _, m := range cfg.InitialCluster {
		if cfg.InitialClusterState == config.ClusterStateExisting && m.ID == cfg.NodeID {
			continue // a joining member must not bootstrap a cluster of its own
		}
		rc.InitialCluster = append(rc.InitialCluster, &waldenv1.MemberContext{Id: m.ID, RaftAddr: m.Raft, AdminAddr: m.Admin})
	}
	rc.TickInterval = cfg.Raft.TickInterval
	rc.ElectionTicks = cfg.Raft.ElectionTicks
	rc.HeartbeatTicks = cfg.Raft.HeartbeatTicks
	rc.SnapshotCount = cfg.Raft.SnapshotCount
	rc.SnapshotCatchUpEntries = cfg.Raft.SnapshotCatchUpEntries
	rc.Logger = logger
	rc.Registerer = reg
	// Older members read the deprecated strings beside the enums while the
	// cluster is upgraded (fsm.PrepareProposal).
	rc.PrepareProposal = fsm.PrepareProposal
	return rc
}

// voterChangeWait spaces voter changes by the cluster's lease horizon: the
// longest lease_ttl + drift_margin it ever used (fsm.State.LeaseHorizon),
// or this member's config file's while the policy is not seeded
// (docs/safety.md).
func voterChangeWait(cfg *config.Server, state *fsm.State) func() time.Duration {
	own := time.Duration(cfg.Policy.LeaseTTL) + time.Duration(cfg.Policy.DriftMargin)
	return func() time.Duration {
		ms, _ := state.LeaseHorizon()
		return max(own, time.Duration(ms)*time.Millisecond)
	}
}

// Addrs are the bound listen addresses (useful with port 0).
type Addrs struct{ Admin, Raft, HTTP, Metrics string }

// Addrs returns the addresses the server listens on.
func (s *Server) Addrs() Addrs {
	a := Addrs{Admin: s.adminLis.Addr().String(), Raft: s.raftLis.Addr().String()}
	if s.httpLis != nil {
		a.HTTP = s.httpLis.Addr().String()
	}
	if s.metricsLis != nil {
		a.Metrics = s.metricsLis.Addr().String()
	}
	return a
}

// Run serves until ctx is done, a listener fails or the raft node stops,
// then stops everything. It returns nil after ctx is done.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 4)
	go func() { errc <- wrapServe("raft", s.raftGRPC.Serve(s.raftLis)) }()
	go func() { errc <- wrapServe("admin", s.adminGRPC.Serve(s.adminLis)) }()
	if s.httpSrv != nil {
		go func() { errc <- wrapServe("http", s.httpSrv.Serve(s.httpLis)) }()
	}
	if s.metricsSrv != nil {
		go func() { errc <- wrapServe("metrics", s.metricsSrv.Serve(s.metricsLis)) }()
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go watchLeader(wctx, s.node, s.health, s.cfg.Raft.TickInterval, s.logger)
	recoveryDone := make(chan struct{})
	if s.quiet {
		close(recoveryDone)
	} else {
		s.detector.run(wctx)
		go newMaintenanceExpiry(s.detector.d).run(wctx, time.Second)
		go s.metrics.failovers.Run(wctx)
		go func() { defer close(recoveryDone); s.recovery.Run(wctx) }()
	}
	defer func() { cancel(); <-recoveryDone }() // the attempts stop with wctx
	go s.reconciler.Run(wctx)
	s.logger.Info("walden server serving", "cluster_name", s.cfg.ClusterName,
		"admin", s.adminLis.Addr().String(), "raft", s.raftLis.Addr().String(), "http", s.cfg.Listen.HTTP,
		"metrics", s.cfg.Listen.Metrics, "tls", s.cfg.TLS.Enabled(), "insecure", s.cfg.Insecure, "data_dir", s.cfg.DataDir)

	var err error
	select {
	case <-ctx.Done():
		s.logger.Info("walden server stopping", "reason", context.Cause(ctx))
	case <-s.node.Done():
		err = ErrNodeStopped
		if cause := s.node.Err(); cause != nil {
			err = fmt.Errorf("%w: %w", ErrNodeStopped, cause)
		}
		s.logger.Error("raft node stopped; shutting down", "term", s.node.Status().Term, "err", err)
	case err = <-errc:
		s.logger.Error("listener failed; shutting down", "err", err)
	}
	s.Stop()
	return err
}

func wrapServe(name string, err error) error {
	if err == nil || errors.Is(err, grpc.ErrServerStopped) || errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("server: %s listener closed", name)
	}
	return fmt.Errorf("server: serve %s: %w", name, err)
}

// Stop stops serving, stops the raft node and closes the storage. It is
// idempotent.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.health.Shutdown()
		s.handOffLeadership()
		if s.frames != nil {
			s.frames.close() // the admin server's stop waits for their goroutines
		}
		done := make(chan struct{})
		go func() {
			s.adminGRPC.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(stopGrace):
			s.adminGRPC.Stop()
		}
		for _, h := range []*http.Server{s.httpSrv, s.metricsSrv} {
			if h != nil {
				ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
				_ = h.Shutdown(ctx)
				cancel()
			}
		}
		s.detector.stop()
		s.admin.close()
		s.node.Stop()
		s.raftGRPC.Stop()
		if err := s.storage.Close(); err != nil {
			s.logger.Warn("close storage", "err", err)
		}
		s.logger.Info("walden server stopped")
	})
}

func (s *Server) closeListeners() {
	for _, l := range []net.Listener{s.adminLis, s.raftLis, s.httpLis, s.metricsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
}
