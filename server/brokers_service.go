package server

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/authz"
	"walden/fieldlimit"
	"walden/lease"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// brokersService implements walden.v1.Brokers, the operator's view of the
// broker registry, the event log and the failover policy.
type brokersService struct {
	waldenv1.UnimplementedBrokersServer
	d *serviceDeps
	// liveMembers returns the members the leader sees active (for manual
	// failover's job assignment).
	liveMembers func() []string
}

// withViews fills each broker's lease view (this member's grant) and, on
// the leader, why a suspected broker is not failed over yet.
func (s *brokersService) withViews(brokers []*waldenv1.Broker) {
	holds := s.d.decider.Holds()
	for _, b := range brokers {
		s.d.leaseView(b)
		if h, ok := holds[b.GetBrokerId()]; ok {
			b.Hold, b.HoldDetail = h.Reason, h.Detail
		}
	}
}

// ListBrokers answers the broker registry. A linearizable read is answered
// by the leader (a follower forwards, so that the answer carries the
// leader's hold reasons), or by this member after a ReadIndex round when the
// leader cannot be reached; a serializable read is answered here at once.
func (s *brokersService) ListBrokers(ctx context.Context, req *waldenv1.ListBrokersRequest) (*waldenv1.ListBrokersResponse, error) {
	if resp, err, done := forwardRead(ctx, s.d, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.ListBrokersResponse, error) {
		return waldenv1.NewBrokersClient(c).ListBrokers(ctx, req)
	}); done {
		return resp, err
	}
	if err := s.d.read(ctx); err != nil {
		return nil, err
	}
	brokers := s.d.state.Brokers()
	s.withViews(brokers)
	return &waldenv1.ListBrokersResponse{Brokers: brokers}, nil
}

func (s *brokersService) GetBroker(ctx context.Context, req *waldenv1.GetBrokerRequest) (*waldenv1.GetBrokerResponse, error) {
	if req.GetBrokerId() == "" {
		return nil, invalidArg("broker_id", "must not be empty")
	}
	if resp, err, done := forwardRead(ctx, s.d, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.GetBrokerResponse, error) {
		return waldenv1.NewBrokersClient(c).GetBroker(ctx, req)
	}); done {
		return resp, err
	}
	if err := s.d.read(ctx); err != nil {
		return nil, err
	}
	b, ok := s.d.state.Broker(req.GetBrokerId())
	if !ok {
		return nil, notRegistered(req.GetBrokerId())
	}
	s.withViews([]*waldenv1.Broker{b})
	return &waldenv1.GetBrokerResponse{Broker: b}, nil
}

