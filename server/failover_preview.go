package server

import (
	"context"
	"fmt"
	"time"

	"walden/fencing"
	waldenv1 "walden/proto/walden/v1"
)

// previewFailover answers `waldenctl failover BROKER --dry-run` on the
// leader: the decision a manual failover of b would make now (the epoch it
// would fence, the new epoch and job, the coordinator that would recover,
// how long the recovery would wait for the broker's lease) and the
// conditions of an automatic decision that do not hold. It changes
// nothing: no proposal, and the broker's lease renewals go on.
func (s *brokersService) previewFailover(ctx context.Context, b *waldenv1.Broker, st NodeStatus) (*waldenv1.FailoverResponse, error) {
	if b.GetFenced() {
		// What the decision itself would answer.
		return nil, fencing.GRPCStatus(fmt.Errorf("broker %q is fenced at epoch %d: already failed over: %w",
			b.GetBrokerId(), b.GetEpoch(), fencing.ErrEpochExpired)).Err()
	}
	p := s.d.policy()
	ttl := time.Duration(p.GetLeaseTtlMs()) * time.Millisecond
	s.d.leaseRemaining(b, ttl, time.Now())
	live := s.liveMembers()
	resp := &waldenv1.FailoverResponse{BrokerId: b.GetBrokerId(), Preview: true, DryRun: p.GetDryRun(), Epoch: b.GetEpoch(),
		LeaseWaitMs: max(b.GetLeaseRemainingMs()+p.GetDriftMarginMs(), 0),
		Evidence: &waldenv1.Evidence{Observations: b.GetObservations(), FailureTimeoutMs: p.GetFailureTimeoutMs(), Manual: true,
			DecidedBy: st.NodeID}}
	if b.GetLeaseRemainingMs() == 0 {
		resp.LeaseWaitMs = 0 // expired: nothing to wait for
	}
	type previewer interface {
		NextEpoch() uint64
		PreviewAssignee(live []string) string
		ActiveJobs() int
	}
	running := 0
	if pv, ok := s.d.state.(previewer); ok {
		resp.NewEpoch = pv.NextEpoch()
		resp.JobId = fmt.Sprintf("job-%s-%d", b.GetBrokerId(), resp.NewEpoch)
		resp.AssigneeId = pv.PreviewAssignee(live)
		running = pv.ActiveJobs()
	}
	var voters []string
	for _, m := range st.Members {
		if m.GetRole() != "learner" {
			voters = append(voters, m.GetId())
		}
	}
	all := s.d.state.Brokers()
	s.withLeases(all, true)
	holds := holdReasons(holdInput{Policy: p, Voters: voters, Brokers: all, RunningRecoveries: running, NowUnixMs: time.Now().UnixMilli()})
	resp.Holds = holds[b.GetBrokerId()]
	if len(resp.Holds) == 0 {
		resp.Holds = []string{"no coordinator observes it suspect or dead: an automatic decision would not consider it"}
	}
	s.d.logger.InfoContext(ctx, "failover preview", "broker_id", b.GetBrokerId(), "epoch", b.GetEpoch(), "assignee_id", resp.GetAssigneeId(),
		"lease_wait_ms", resp.GetLeaseWaitMs())
	return resp, nil
}
