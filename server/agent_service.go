package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/config"
	"walden/detect"
	"walden/fsm"
	"walden/gossip"
	"walden/lease"
	"walden/metrics"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// brokerState is what the Agent and Brokers services read from the
// replicated state (*fsm.State).
type brokerState interface {
	Broker(id string) (*waldenv1.Broker, bool)
	Brokers() []*waldenv1.Broker
	CheckBroker(brokerID string, epoch uint64, fo *waldenv1.FailoverContext) error
	Events(brokerID string, limit int) []*waldenv1.Event
	PolicyOverrides() *waldenv1.PolicyOverrides
	// Policy is the cluster's effective policy and whether it is seeded.
	Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool)
	// Voters are the voting members' ids; ConfIndex the index of their
	// configuration.
	Voters() []string
	ConfIndex() uint64
	Members() []*waldenv1.Member
	// Changed is closed at the next apply that changes anything.
	Changed() <-chan struct{}
	// Renewal is the read a lease grant makes (detect.Grant).
	Renewal(broker string, epoch uint64) (fsm.Renewal, error)
}

// proposer replicates a command (raftnode.Node.Propose).
type proposer interface {
	Propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error)
}

// detection holds what the Agent and Brokers services share with the
// failure detector: the replicated state, this member's side of the quorum
// leases, the config policy and the forwarding helpers of the admin service.
type detection struct {
	admin   *adminService
	node    ClusterNode
	prop    proposer
	state   brokerState
	grantor *lease.Grantor
	// decider is this member's decision loop (its holds, while it leads).
	decider *detect.Decider
	// decisions counts the lease renewals answered (and the decider's
	// decisions); nil counts nothing.
	decisions *metrics.Decisions
	config    *waldenv1.Policy // the policy: section of this member's config
	// driftKeys is the number of keys on which config differs from the
	// cluster's policy (walden_policy_config_drift_keys).
	driftKeys   prometheus.Gauge
	clusterName string
	nodeID      string
	logger      *slog.Logger
	// proposeTimeout bounds a proposal made for an API call without a
	// deadline of its own.
	proposeTimeout time.Duration
}

// policy returns the cluster's effective policy (replicated: the same on
// every member that applied the same entries).
func (d *detection) policy() *waldenv1.Policy {
	p, _, _ := d.state.Policy()
	return p
}

// activeJobs counts pending and running recovery jobs when the state
// machine tracks them.
func activeJobs(s any) int {
	if j, ok := s.(interface{ ActiveJobs() int }); ok {
		return j.ActiveJobs()
	}
	return 0
}

// isLeader reports whether this member leads, with its status.
func (d *detection) isLeader() (bool, NodeStatus) {
	st := d.node.Status()
	return st.LeaderID != "" && st.LeaderID == st.NodeID, st
}

// forwarded reports whether the incoming call was forwarded by a member.
func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(headerForwardedBy)) > 0
}

// leaderConn returns a connection to the leader's admin address, or the
// not-leader answer when the call was already forwarded or the leader is
// unknown.
func (d *detection) leaderConn(ctx context.Context, st NodeStatus) (*grpc.ClientConn, context.Context, error) {
	if st.LeaderID == "" {
		return nil, nil, status.Error(codes.Unavailable, "no leader")
	}
	addr := adminAddrOf(st, st.LeaderID)
	if forwarded(ctx) || addr == "" {
		return nil, nil, d.admin.notLeader(ctx, st.LeaderID, addr)
	}
	conn, err := d.admin.conn(addr)
	if err != nil {
		return nil, nil, d.admin.notLeader(ctx, st.LeaderID, addr)
	}
	return conn, metadata.AppendToOutgoingContext(ctx, headerForwardedBy, d.nodeID), nil
}

// forwardErr turns the error of a forwarded call into our answer: a leader
// that could not be reached becomes the not-leader hint.
func (d *detection) forwardErr(ctx context.Context, st NodeStatus, err error) error {
	s, _ := status.FromError(err)
	if s.Code() == codes.Unavailable && !hasLeaderHint(s) {
		d.logger.DebugContext(ctx, "forward to leader failed", "leader_id", st.LeaderID, "term", st.Term, "err", err)
		return d.admin.notLeader(ctx, st.LeaderID, adminAddrOf(st, st.LeaderID))
	}
	if s.Code() == codes.Unavailable {
		copyLeaderHint(ctx, s)
	}
	return err
}