// Failover fails a broker over at an operator's request: the timeouts and
// the policy gates are skipped, the fencing and the lease are not. The
// request is replicated; every coordinator stops renewing the broker's
// epoch when it applies it, and attests once its last grant ran out; the
// leader then decides. The call returns when the decision applied (within
// lease_ttl + drift_margin of the broker's last renewal, plus a probe
// round), or when its deadline passes with the request standing. With
// dry_run the decision is recorded at once and nothing is fenced.
func (s *brokersService) Failover(ctx context.Context, req *waldenv1.FailoverRequest) (*waldenv1.FailoverResponse, error) {
	if err := checkBrokerID("broker_id", req.GetBrokerId()); err != nil {
		return nil, err
	}
	if req.GetReason() == "" && !req.GetPreview() {
		return nil, invalidArg("reason", "must not be empty: say why the broker is failed over")
	}
	if err := s.d.node.LinearizableRead(ctx); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	b, ok := s.d.state.Broker(req.GetBrokerId())
	if !ok {
		return nil, notRegistered(req.GetBrokerId())
	}
	if req.GetPreview() {
		// The preview shows the leader's decision gates: ask the leader.
		if leader, st := s.d.isLeader(); !leader && !forwarded(ctx) {
			return forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.FailoverResponse, error) {
				return waldenv1.NewBrokersClient(c).Failover(ctx, req)
			})
		}
		return s.previewFailover(ctx, b, s.d.node.Status())
	}
	if b.GetFenced() {
		return nil, rpcerr.Status(fmt.Errorf("broker %q was already failed over (epoch %d is fenced; job %s): %w",
			b.GetBrokerId(), b.GetEpoch(), b.GetLastJobId(), refusal.ErrNodeFenced)).Err()
	}
	p := s.d.policy()
	st := s.d.node.Status()
	s.d.logger.WarnContext(ctx, "manual failover requested", "broker_id", b.GetBrokerId(), "epoch", b.GetEpoch(), "term", st.Term,
		"reason", req.GetReason(), "dry_run", p.GetDryRun())
	if p.GetDryRun() {
		res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_DeclareFailed{DeclareFailed: &waldenv1.DeclareFailed{
			BrokerId: b.GetBrokerId(), Epoch: b.GetEpoch(), DryRun: true, LiveMembers: s.liveMembers(),
			Evidence: &waldenv1.Evidence{Observations: b.GetObservations(), Manual: true, Reason: "manual failover: " + req.GetReason(),
				DecidedBy: st.NodeID, RequestedBy: authz.Actor(ctx)},
		}}})
		if err != nil {
			return nil, s.d.stateErr(ctx, err)
		}
		return &waldenv1.FailoverResponse{BrokerId: b.GetBrokerId(), DryRun: res.GetDeclareFailed().GetDryRun()}, nil
	}
	start := time.Now()
	if _, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_RequestFailover{RequestFailover: &waldenv1.RequestFailover{
		BrokerId: b.GetBrokerId(), Epoch: b.GetEpoch(), Reason: req.GetReason(), Actor: authz.Actor(ctx),
	}}}); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	for {
		changed := s.d.state.Changed()
		cur, _ := s.d.state.Broker(b.GetBrokerId())
		if cur.GetEpoch() != b.GetEpoch() {
			return &waldenv1.FailoverResponse{BrokerId: b.GetBrokerId(), NewEpoch: cur.GetEpoch(), JobId: cur.GetLastJobId(),
				LeaseWaitMs: time.Since(start).Milliseconds()}, nil
		}
		select {
		case <-ctx.Done():
			return nil, status.Errorf(codes.DeadlineExceeded,
				"failover of broker %q requested; it is fenced once a majority of coordinators attest that its lease expired (at most lease_ttl %s + drift_margin %s after its last renewal); the request stands: follow it with `waldenctl broker %s`",
				b.GetBrokerId(), time.Duration(p.GetLeaseTtlMs())*time.Millisecond, time.Duration(p.GetDriftMarginMs())*time.Millisecond, b.GetBrokerId())
		case <-changed:
		}
	}
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
	if _, err := fieldlimit.Millis("ttl_ms", req.GetTtlMs(), 0, maxMaintenanceTTL); err != nil {
		return nil, fieldErr(err)
	}
	if !req.GetOn() && req.GetTtlMs() != 0 {
		return nil, invalidArg("ttl_ms", "only maintenance on takes a ttl")
	}
	ttl := req.GetTtlMs()
	if req.GetOn() && ttl == 0 && !req.GetTtlSet() {
		b, _ := s.d.state.Broker(req.GetBrokerId())
		ttl = keptTTL(b, time.Now())
	}
	res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_SetMaintenance{SetMaintenance: &waldenv1.SetMaintenance{
		BrokerId: req.GetBrokerId(), On: req.GetOn(), Actor: authz.Actor(ctx), Reason: req.GetReason(), TtlMs: ttl,
	}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	return &waldenv1.SetMaintenanceResponse{Broker: res.GetBroker()}, nil
}

// keptTTL is what is left of b's maintenance ttl at now, at least 1 ms,
// when b is in maintenance with a ttl; else 0. Turning maintenance on again
// without a ttl keeps it: dropping it silently would leave the broker out of
// automatic failover for good.
func keptTTL(b *waldenv1.Broker, now time.Time) int64 {
	if !b.GetMaintenance() || b.GetMaintenanceTtlMs() <= 0 || b.GetMaintenanceUntilUnixMs() <= 0 {
		return 0
	}
	return max(b.GetMaintenanceUntilUnixMs()-now.UnixMilli(), 1)
}

