package raftnode

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
)

// Disaster recovery: writing the first log of a cluster restored from a
// backup, and shrinking a member's log to a cluster of one after the other
// members were lost (etcd's snapshot restore and --force-new-cluster). Both
// work offline on a raftlog.Storage that no node runs on, through its
// contract only.

var (
	// ErrStorageNotEmpty is returned when a restore is asked of a storage
	// that already holds a raft log.
	ErrStorageNotEmpty = errors.New("raftnode: the data dir already holds a raft log")
	// ErrNotVoterInLog is returned by ForceNewCluster for a member that is
	// not a voter in its log's latest configuration.
	ErrNotVoterInLog = errors.New("raftnode: not a voter in the latest configuration of its log")
	// ErrJointConfig is returned by ForceNewCluster for a log that holds a
	// joint configuration change (walden never proposes one).
	ErrJointConfig = errors.New("raftnode: joint configuration change in the log")
)

// restoredTerm is the term of a restored cluster's first snapshot: a new
// cluster starts its terms again.
const restoredTerm = 1

// WriteRestoredState writes into the empty storage st the first state of a
// cluster restored from a backup: a snapshot of the state machine data at
// index whose configuration has members as its only voters, committed. Every
// member of the new cluster writes the same from the same backup, so their
// logs agree; they elect a leader among themselves when they start.
func WriteRestoredState(st raftlog.Storage, index uint64, members []*waldenv1.MemberContext, data []byte) error {
	if !st.IsEmpty() {
		return ErrStorageNotEmpty
	}
	if index == 0 {
		return errors.New("raftnode: restore: the snapshot index is 0")
	}
	cs := &raftpb.ConfState{}
	for _, m := range members {
		cs.Voters = append(cs.Voters, RaftID(m.GetId()))
	}
	slices.Sort(cs.Voters)
	if len(cs.Voters) == 0 || len(slices.Compact(slices.Clone(cs.Voters))) != len(cs.Voters) {
		return fmt.Errorf("raftnode: restore: %d members with %d distinct raft ids", len(members), len(slices.Compact(slices.Clone(cs.Voters))))
	}
	snap := &raftpb.Snapshot{Data: data, Metadata: &raftpb.SnapshotMetadata{ConfState: cs, Index: new(index), Term: new(uint64(restoredTerm))}}
	hs := &raftpb.HardState{Term: new(uint64(restoredTerm)), Vote: new(uint64(0)), Commit: new(index)}
	if err := st.Save(hs, nil, snap); err != nil {
		return fmt.Errorf("raftnode: restore: %w", err)
	}
	return nil
}