// forwardToLeader calls the leader with call, or answers not-leader.
func forwardToLeader[T any](ctx context.Context, d *detection, st NodeStatus, call func(ctx context.Context, conn *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	conn, fctx, err := d.leaderConn(ctx, st)
	if err != nil {
		return zero, err
	}
	resp, err := call(fctx, conn)
	if err != nil {
		return zero, d.forwardErr(ctx, st, err)
	}
	return resp, nil
}

// conn returns a cached client connection to a member's admin address.
func (a *adminService) conn(addr string) (*grpc.ClientConn, error) {
	c, err := a.conns.Get(addr)
	if err != nil {
		return nil, fmt.Errorf("server: dial %s: %w", addr, err)
	}
	return c, nil
}

// stateErr maps an error of a proposal or a state check: a fencing refusal
// keeps its reason (FailedPrecondition / NotFound with ErrorInfo), anything
// else goes through the admin mapping.
func (d *detection) stateErr(ctx context.Context, err error) error {
	if refusal.Of(err) != "" {
		return rpcerr.Status(err).Err()
	}
	return d.admin.toStatus(ctx, err)
}

func (d *detection) propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.proposeTimeout)
		defer cancel()
	}
	return d.prop.Propose(ctx, cmd)
}

// agentService implements walden.v1.Agent: brokers' agents register and
// renew their leases with the leader; a follower forwards both.
type agentService struct {
	waldenv1.UnimplementedAgentServer
	d *detection
}

func (s *agentService) Register(ctx context.Context, req *waldenv1.RegisterRequest) (*waldenv1.RegisterResponse, error) {
	d := s.d
	if req.GetClusterName() != d.clusterName {
		return nil, invalidArg("cluster_name", fmt.Sprintf("%q is not this cluster (%q)", req.GetClusterName(), d.clusterName))
	}
	if err := checkBrokerID("broker_id", req.GetBrokerId()); err != nil {
		return nil, err
	}
	if err := checkAddr("agent_addr", req.GetAgentAddr()); err != nil {
		return nil, err
	}
	if req.GetBrokerAddr() != "" {
		if err := checkAddr("broker_addr", req.GetBrokerAddr()); err != nil {
			return nil, err
		}
	}
	leader, st := d.isLeader()
	if !leader {
		return forwardToLeader(ctx, d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.RegisterResponse, error) {
			return waldenv1.NewAgentClient(c).Register(ctx, req)
		})
	}
	res, err := d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_RegisterBroker{RegisterBroker: &waldenv1.RegisterBroker{
		BrokerId: req.GetBrokerId(), AgentAddr: req.GetAgentAddr(), BrokerAddr: req.GetBrokerAddr(),
		Wal: req.GetWal(), GossipName: req.GetGossipName(), Actor: authz.Actor(ctx),
	}}})
	if err != nil {
		// The agent retries while its broker's recovery runs: routine.
		lvl := slog.LevelInfo
		if errors.Is(err, refusal.ErrRecoveryRunning) {
			lvl = slog.LevelDebug
		}
		d.logger.Log(ctx, lvl, "register refused", "broker_id", req.GetBrokerId(), "term", st.Term, "err", err)
		return nil, d.stateErr(ctx, err)
	}
	r := res.GetRegisterBroker()
	p := d.policy()
	d.logger.InfoContext(ctx, "broker registered", "broker_id", req.GetBrokerId(), "epoch", r.GetEpoch(), "term", st.Term,
		"agent_addr", req.GetAgentAddr(), "recovered_wal_offset", r.GetRecoveredWalOffset())
	return &waldenv1.RegisterResponse{
		BrokerId: req.GetBrokerId(), Epoch: r.GetEpoch(), LeaseTtlMs: p.GetLeaseTtlMs(),
		RecoveredWalOffset: r.GetRecoveredWalOffset(),
	}, nil
}

