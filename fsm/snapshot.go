package fsm

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// snapshotVersion is the StateSnapshot layout this package writes and reads.
const snapshotVersion uint32 = 1

// Snapshot serializes the state as of the last applied index as a
// walden.v1.StateSnapshot (deterministic encoding, members sorted by id).
func (s *State) Snapshot() ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.snapshotLocked())
	if err != nil {
		return nil, fmt.Errorf("fsm: encode snapshot at index %d: %w", s.applied, err)
	}
	return b, nil
}

func (s *State) snapshotLocked() *waldenv1.StateSnapshot {
	return &waldenv1.StateSnapshot{
		Version:           snapshotVersion,
		ClusterName:       s.clusterName,
		AppliedIndex:      s.applied,
		Members:           s.sortedMembers(),
		NoopCount:         s.noopCount,
		LastAppliedUnixMs: s.lastAppliedUnixMs,
	}
}

// Restore replaces the state with a snapshot's data. A snapshot of another
// version or cluster, or with inconsistent members, is refused and the state
// is left unchanged.
func (s *State) Restore(data []byte) error {
	snap := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(data, snap); err != nil {
		return fmt.Errorf("fsm: restore: %w: %v", ErrInvalidSnapshot, err)
	}
	if v := snap.GetVersion(); v != snapshotVersion {
		return fmt.Errorf("fsm: restore: %w: version %d, this walden reads version %d", ErrSnapshotVersion, v, snapshotVersion)
	}
	if c := snap.GetClusterName(); c != s.clusterName {
		return fmt.Errorf("fsm: restore: %w: snapshot of cluster %q, this is cluster %q", ErrForeignSnapshot, c, s.clusterName)
	}
	members := make(map[uint64]*waldenv1.Member, len(snap.GetMembers()))
	ids := make(map[string]bool, len(snap.GetMembers()))
	for _, m := range snap.GetMembers() {
		switch {
		case m.GetId() == "" || m.GetRaftId() == 0:
			return fmt.Errorf("fsm: restore: %w: member %q with raft id %d", ErrInvalidSnapshot, m.GetId(), m.GetRaftId())
		case ids[m.GetId()] || members[m.GetRaftId()] != nil:
			return fmt.Errorf("fsm: restore: %w: member %q (raft id %d) twice", ErrInvalidSnapshot, m.GetId(), m.GetRaftId())
		case m.GetRole() != "" && m.GetRole() != roleLearner:
			return fmt.Errorf("fsm: restore: %w: member %q has role %q", ErrInvalidSnapshot, m.GetId(), m.GetRole())
		}
		ids[m.GetId()] = true
		members[m.GetRaftId()] = proto.Clone(m).(*waldenv1.Member)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied = snap.GetAppliedIndex()
	s.lastAppliedUnixMs = snap.GetLastAppliedUnixMs()
	s.members = members
	s.noopCount = snap.GetNoopCount()
	return nil
}
