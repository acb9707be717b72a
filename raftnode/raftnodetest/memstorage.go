package raftnodetest

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"walden/raftlog"
)

// MemStorage adapts raft.MemoryStorage to raftlog.Storage, for tests that
// need no disk: nothing survives the process, and Save does not sync.
type MemStorage struct {
	*raft.MemoryStorage
}

var _ raftlog.Storage = (*MemStorage)(nil)

// NewMemStorage returns an empty MemStorage.
func NewMemStorage() *MemStorage { return &MemStorage{raft.NewMemoryStorage()} }

// Save applies the snapshot, appends the entries and sets the HardState,
// in that order.
func (s *MemStorage) Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error {
	if !raft.IsEmptySnap(snap) {
		if err := s.ApplySnapshot(snap); err != nil {
			return err
		}
	}
	if len(ents) > 0 {
		if err := s.Append(ents); err != nil {
			return err
		}
	}
	if !raft.IsEmptyHardState(hs) {
		return s.SetHardState(hs)
	}
	return nil
}

// Close does nothing.
func (s *MemStorage) Close() error { return nil }

// IsEmpty is true until a HardState, an entry or a snapshot was saved.
func (s *MemStorage) IsEmpty() bool {
	hs, _, _ := s.InitialState()
	last, _ := s.LastIndex()
	snap, _ := s.Snapshot()
	return raft.IsEmptyHardState(hs) && last == 0 && raft.IsEmptySnap(snap)
}