// RenewLease grants this member's part of the broker's quorum lease, from
// its own boot clock and its applied state, without asking the leader: the
// agent renews with every voter and holds a valid lease while a majority of
// their grants are live (docs/safety.md). A member grants only a broker's
// current, unfenced epoch, while it is a voter, once the cluster's policy is
// seeded, not in the quiet period after its start, and never an epoch whose
// failover was requested or that it attested expired.
func (s *agentService) RenewLease(ctx context.Context, req *waldenv1.RenewLeaseRequest) (_ *waldenv1.RenewLeaseResponse, err error) {
	d := s.d
	defer func() { countRenewal(d.decisions, err) }()
	if err := checkBrokerID("broker_id", req.GetBrokerId()); err != nil {
		return nil, err
	}
	if req.GetEpoch() == 0 {
		return nil, invalidArg("epoch", "must be positive")
	}
	if err := d.checkRenewal(ctx, req.GetBrokerId(), req.GetEpoch()); err != nil {
		return nil, err
	}
	resp, err := detect.Grant(d.state, d.grantor, d.nodeID, req.GetBrokerId(), req.GetEpoch())
	switch {
	case err == nil:
		resp.LeaderId = d.node.LeaderID()
		return resp, nil
	case errors.Is(err, detect.ErrNotSeeded):
		return nil, status.Error(codes.Unavailable, "lease not granted: the cluster's policy is not seeded yet (no leader has been elected since the cluster was founded)")
	case errors.Is(err, detect.ErrNotVoter):
		return nil, status.Errorf(codes.Unavailable, "lease not granted: %s is not a voting member", d.nodeID)
	case errors.Is(err, lease.ErrPromised):
		return nil, rpcerr.Status(fmt.Errorf("lease of broker %q at epoch %d not renewed by %s: it attested the lease expired; it renews again once the attestation is withdrawn: %w",
			req.GetBrokerId(), req.GetEpoch(), d.nodeID, refusal.ErrLeaseAttested)).Err()
	case errors.Is(err, lease.ErrQuiet):
		return nil, status.Errorf(codes.Unavailable, "lease not granted: %s started less than a lease ago and waits out the leases it may have granted before (%v)", d.nodeID, err)
	case errors.Is(err, lease.ErrStore):
		d.logger.ErrorContext(ctx, "lease not granted: the lease state cannot be saved", "broker_id", req.GetBrokerId(), "err", err)
		return nil, status.Errorf(codes.Unavailable, "lease not granted: %s cannot save its lease state", d.nodeID)
	default:
		return nil, d.stateErr(ctx, err)
	}
}

// countRenewal counts a renewal's answer: granted, or refused with the
// refusal's reason.
func countRenewal(m *metrics.Decisions, err error) {
	if err == nil {
		m.RenewalGranted()
		return
	}
	if r := rpcerr.Reason(err); r != "" {
		m.RenewalRefused(strings.ToLower(string(r))) // NODE_FENCED: node_fenced
		return
	}
	switch status.Code(err) {
	case codes.Unavailable:
		m.RenewalRefused("unavailable")
	case codes.InvalidArgument:
		m.RenewalRefused("invalid_argument")
	default:
		m.RenewalRefused(strings.ToLower(status.Code(err).String()))
	}
}

// checkRenewal applies the epoch rule to a renewal. A member that does not
// know the broker, or knows only an older epoch than the one presented, may
// merely lag behind the log: it answers only after a ReadIndex round shows
// the refusal is current, so that a lagging member never makes an agent
// believe it was fenced.
func (d *detection) checkRenewal(ctx context.Context, broker string, epoch uint64) error {
	err := d.state.CheckBroker(broker, epoch, nil)
	if err == nil {
		return nil
	}
	b, known := d.state.Broker(broker)
	if known && epoch < b.GetEpoch() {
		return d.stateErr(ctx, err)
	}
	if err := d.node.LinearizableRead(ctx); err != nil {
		return d.stateErr(ctx, err)
	}
	if err := d.state.CheckBroker(broker, epoch, nil); err != nil {
		return d.stateErr(ctx, err)
	}
	return nil
}

func checkBrokerID(field, id string) error {
	if id == "" {
		return invalidArg(field, "must not be empty")
	}
	if err := config.CheckName(id); err != nil {
		return invalidArg(field, err.Error())
	}
	return nil
}

