package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"walden/config"
	"walden/detect"
	"walden/fsm"
	"walden/gossip"
	"walden/lease"
	"walden/metrics"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// detector is the failure-detection side of one member: the gossip pool
// (optional), the observer (every member) and the decider (acts while this
// member leads), with the Agent and Brokers services over them.
type detector struct {
	d        *serviceDeps
	pool     *gossip.Pool // nil when gossip is off
	observer *detect.Observer
	decider  *detect.Decider
	agent    *agentService
	brokers  *brokersService
}

// leaseStateFile is the file in data_dir where a member keeps what it must
// remember of its lease grants across restarts (lease.Durable).
const leaseStateFile = "lease-state.json"

// detectorDeps is what newDetector wires together.
type detectorDeps struct {
	cfg   *config.Server
	admin *adminService
	node  *raftnode.Node
	state *fsm.State
	// adminAddr is the address agents reach this member at (gossip meta).
	adminAddr string
	// prober replaces the HTTP probes of the agents' /healthz (tests); nil
	// means HTTP probes.
	prober    detect.Prober
	decisions *metrics.Decisions
	logger    *slog.Logger
	// startIndex is the last index of the member's raft log when it
	// started (detect.ObserverConfig.StartIndex).
	startIndex uint64
}

// newDetector wires detection for a member: the grantor of its quorum
// leases, the gossip pool, the observer, the decider, and the Agent and
// Brokers services over them.
func newDetector(deps detectorDeps) (*detector, error) {
	cfg, state, logger := deps.cfg, deps.state, deps.logger
	// The quiet period after a start covers the longest lease this member
	// may have granted before: the stored high-water mark, or the policy
	// in force (the replicated one once known, else the config's).
	ttl, drift := time.Duration(cfg.Policy.LeaseTTL), time.Duration(cfg.Policy.DriftMargin)
	if p, _, seeded := state.Policy(); seeded {
		ttl = max(ttl, time.Duration(p.GetLeaseTtlMs())*time.Millisecond)
		drift = max(drift, time.Duration(p.GetDriftMarginMs())*time.Millisecond)
	}
	grantor, err := lease.NewGrantor(lease.BootClock, lease.FileStore{Path: filepath.Join(cfg.DataDir, leaseStateFile)}, ttl, drift)
	if err != nil {
		return nil, fmt.Errorf("server: data_dir %s refused: %w", cfg.DataDir, err)
	}
	d := &serviceDeps{
		admin: deps.admin, node: deps.node, state: state,
		grantor:        grantor,
		slots:          lease.NewSlots(cfg.Renewals.Slot),
		decisions:      deps.decisions,
		config:         cfg.Policy.Proto(),
		clusterName:    cfg.ClusterName,
		nodeID:         cfg.NodeID,
		logger:         logger.With("component", "detect"),
		proposeTimeout: 5 * time.Second,
		adminMaxConns:  cfg.Limits.Admin.MaxConns,
	}
	det := &detector{d: d, agent: &agentService{d: d, readings: lease.NewReadings(lease.BootClock)},
		brokers: &brokersService{d: d, liveMembers: deps.node.LiveMembers}}
	gcfg, on := cfg.GossipConfig()
	if on {
		gcfg.Logger = logger
		gcfg.Meta.AdminAddr = deps.adminAddr
		pool, err := gossip.Start(gcfg)
		if err != nil {
			return nil, fmt.Errorf("server: gossip: %w", err)
		}
		det.pool = pool
	}
	probeInterval, probeTimeout := cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout
	det.observer = detect.NewObserver(detect.ObserverConfig{
		NodeID: cfg.NodeID, ProbeInterval: probeInterval, ProbeTimeout: probeTimeout, Grantor: grantor, StartIndex: deps.startIndex,
		Logger: logger,
	}, sharedBrokers{state}, deps.node.Propose, deps.prober)
	det.decider = detect.NewDecider(detect.DeciderConfig{NodeID: cfg.NodeID, Seed: d.config, Logger: logger, Metrics: deps.decisions},
		deps.node, sharedBrokers{state}, deps.node.Propose)
	d.decider = det.decider
	logger.Info("lease grants wait out the longest lease this member may have granted before it started",
		"quiet_for", grantor.QuietFor().Round(time.Millisecond))
	return det, nil
}

