package fsm

import (
	"slices"

	waldenv1 "walden/proto/walden/v1"
)

// applyForceNewCluster applies the entry walden server --force-new-cluster
// writes after making its member the only voter. The lost members may have
// committed entries beyond that member's log: registrations and failovers
// that issued fencing tokens, stream opens that issued stream epochs. So,
// as a restore does, every broker's epoch is revoked (each registers again
// and uploads what its WAL holds beyond the catalog), and the next fencing
// token and every stream's epoch move epoch_bump past what this log issued.
// The event records what the member may have lost.
func (s *State) applyForceNewCluster(index uint64, cmd *waldenv1.Command, op *waldenv1.ForceNewCluster) (*waldenv1.Result, error) {
	if op.GetEpochBump() == 0 {
		return nil, invalid("force new cluster: epoch_bump is 0: the fencing token must move past what the lost log may have issued")
	}
	if op.GetNodeId() == "" {
		return nil, invalid("force new cluster: node_id is empty")
	}
	var fenced uint32
	for _, id := range sortedKeys(s.brokers) {
		b := s.brokers[id]
		if b.GetFenced() {
			continue
		}
		b.Fenced = true
		b.LeaseRemainingMs = -1
		b.FailoverRequested = nil
		s.deriveState(b)
		fenced++
	}
	s.nextEpoch = max(s.nextEpoch, 1) + op.GetEpochBump()
	for _, st := range s.streams {
		st.Epoch += op.GetEpochBump()
	}
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_FORCE_NEW_CLUSTER, Actor: actorOf(op.GetNodeId(), cmd),
		Detail: &waldenv1.EventDetail{Member: op.GetNodeId(), ForceNewCluster: &waldenv1.ForceNewClusterEvent{
			Removed: slices.Clone(op.GetRemoved()), LastIndex: op.GetLastIndex(), Term: op.GetTerm(), CommitIndex: op.GetCommitIndex(),
			BrokersFenced: fenced, EpochBump: op.GetEpochBump(), NextEpoch: s.nextEpoch,
		}}})
	return &waldenv1.Result{}, nil
}
