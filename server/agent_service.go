package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/config"
	"walden/detect"
	"walden/lease"
	"walden/metrics"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// agentService implements walden.v1.Agent: brokers' agents register and
// renew their leases with the leader; a follower forwards both.
type agentService struct {
	waldenv1.UnimplementedAgentServer
	d *serviceDeps
	// readings shares boot-clock readings between the streamed renewals
	// granted together.
	readings *lease.Readings
	// streams counts the renewal streams and framed renewal connections
	// open over either transport (as walden_lease_renewal_streams does,
	// by its transport label).
	streams atomic.Int64
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
	if a := req.GetAutomq(); a != nil {
		if a.GetNodeId() < 0 {
			return nil, invalidArg("automq.node_id", fmt.Sprintf("must not be negative, got %d", a.GetNodeId()))
		}
		if a.GetNodeEpoch() < 0 {
			return nil, invalidArg("automq.node_epoch", fmt.Sprintf("must not be negative, got %d", a.GetNodeEpoch()))
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
		Wal: req.GetWal(), GossipName: req.GetGossipName(), Actor: authz.Actor(ctx), Automq: req.GetAutomq(),
	}}})
	if err != nil {
		// The agent retries while its broker's recovery runs: routine.
		lvl := slog.LevelInfo
		if errors.Is(err, refusal.ErrRecoveryRunning) || errors.Is(err, refusal.ErrRestoreReconciling) {
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
		RecoveredWalOffset: r.GetRecoveredWalOffset(), FailureTimeoutMs: p.GetFailureTimeoutMs(),
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
	if err := checkRenewalRequest(req.GetBrokerId(), req.GetEpoch()); err != nil {
		return nil, err
	}
	if err := d.checkRenewal(ctx, req.GetBrokerId(), req.GetEpoch()); err != nil {
		return nil, err
	}
	resp, err := detect.Grant(d.state, d.grantor, d.nodeID, req.GetBrokerId(), req.GetEpoch())
	return d.renewalAnswer(ctx, req.GetBrokerId(), req.GetEpoch(), resp, err)
}

// renewalAnswer is the answer to a renewal of broker at epoch that
// detect.Grant answered with resp or err: the grant with the leader this
// member knows and the renewal slot it asks the agent to renew at, or the
// refusal as a status error.
func (d *serviceDeps) renewalAnswer(ctx context.Context, broker string, epoch uint64, resp *waldenv1.RenewLeaseResponse, err error) (*waldenv1.RenewLeaseResponse, error) {
	switch {
	case err == nil:
		resp.LeaderId = d.node.LeaderID()
		resp.RenewInUs = d.slots.RenewIn(time.Now(), time.Duration(resp.GetLeaseTtlMs())*time.Millisecond).Microseconds()
		return resp, nil
	case errors.Is(err, detect.ErrNotSeeded):
		return nil, rpcerr.Err(fmt.Errorf("lease not granted: %w", err))
	case errors.Is(err, detect.ErrNotVoter):
		return nil, rpcerr.New(refusal.LeaseNotGranted, fmt.Sprintf("lease not granted: %s is not a voting member", d.nodeID),
			map[string]string{"cause": "not_voter"})
	case errors.Is(err, lease.ErrPromised):
		return nil, rpcerr.Status(fmt.Errorf("lease of broker %q at epoch %d not renewed by %s: it attested the lease expired; it renews again once the attestation is withdrawn: %w",
			broker, epoch, d.nodeID, refusal.ErrLeaseAttested)).Err()
	case errors.Is(err, lease.ErrQuiet):
		// retry_after_ms tells the agent when its renewal can be granted:
		// it asks again then, not on its backoff (docs/refusals.md).
		meta := map[string]string{"cause": "starting"}
		var q *lease.QuietError
		if errors.As(err, &q) {
			meta["retry_after_ms"] = strconv.FormatInt(int64((q.Remaining+time.Millisecond-1)/time.Millisecond), 10) // rounded up
		}
		return nil, rpcerr.New(refusal.LeaseNotGranted, fmt.Sprintf("lease not granted: %s started less than a lease ago and waits out the leases it may have granted before (%v)", d.nodeID, err),
			meta)
	case errors.Is(err, lease.ErrStore):
		d.logger.ErrorContext(ctx, "lease not granted: the lease state cannot be saved", "broker_id", broker, "err", err)
		return nil, rpcerr.New(refusal.LeaseNotGranted, fmt.Sprintf("lease not granted: %s cannot save its lease state", d.nodeID),
			map[string]string{"cause": "store"})
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

// checkRenewalRequest refuses a renewal without a broker id or an epoch.
func checkRenewalRequest(broker string, epoch uint64) error {
	if err := checkBrokerID("broker_id", broker); err != nil {
		return err
	}
	if epoch == 0 {
		return invalidArg("epoch", "must be positive")
	}
	return nil
}

// renewalEpoch applies the epoch rule to a renewal from the applied state:
// nil, or the refusal and whether it may come from this member lagging
// behind the log (it does not know the broker, or knows only an older
// epoch than the one presented) and must be confirmed by a ReadIndex round
// before it is answered.
func (d *serviceDeps) renewalEpoch(broker string, epoch uint64) (lagging bool, err error) {
	if err = d.state.CheckBroker(broker, epoch, nil); err == nil {
		return false, nil
	}
	b, known := d.state.Broker(broker)
	return !known || epoch >= b.GetEpoch(), err
}

// checkRenewal applies the epoch rule to a renewal. A member that does not
// know the broker, or knows only an older epoch than the one presented, may
// merely lag behind the log: it answers only after a ReadIndex round shows
// the refusal is current, so that a lagging member never makes an agent
// believe it was fenced.
func (d *serviceDeps) checkRenewal(ctx context.Context, broker string, epoch uint64) error {
	lagging, err := d.renewalEpoch(broker, epoch)
	if err == nil {
		return nil
	}
	if !lagging {
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
func (d *serviceDeps) leaseView(b *waldenv1.Broker) {
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
