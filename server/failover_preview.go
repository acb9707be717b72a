package server

import (
	"context"
	"fmt"

	"walden/detect"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
	"walden/refusal"
	"walden/rpcerr"
)

// previewFailover answers `waldenctl failover BROKER --dry-run` on the
// leader: the decision a manual failover of b would make now (the epoch it
// would fence, the new epoch and job, the coordinator that would recover,
// how long the decision would wait for the broker's lease) and the
// conditions of an automatic decision that do not hold. It changes
// nothing: no proposal, and the broker's lease renewals go on.
func (s *brokersService) previewFailover(ctx context.Context, b *waldenv1.Broker, st raftnode.Status) (*waldenv1.FailoverResponse, error) {
	if b.GetFenced() {
		// What the failover itself would answer.
		return nil, rpcerr.Status(fmt.Errorf("broker %q was already failed over (epoch %d is fenced; job %s): %w",
			b.GetBrokerId(), b.GetEpoch(), b.GetLastJobId(), refusal.ErrNodeFenced)).Err()
	}
	p := s.d.policy()
	live := s.liveMembers()
	// A failover stops every renewal at once; the decision then waits until
	// a majority of the coordinators attest their grants ran out: at most
	// lease_ttl + drift_margin (nothing when a majority already attests).
	wait := p.GetLeaseTtlMs() + p.GetDriftMarginMs()
	if len(detect.Attested(b, voterIDs(st))) >= len(voterIDs(st))/2+1 {
		wait = 0
	}
	resp := &waldenv1.FailoverResponse{BrokerId: b.GetBrokerId(), Preview: true, DryRun: p.GetDryRun(), Epoch: b.GetEpoch(),
		LeaseWaitMs: wait,
		Evidence: &waldenv1.Evidence{Observations: b.GetObservations(), FailureTimeoutMs: p.GetFailureTimeoutMs(), Manual: true,
			DecidedBy: st.NodeID, Term: st.Term}}
	type previewer interface {
		NextEpoch() uint64
		PreviewAssignee(live []string) string
	}
	if pv, ok := s.d.state.(previewer); ok {
		resp.NewEpoch = pv.NextEpoch()
		resp.JobId = fmt.Sprintf("job-%s-%d", b.GetBrokerId(), resp.NewEpoch)
		resp.AssigneeId = pv.PreviewAssignee(live)
	}
	s.withViews([]*waldenv1.Broker{b})
	resp.Holds = holdsOf([]*waldenv1.Broker{b})[b.GetBrokerId()]
	if len(resp.Holds) == 0 {
		resp.Holds = []string{"no coordinator observes it suspect or dead: an automatic decision would not consider it"}
	}
	s.d.logger.InfoContext(ctx, "failover preview", "broker_id", b.GetBrokerId(), "epoch", b.GetEpoch(), "assignee_id", resp.GetAssigneeId(),
		"lease_wait_ms", resp.GetLeaseWaitMs())
	return resp, nil
}

// voterIDs are the voting members of a status.
func voterIDs(st raftnode.Status) []string {
	var out []string
	for _, m := range st.Members {
		if m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER {
			out = append(out, m.GetId())
		}
	}
	return out
}
