package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/config"
	"walden/detect"
	"walden/fencing"
	"walden/gossip"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// brokerState is what the Agent and Brokers services read from the
// replicated state (*fsm.State).
type brokerState interface {
	Broker(id string) (*waldenv1.Broker, bool)
	Brokers() []*waldenv1.Broker
	CheckBroker(brokerID string, epoch uint64, fo *waldenv1.FailoverContext) error
	Events(brokerID string, limit int) []*waldenv1.Event
	PolicyOverrides() *waldenv1.PolicyOverrides
}

// proposer replicates a command (raftnode.Node.Propose).
type proposer interface {
	Propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error)
}

// detection holds what the Agent and Brokers services share with the
// failure detector: the replicated state, the leader's lease table, the
// config policy and the forwarding helpers of the admin service.
type detection struct {
	admin       *adminService
	node        ClusterNode
	prop        proposer
	state       brokerState
	leases      *detect.LeaseTable
	config      *waldenv1.Policy // the policy: section of this member's config
	clusterName string
	nodeID      string
	logger      *slog.Logger
	// proposeTimeout bounds a proposal made for an API call without a
	// deadline of its own.
	proposeTimeout time.Duration
}

// policy returns this member's effective policy: its config over the
// defaults, under the runtime overrides.
func (d *detection) policy() *waldenv1.Policy {
	p, _ := policy.Effective(d.config, d.state.PolicyOverrides())
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
		d.logger.InfoContext(ctx, "forward to leader failed", "leader_id", st.LeaderID, "term", st.Term, "err", err)
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
	if fencing.Reason(err) != "" {
		return fencing.GRPCStatus(err).Err()
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
		d.logger.InfoContext(ctx, "register refused", "broker_id", req.GetBrokerId(), "term", st.Term, "err", err)
		return nil, d.stateErr(ctx, err)
	}
	r := res.GetRegisterBroker()
	p := d.policy()
	d.leases.Renew(req.GetBrokerId(), r.GetEpoch(), time.Now(), time.Duration(p.GetLeaseTtlMs())*time.Millisecond)
	d.logger.InfoContext(ctx, "broker registered", "broker_id", req.GetBrokerId(), "epoch", r.GetEpoch(), "term", st.Term,
		"agent_addr", req.GetAgentAddr(), "recovered_wal_offset", r.GetRecoveredWalOffset())
	return &waldenv1.RegisterResponse{
		BrokerId: req.GetBrokerId(), Epoch: r.GetEpoch(), LeaseTtlMs: p.GetLeaseTtlMs(),
		RecoveredWalOffset: r.GetRecoveredWalOffset(),
	}, nil
}

func (s *agentService) RenewLease(ctx context.Context, req *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	d := s.d
	if err := checkBrokerID("broker_id", req.GetBrokerId()); err != nil {
		return nil, err
	}
	if req.GetEpoch() == 0 {
		return nil, invalidArg("epoch", "must be positive")
	}
	leader, st := d.isLeader()
	if !leader {
		return forwardToLeader(ctx, d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.RenewLeaseResponse, error) {
			return waldenv1.NewAgentClient(c).RenewLease(ctx, req)
		})
	}
	// Confirm leadership (ReadIndex) before granting: a deposed leader
	// that has not yet noticed must not extend a lease the new leader does
	// not know of. The read also makes the epoch check current.
	at := time.Now()
	if err := d.node.LinearizableRead(ctx); err != nil {
		return nil, d.stateErr(ctx, err)
	}
	if err := d.state.CheckBroker(req.GetBrokerId(), req.GetEpoch(), nil); err != nil {
		return nil, d.stateErr(ctx, err)
	}
	ttl := d.policy().GetLeaseTtlMs()
	if !d.leases.Renew(req.GetBrokerId(), req.GetEpoch(), at, time.Duration(ttl)*time.Millisecond) {
		// A failover decision of this epoch is in flight: granting the
		// lease would let the broker acknowledge writes while it is fenced.
		return nil, status.Errorf(codes.FailedPrecondition, "lease renewal refused: a failover decision of broker %q at epoch %d is in flight",
			req.GetBrokerId(), req.GetEpoch())
	}
	return &waldenv1.RenewLeaseResponse{Epoch: req.GetEpoch(), LeaseTtlMs: ttl, LeaderId: st.NodeID}, nil
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

// leaseRemaining fills b.lease_remaining_ms from the leader's lease table:
// the remaining lease on the leader's clock, 0 once expired or fenced.
func (d *detection) leaseRemaining(b *waldenv1.Broker, ttl time.Duration, now time.Time) {
	if b.GetFenced() {
		b.LeaseRemainingMs = 0
		return
	}
	r := d.leases.Remaining(b.GetBrokerId(), b.GetEpoch(), ttl, now)
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

// proberFor returns the direct prober of a member's observer; nil means
// HTTP probes. Tests substitute a prober that injects faults.
var proberFor = func(*config.Server) detect.Prober { return nil }

// newDetector wires detection for a member. prober nil means HTTP probes of
// the agents' /healthz.
func newDetector(cfg *config.Server, admin *adminService, node ClusterNode, prop proposer, state brokerState,
	adminAddr string, prober detect.Prober, logger *slog.Logger) (*detector, error) {
	d := &detection{
		admin: admin, node: node, prop: prop, state: state,
		leases:         detect.NewLeaseTable(time.Now()),
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
		NodeID: cfg.NodeID, ProbeInterval: probeInterval, ProbeTimeout: probeTimeout, Logger: logger,
	}, state, prop.Propose, prober)
	det.decider = detect.NewDecider(detect.DeciderConfig{NodeID: cfg.NodeID, Logger: logger},
		cluster, decisionState{state}, d.policy, d.leases, prop.Propose)
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
}

// stop leaves the gossip pool.
func (det *detector) stop() {
	if det.pool != nil {
		_ = det.pool.Leave(time.Second)
		_ = det.pool.Shutdown()
	}
}
