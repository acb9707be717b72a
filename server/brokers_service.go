package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/authz"
	"walden/fencing"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// brokersService implements walden.v1.Brokers, the operator's view of the
// broker registry, the event log and the failover policy.
type brokersService struct {
	waldenv1.UnimplementedBrokersServer
	d *detection
	// liveMembers returns the members the leader sees active (for manual
	// failover's job assignment).
	liveMembers func() []string
}

// withLeases fills lease_remaining_ms: from the lease table on the leader,
// -1 elsewhere.
func (s *brokersService) withLeases(brokers []*waldenv1.Broker, leader bool) {
	ttl := time.Duration(s.d.policy().GetLeaseTtlMs()) * time.Millisecond
	now := time.Now()
	for _, b := range brokers {
		if leader {
			s.d.leaseRemaining(b, ttl, now)
		} else {
			b.LeaseRemainingMs = -1
		}
	}
}

func (s *brokersService) ListBrokers(ctx context.Context, req *waldenv1.ListBrokersRequest) (*waldenv1.ListBrokersResponse, error) {
	leader, st := s.d.isLeader()
	if !leader && !forwarded(ctx) && st.LeaderID != "" {
		resp, err := forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.ListBrokersResponse, error) {
			return waldenv1.NewBrokersClient(c).ListBrokers(ctx, req)
		})
		if err == nil {
			return resp, nil
		}
		s.d.logger.DebugContext(ctx, "list brokers: leader not reachable, answering locally", "err", err)
	}
	brokers := s.d.state.Brokers()
	s.withLeases(brokers, leader)
	return &waldenv1.ListBrokersResponse{Brokers: brokers}, nil
}

func (s *brokersService) GetBroker(ctx context.Context, req *waldenv1.GetBrokerRequest) (*waldenv1.GetBrokerResponse, error) {
	if req.GetBrokerId() == "" {
		return nil, invalidArg("broker_id", "must not be empty")
	}
	leader, st := s.d.isLeader()
	if !leader && !forwarded(ctx) && st.LeaderID != "" {
		resp, err := forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.GetBrokerResponse, error) {
			return waldenv1.NewBrokersClient(c).GetBroker(ctx, req)
		})
		if err == nil || status.Code(err) == codes.NotFound {
			return resp, err
		}
	}
	b, ok := s.d.state.Broker(req.GetBrokerId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "broker %q is not registered", req.GetBrokerId())
	}
	s.withLeases([]*waldenv1.Broker{b}, leader)
	return &waldenv1.GetBrokerResponse{Broker: b}, nil
}

// Failover declares a broker failed now (leader only): the timeouts and the
// policy gates are skipped, the fencing is not — the decision is the same
// DeclareFailed entry, at the broker's current epoch, with evidence.manual.
func (s *brokersService) Failover(ctx context.Context, req *waldenv1.FailoverRequest) (*waldenv1.FailoverResponse, error) {
	if err := checkBrokerID("broker_id", req.GetBrokerId()); err != nil {
		return nil, err
	}
	if req.GetReason() == "" && !req.GetPreview() {
		return nil, invalidArg("reason", "must not be empty: say why the broker is failed over")
	}
	leader, st := s.d.isLeader()
	if !leader {
		return forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.FailoverResponse, error) {
			return waldenv1.NewBrokersClient(c).Failover(ctx, req)
		})
	}
	if err := s.d.node.LinearizableRead(ctx); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	b, ok := s.d.state.Broker(req.GetBrokerId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "broker %q is not registered", req.GetBrokerId())
	}
	if req.GetPreview() {
		return s.previewFailover(ctx, b, st)
	}
	p := s.d.policy()
	ttl := time.Duration(p.GetLeaseTtlMs()) * time.Millisecond
	ev := &waldenv1.Evidence{
		Observations:     b.GetObservations(),
		FailureTimeoutMs: p.GetFailureTimeoutMs(),
		Manual:           true,
		Reason:           "manual failover: " + req.GetReason(),
		DecidedBy:        st.NodeID,
		RequestedBy:      authz.Actor(ctx),
	}
	if !p.GetDryRun() {
		// The broker may be alive and hold a valid lease: refuse its
		// renewals from now on, and make the recovery wait until the lease
		// has certainly run out before it reads the WAL.
		remaining := s.d.leases.ForceDeclare(b.GetBrokerId(), b.GetEpoch(), ttl, time.Now())
		ev.LeaseExpiredForMs = -remaining.Milliseconds()
		ev.LeaseWaitMs = max(remaining.Milliseconds()+p.GetDriftMarginMs(), 0)
	}
	live := s.liveMembers()
	s.d.logger.WarnContext(ctx, "manual failover", "broker_id", b.GetBrokerId(), "epoch", b.GetEpoch(), "term", st.Term, "requested_by", ev.GetRequestedBy(),
		"reason", req.GetReason(), "dry_run", p.GetDryRun(), "live_members", live)
	res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_DeclareFailed{DeclareFailed: &waldenv1.DeclareFailed{
		BrokerId: b.GetBrokerId(), Epoch: b.GetEpoch(), Evidence: ev, DryRun: p.GetDryRun(), LiveMembers: live,
	}}})
	if err != nil {
		if fencing.Reason(err) != "" {
			// Refused by the state machine: the decision will not apply.
			s.d.leases.AbortDeclare(b.GetBrokerId(), b.GetEpoch())
		}
		return nil, s.d.stateErr(ctx, err)
	}
	r := res.GetDeclareFailed()
	return &waldenv1.FailoverResponse{BrokerId: b.GetBrokerId(), NewEpoch: r.GetNewEpoch(), JobId: r.GetJobId(), DryRun: r.GetDryRun()}, nil
}

