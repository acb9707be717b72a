package fsm

import (
	"fmt"
	"strings"

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
	fenced := 0
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
	removed := "no other member"
	if len(op.GetRemoved()) > 0 {
		removed = strings.Join(op.GetRemoved(), ", ")
	}
	s.appendEvent(&waldenv1.Event{Index: index, UnixMs: s.now(), EventKind: waldenv1.EventKind_EVENT_KIND_FORCE_NEW_CLUSTER, Actor: actorOf(op.GetNodeId(), cmd),
		Message: fmt.Sprintf("%s was made the only voter after a lost quorum (removed: %s); its log ended at index %d (term %d, committed %d): "+
			"whatever the lost members committed beyond it is lost; %d broker epoch(s) revoked (they register again), "+
			"fencing tokens and stream epochs moved %d past what this log issued (next token %d)",
			op.GetNodeId(), removed, op.GetLastIndex(), op.GetTerm(), op.GetCommitIndex(), fenced, op.GetEpochBump(), s.nextEpoch)})
	return &waldenv1.Result{}, nil
}