func (s *brokersService) ListEvents(ctx context.Context, req *waldenv1.ListEventsRequest) (*waldenv1.ListEventsResponse, error) {
	limit, err := fieldlimit.Count("limit", uint64(req.GetLimit()), fieldlimit.MaxRepeated)
	if err != nil {
		return nil, fieldErr(err)
	}
	if err := s.d.read(ctx); err != nil {
		return nil, err
	}
	return &waldenv1.ListEventsResponse{Events: s.d.state.Events(req.GetBrokerId(), limit)}, nil
}

// GetPolicy answers the cluster's policy from this member's replicated
// state: every member answers the same. It also says on which keys this
// member's config file differs from it.
func (s *brokersService) GetPolicy(ctx context.Context, req *waldenv1.GetPolicyRequest) (*waldenv1.GetPolicyResponse, error) {
	if err := s.d.read(ctx); err != nil {
		return nil, err
	}
	p, entries, seeded := s.d.state.Policy()
	if !seeded {
		return nil, rpcerr.Err(refusal.ErrPolicyNotSeeded)
	}
	ov := s.d.state.PolicyOverrides()
	return &waldenv1.GetPolicyResponse{Entries: entries, Policy: p, AnsweredBy: s.d.nodeID,
		ConfigDrift: policy.Drift(s.d.config, ov.GetSeed()), SeededBy: ov.GetSeededBy()}, nil
}

// SetPolicy validates the policy that would result before proposing
// anything, so an unsafe combination is refused with InvalidArgument naming
// the key; the state machine validates it again when it applies it.
func (s *brokersService) SetPolicy(ctx context.Context, req *waldenv1.SetPolicyRequest) (*waldenv1.SetPolicyResponse, error) {
	if len(req.GetSet()) == 0 && len(req.GetUnset()) == 0 {
		return nil, invalidArg("set", "nothing to set or unset")
	}
	if err := s.d.node.LinearizableRead(ctx); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	if _, _, seeded := s.d.state.Policy(); !seeded {
		return nil, rpcerr.Err(refusal.ErrPolicyNotSeeded)
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
	eff, _ := policy.Effective(next.GetSeed(), next)
	if err := policy.Validate(eff); err != nil {
		return nil, policyErr("", err)
	}
	_, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_SetPolicy{SetPolicy: &waldenv1.SetPolicy{
		Set: req.GetSet(), Unset: req.GetUnset(), Actor: authz.Actor(ctx),
	}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	p, entries, _ := s.d.state.Policy()
	s.d.logger.InfoContext(ctx, "policy changed", "set", req.GetSet(), "unset", req.GetUnset(), "term", s.d.node.Status().Term)
	return &waldenv1.SetPolicyResponse{Entries: entries, Policy: p}, nil
}

// RemoveBroker removes a registration nobody uses (leader only): refused
// while the leader's grant of the broker's lease runs (its agent still
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
		return nil, notRegistered(req.GetBrokerId())
	}
	// The agent may be renewing: this member granted it lately, heard it,
	// or the registration is younger than a lease (the agent has not
	// renewed yet).
	p := s.d.policy()
	within := time.Duration(p.GetLeaseTtlMs()+p.GetDriftMarginMs()) * time.Millisecond
	s.d.leaseView(b)
	registeredAgo := time.Since(time.UnixMilli(b.GetRegisteredUnixMs()))
	if b.GetLeaseRemainingMs() > 0 || s.d.grantor.HeardWithin(lease.Key{Broker: b.GetBrokerId(), Epoch: b.GetEpoch()}, within) || registeredAgo < within {
		return nil, rpcerr.New(refusal.LeaseHeld, fmt.Sprintf(
			"broker %q holds a lease, or may still renew it (registered or renewed within lease_ttl + drift_margin, %s): stop its agent (or fail the broker over) before removing the registration",
			b.GetBrokerId(), within), nil)
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

// notRegistered is the refusal of a call about a broker id that is not
// registered: NotFound with its reason, UNKNOWN_NODE.
func notRegistered(id string) error {
	return rpcerr.New(refusal.UnknownNode, fmt.Sprintf("broker %q is not registered", id), nil)
}