// sharedBrokers gives the observer and the decider, which only read the
// registry, the copy the state shares until it changes
// (fsm.State.BrokersView) instead of a copy of their own each round.
type sharedBrokers struct{ *fsm.State }

func (s sharedBrokers) Brokers() []*waldenv1.Broker { return s.BrokersView() }

// run runs the observer, the decider and the gossip event consumer until
// ctx is done.
func (det *detector) run(ctx context.Context) {
	if det.pool != nil {
		go func() {
			for ev := range det.pool.Events() {
				if ev.Meta.Role != gossip.RoleAgent {
					continue
				}
				switch ev.Kind {
				case gossip.EventJoin, gossip.EventUpdate:
					det.observer.SetGossip(ev.Node, detect.GossipAlive)
				case gossip.EventLeave:
					st := detect.GossipDead
					if ev.State == gossip.StateLeft {
						st = detect.GossipLeft
					}
					det.observer.SetGossip(ev.Node, st)
				}
			}
		}()
	}
	go det.observer.Run(ctx)
	go det.decider.Run(ctx)
	go det.d.reportPolicyDrift(ctx)
	go det.d.warnAgentConnections(ctx, 30*time.Second)
}

// reportPolicyDrift says once, when the cluster's policy is known, on which
// keys this member's config file differs from it: the file seeds the policy
// only when the cluster is founded, so an edit made later has no effect.
func (d *serviceDeps) reportPolicyDrift(ctx context.Context) {
	for {
		changed := d.state.Changed()
		if _, _, seeded := d.state.Policy(); seeded {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
	seed := d.state.PolicyOverrides().GetSeed()
	drift := policy.Drift(d.config, seed)
	if d.driftKeys != nil {
		d.driftKeys.Set(float64(len(drift)))
	}
	if len(drift) == 0 {
		return
	}
	eff, _, _ := d.state.Policy()
	var diffs []string
	for _, k := range drift {
		diffs = append(diffs, fmt.Sprintf("%s: file %s, cluster %s", k, policy.Format(d.config, k), policy.Format(eff, k)))
	}
	d.logger.Warn("this member's config file differs from the cluster's policy, which it does not change: use `waldenctl policy set` to change the policy",
		"keys", drift, "differences", diffs, "seeded_by", d.state.PolicyOverrides().GetSeededBy())
}

// stop leaves the gossip pool.
func (det *detector) stop() {
	if det.pool != nil {
		_ = det.pool.Leave(time.Second)
		_ = det.pool.Shutdown()
	}
}

// agentConnectionsWarnEvery spaces the warnings of warnAgentConnections.
const agentConnectionsWarnEvery = 10 * time.Minute

// warnAgentConnections warns, every check interval while it holds and at
// most every agentConnectionsWarnEvery, when the registered brokers come
// within a tenth of limits.admin.max_conns: every broker's agent keeps a
// connection to every coordinator, and the agents beyond the bound wait
// in the accept queue, renewing with the other coordinators only.
func (d *serviceDeps) warnAgentConnections(ctx context.Context, every time.Duration) {
	if d.adminMaxConns <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := d.registeredBrokers()
		if n*10 < d.adminMaxConns*9 || (!warned.IsZero() && time.Since(warned) < agentConnectionsWarnEvery) {
			continue
		}
		warned = time.Now()
		d.logger.WarnContext(ctx, "the registered brokers come close to limits.admin.max_conns: every broker's agent keeps a connection to every coordinator, and agents beyond the bound cannot renew with this one; raise limits.admin.max_conns",
			"brokers", n, "limits.admin.max_conns", d.adminMaxConns)
	}
}

// registeredBrokers counts the brokers in the registry, from the copy the
// state shares when it offers one.
func (d *serviceDeps) registeredBrokers() int {
	if v, ok := d.state.(interface{ BrokersView() []*waldenv1.Broker }); ok {
		return len(v.BrokersView())
	}
	return len(d.state.Brokers())
}