func (s *brokersService) Ack(ctx context.Context, req *waldenv1.AckRequest) (*waldenv1.AckResponse, error) {
	if err := checkBrokerID("broker_id", req.GetBrokerId()); err != nil {
		return nil, err
	}
	res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_AckBroker{AckBroker: &waldenv1.AckBroker{
		BrokerId: req.GetBrokerId(), Actor: authz.Actor(ctx),
	}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	return &waldenv1.AckResponse{Broker: res.GetBroker()}, nil
}

func (s *brokersService) SetMaintenance(ctx context.Context, req *waldenv1.SetMaintenanceRequest) (*waldenv1.SetMaintenanceResponse, error) {
	if err := checkBrokerID("broker_id", req.GetBrokerId()); err != nil {
		return nil, err
	}
	if req.GetTtlMs() < 0 || time.Duration(req.GetTtlMs())*time.Millisecond > maxMaintenanceTTL {
		return nil, invalidArg("ttl_ms", fmt.Sprintf("must be between 0 (no ttl) and %s", maxMaintenanceTTL))
	}
	if !req.GetOn() && req.GetTtlMs() != 0 {
		return nil, invalidArg("ttl_ms", "only maintenance on takes a ttl")
	}
	res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_SetMaintenance{SetMaintenance: &waldenv1.SetMaintenance{
		BrokerId: req.GetBrokerId(), On: req.GetOn(), Actor: authz.Actor(ctx), Reason: req.GetReason(), TtlMs: req.GetTtlMs(),
	}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	return &waldenv1.SetMaintenanceResponse{Broker: res.GetBroker()}, nil
}

func (s *brokersService) ListEvents(ctx context.Context, req *waldenv1.ListEventsRequest) (*waldenv1.ListEventsResponse, error) {
	return &waldenv1.ListEventsResponse{Events: s.d.state.Events(req.GetBrokerId(), int(req.GetLimit()))}, nil
}

// GetPolicy answers the leader's effective policy (its config file under
// the runtime overrides); a follower forwards, or answers its own when the
// leader cannot be reached.
func (s *brokersService) GetPolicy(ctx context.Context, req *waldenv1.GetPolicyRequest) (*waldenv1.GetPolicyResponse, error) {
	leader, st := s.d.isLeader()
	if !leader && !forwarded(ctx) && st.LeaderID != "" {
		resp, err := forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.GetPolicyResponse, error) {
			return waldenv1.NewBrokersClient(c).GetPolicy(ctx, req)
		})
		if err == nil {
			return resp, nil
		}
	}
	p, entries := policy.Effective(s.d.config, s.d.state.PolicyOverrides())
	return &waldenv1.GetPolicyResponse{Entries: entries, Policy: p}, nil
}