// ForceNewCluster rewrites the log in st, of member nodeID, so that the
// member is the only voter once the log is applied: it appends, after the
// last entry, the removal of every other voter and learner of the log's
// latest configuration, and marks every entry committed. The node started
// on st afterwards applies the removals without needing a quorum and elects
// itself. It returns the raft ids removed (none when the member is already
// alone).
//
// Entries the member holds beyond its commit index are kept and committed:
// some of them may have been committed by the lost majority (and answered),
// none of them contradicts what this member applied. The state machine is
// the member's, as of its last entry.
//
// note, when set, is given the log as it was (ForcedLog) and returns the
// data of a normal entry appended after the removals (the state machine's
// record of the operation); nil data appends nothing.
func ForceNewCluster(st raftlog.Storage, nodeID string, note func(ForcedLog) ([]byte, error)) (removed []uint64, err error) {
	hs, _, err := st.InitialState()
	if err != nil {
		return nil, fmt.Errorf("raftnode: force new cluster: read state: %w", err)
	}
	snap, err := st.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("raftnode: force new cluster: read snapshot: %w", err)
	}
	first, err := st.FirstIndex()
	if err != nil {
		return nil, fmt.Errorf("raftnode: force new cluster: %w", err)
	}
	last, err := st.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("raftnode: force new cluster: %w", err)
	}
	cs := raftpb.EnsureConfState(proto.Clone(snap.GetMetadata().GetConfState()).(*raftpb.ConfState))
	voters := map[uint64]bool{}
	learners := map[uint64]bool{}
	for _, v := range cs.GetVoters() {
		voters[v] = true
	}
	for _, l := range cs.GetLearners() {
		learners[l] = true
	}
	if len(cs.GetVotersOutgoing()) > 0 || len(cs.GetLearnersNext()) > 0 {
		return nil, fmt.Errorf("raftnode: force new cluster: %w in the snapshot", ErrJointConfig)
	}
	from := max(first, snap.GetMetadata().GetIndex()+1)
	if from <= last {
		ents, err := st.Entries(from, last+1, math.MaxUint64)
		if err != nil {
			return nil, fmt.Errorf("raftnode: force new cluster: read entries %d..%d: %w", from, last, err)
		}
		for _, e := range ents {
			if e.GetType() != raftpb.EntryConfChange && e.GetType() != raftpb.EntryConfChangeV2 {
				continue
			}
			cc, err := decodeConfChange(e)
			if err != nil {
				return nil, fmt.Errorf("raftnode: force new cluster: %w", err)
			}
			if len(cc.GetChanges()) != 1 || cc.GetTransition() != raftpb.ConfChangeTransitionAuto {
				return nil, fmt.Errorf("raftnode: force new cluster: %w at index %d", ErrJointConfig, e.GetIndex())
			}
			ch := cc.GetChanges()[0]
			id := ch.GetNodeId()
			switch ch.GetType() {
			case raftpb.ConfChangeAddNode:
				voters[id], learners[id] = true, false
			case raftpb.ConfChangeAddLearnerNode:
				voters[id], learners[id] = false, true
			case raftpb.ConfChangeRemoveNode:
				voters[id], learners[id] = false, false
			}
		}
	}
	self := RaftID(nodeID)
	if !voters[self] {
		return nil, fmt.Errorf("raftnode: force new cluster: member %q: %w", nodeID, ErrNotVoterInLog)
	}
	for id, v := range voters {
		if v && id != self {
			removed = append(removed, id)
		}
	}
	for id, l := range learners {
		if l && id != self {
			removed = append(removed, id)
		}
	}
	slices.Sort(removed)
	if len(removed) == 0 && hs.GetCommit() == last {
		return nil, nil
	}
	term := hs.GetTerm()
	var ents []*raftpb.Entry
	for i, id := range removed {
		data, err := proto.Marshal(&raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(id)})
		if err != nil {
			return nil, fmt.Errorf("raftnode: force new cluster: %w", err)
		}
		ents = append(ents, &raftpb.Entry{Type: raftpb.EntryConfChange.Enum(), Term: new(term), Index: new(last + uint64(i) + 1), Data: data})
	}
	if note != nil {
		data, err := note(ForcedLog{LastIndex: last, CommitIndex: hs.GetCommit(), Term: term, Removed: removed})
		if err != nil {
			return nil, fmt.Errorf("raftnode: force new cluster: %w", err)
		}
		if data != nil {
			ents = append(ents, &raftpb.Entry{Type: raftpb.EntryNormal.Enum(), Term: new(term), Index: new(last + uint64(len(ents)) + 1), Data: data})
		}
	}
	commit := last + uint64(len(ents))
	if err := st.Save(&raftpb.HardState{Term: new(term), Vote: new(hs.GetVote()), Commit: new(commit)}, ents, nil); err != nil {
		return nil, fmt.Errorf("raftnode: force new cluster: %w", err)
	}
	return removed, nil
}

// ForcedLog is a member's log as ForceNewCluster found it.
type ForcedLog struct {
	// LastIndex is the last entry; CommitIndex the highest index the
	// member knew committed; Term its term. Whatever the lost members
	// committed beyond LastIndex is lost.
	LastIndex, CommitIndex, Term uint64
	// Removed are the raft ids removed from the configuration.
	Removed []uint64
}

// decodeConfChange decodes a configuration change entry as a V2 change.
func decodeConfChange(e *raftpb.Entry) (*raftpb.ConfChangeV2, error) {
	if e.GetType() == raftpb.EntryConfChange {
		v1 := new(raftpb.ConfChange)
		if err := proto.Unmarshal(e.GetData(), v1); err != nil {
			return nil, fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
		}
		return v1.AsV2(), nil
	}
	cc := new(raftpb.ConfChangeV2)
	if err := proto.Unmarshal(e.GetData(), cc); err != nil {
		return nil, fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
	}
	return cc, nil
}