// leaseView fills b.lease_remaining_ms with what remains of this member's
// last grant of the broker's epoch (0 once over or fenced, -1 when it never
// granted it), and lease_view_of with this member's id.
func (d *detection) leaseView(b *waldenv1.Broker) {
	b.LeaseViewOf = d.nodeID
	if b.GetFenced() {
		b.LeaseRemainingMs = 0
		return
	}
	r, ok := d.grantor.Remaining(lease.Key{Broker: b.GetBrokerId(), Epoch: b.GetEpoch()})
	if !ok {
		b.LeaseRemainingMs = -1
		return
	}
	b.LeaseRemainingMs = max(r.Milliseconds(), 0)
}

// detector is the failure-detection side of one member: the gossip pool
// (optional), the observer (every member) and the decider (acts while this
// member leads), with the Agent and Brokers services over them.
type detector struct {
	d        *detection
	pool     *gossip.Pool // nil when gossip is off
	observer *detect.Observer
	decider  *detect.Decider
	agent    *agentService
	brokers  *brokersService
}

// raftCluster adapts the node to detect.Cluster.
type raftCluster struct{ node ClusterNode }

func (c raftCluster) Leadership() (bool, uint64) {
	st := c.node.Status()
	return st.RaftState == "leader" && st.LeaderID == st.NodeID, st.Term
}

func (c raftCluster) Voters() []string {
	var out []string
	for _, m := range c.node.Status().Members {
		if m.GetRole() != "learner" {
			out = append(out, m.GetId())
		}
	}
	return out
}

func (c raftCluster) LiveMembers() []string {
	st := c.node.Status()
	var out []string
	for _, m := range st.Members {
		if m.GetRole() != "learner" && (m.GetReachable() || m.GetId() == st.NodeID) {
			out = append(out, m.GetId())
		}
	}
	return out
}

// decisionState adds ActiveJobs to the broker state.
type decisionState struct{ brokerState }

func (s decisionState) ActiveJobs() int { return activeJobs(s.brokerState) }

// leaseStateFile is the file in data_dir where a member keeps what it must
// remember of its lease grants across restarts (lease.Durable).
const leaseStateFile = "lease-state.json"

// proberFor returns the direct prober of a member's observer; nil means
// HTTP probes. Tests substitute a prober that injects faults.
var proberFor = func(*config.Server) detect.Prober { return nil }

// newDetector wires detection for a member. prober nil means HTTP probes of
// the agents' /healthz.
func newDetector(cfg *config.Server, admin *adminService, node ClusterNode, prop proposer, state brokerState,
	adminAddr string, prober detect.Prober, decisions *metrics.Decisions, logger *slog.Logger) (*detector, error) {
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
	d := &detection{
		admin: admin, node: node, prop: prop, state: state,
		grantor:        grantor,
		decisions:      decisions,
		config:         cfg.Policy.Proto(),
		clusterName:    cfg.ClusterName,
		nodeID:         cfg.NodeID,
		logger:         logger.With("component", "detect"),
		proposeTimeout: 5 * time.Second,
	}
	cluster := raftCluster{node}
	det := &detector{d: d, agent: &agentService{d: d}, brokers: &brokersService{d: d, liveMembers: cluster.LiveMembers}}
	gcfg, on := cfg.GossipConfig()
	if on {
		gcfg.Logger = logger
		gcfg.Meta.AdminAddr = adminAddr
		pool, err := gossip.Start(gcfg)
		if err != nil {
			return nil, fmt.Errorf("server: gossip: %w", err)
		}
		det.pool = pool
	}
	probeInterval, probeTimeout := cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout
	det.observer = detect.NewObserver(detect.ObserverConfig{
		NodeID: cfg.NodeID, ProbeInterval: probeInterval, ProbeTimeout: probeTimeout, Grantor: grantor, Logger: logger,
	}, state, prop.Propose, prober)
	det.decider = detect.NewDecider(detect.DeciderConfig{NodeID: cfg.NodeID, Seed: d.config, Logger: logger, Metrics: decisions},
		cluster, decisionState{state}, prop.Propose)
	d.decider = det.decider
	logger.Info("lease grants wait out the longest lease this member may have granted before it started",
		"quiet_for", grantor.QuietFor().Round(time.Millisecond))
	return det, nil
}

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
}

// reportPolicyDrift says once, when the cluster's policy is known, on which
// keys this member's config file differs from it: the file seeds the policy
// only when the cluster is founded, so an edit made later has no effect.
func (d *detection) reportPolicyDrift(ctx context.Context) {
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