// SetPolicy validates the effective policy that would result (the leader's
// config under the changed overrides) before proposing anything, so an
// unsafe combination is refused with InvalidArgument naming the key.
func (s *brokersService) SetPolicy(ctx context.Context, req *waldenv1.SetPolicyRequest) (*waldenv1.SetPolicyResponse, error) {
	if len(req.GetSet()) == 0 && len(req.GetUnset()) == 0 {
		return nil, invalidArg("set", "nothing to set or unset")
	}
	leader, st := s.d.isLeader()
	if !leader {
		return forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.SetPolicyResponse, error) {
			return waldenv1.NewBrokersClient(c).SetPolicy(ctx, req)
		})
	}
	if err := s.d.node.LinearizableRead(ctx); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	next := proto.Clone(s.d.state.PolicyOverrides()).(*waldenv1.PolicyOverrides)
	if next.Values == nil {
		next.Values = map[string]string{}
	}
	keys := policy.Keys()
	for _, k := range policy.SortedKeys(req.GetSet()) {
		v, err := policy.Canonical(k, req.GetSet()[k])
		if err != nil {
			return nil, policyErr(k, err)
		}
		next.Values[k] = v
	}
	for _, k := range req.GetUnset() {
		if !slices.Contains(keys, k) {
			return nil, invalidArg(k, "unknown policy key (keys: "+fmt.Sprint(keys)+")")
		}
		if _, both := req.GetSet()[k]; both {
			return nil, invalidArg(k, "both set and unset")
		}
		delete(next.Values, k)
	}
	eff, _ := policy.Effective(s.d.config, next)
	if err := policy.Validate(eff); err != nil {
		return nil, policyErr("", err)
	}
	_, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_SetPolicy{SetPolicy: &waldenv1.SetPolicy{
		Set: req.GetSet(), Unset: req.GetUnset(), Actor: authz.Actor(ctx),
	}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	p, entries := policy.Effective(s.d.config, s.d.state.PolicyOverrides())
	s.d.logger.InfoContext(ctx, "policy changed", "set", req.GetSet(), "unset", req.GetUnset(), "term", st.Term)
	return &waldenv1.SetPolicyResponse{Entries: entries, Policy: p}, nil
}

// RemoveBroker removes a registration nobody uses (leader only): refused
// while the broker holds a lease on the leader's table (its agent still
// renews; removing it would only make the agent register again), and, by
// the state machine, while a recovery job of it runs or it owns an opened
// stream.
func (s *brokersService) RemoveBroker(ctx context.Context, req *waldenv1.RemoveBrokerRequest) (*waldenv1.RemoveBrokerResponse, error) {
	if err := checkBrokerID("broker_id", req.GetBrokerId()); err != nil {
		return nil, err
	}
	leader, st := s.d.isLeader()
	if !leader {
		return forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.RemoveBrokerResponse, error) {
			return waldenv1.NewBrokersClient(c).RemoveBroker(ctx, req)
		})
	}
	if err := s.d.node.LinearizableRead(ctx); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	b, ok := s.d.state.Broker(req.GetBrokerId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "broker %q is not registered", req.GetBrokerId())
	}
	s.withLeases([]*waldenv1.Broker{b}, true)
	if b.GetLeaseRemainingMs() > 0 {
		return nil, status.Errorf(codes.FailedPrecondition,
			"broker %q holds a lease for %d ms more: its agent still renews it; stop the agent (or fail the broker over) before removing the registration",
			b.GetBrokerId(), b.GetLeaseRemainingMs())
	}
	res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_RemoveBroker{RemoveBroker: &waldenv1.RemoveBroker{
		BrokerId: req.GetBrokerId(), Actor: authz.Actor(ctx)}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	s.d.logger.WarnContext(ctx, "broker registration removed", "broker_id", req.GetBrokerId(), "epoch", b.GetEpoch(),
		"actor", authz.Actor(ctx), "term", st.Term)
	return &waldenv1.RemoveBrokerResponse{Broker: res.GetBroker()}, nil
}

// policyErr maps a policy error to InvalidArgument naming its key.
func policyErr(key string, err error) error {
	var ke *policy.KeyError
	if errors.As(err, &ke) {
		return invalidArg(ke.Key, ke.Reason)
	}
	if key == "" {
		key = "set"
	}
	return invalidArg(key, err.Error())
}
