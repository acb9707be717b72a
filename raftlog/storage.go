package raftlog

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Storage is the durable raft log of one member: raft.Storage for reads plus
// the writes a raft node makes while handling a Ready. DiskStorage is the
// implementation; raft.MemoryStorage with a Save is the reference the
// differential test holds it against.
//
// Contract, beyond raft.Storage's own:
//   - Save writes the HardState (unless empty), the entries and the snapshot
//     (unless empty) of one Ready as one durable write, and returns only
//     once it is on disk (fsync). Entries overwrite any stored entries at the
//     same or higher index (a conflicting suffix is truncated). A snapshot
//     replaces the log when its index is beyond the last entry, otherwise it
//     discards the entries up to its index.
//   - After Save returns, every read method reflects it, also after a restart.
//     Exception: a HardState that moves only the commit index (raft.MustSync
//     false) may reach disk later, but no later than the next write and
//     always with a snapshot; a restart may then see a lower commit index.
//   - CreateSnapshot records the state machine's data at applied index i (which
//     must not exceed the last stored entry) and never loses entries after i.
//   - Compact(c) discards the entries up to and including c (FirstIndex
//     becomes c+1, as raft.MemoryStorage does); Term(c) stays answerable.
//   - Entries given to Save and returned by Entries may be shared (as
//     raft.MemoryStorage shares them): neither side changes an entry after
//     handing it over. Returned snapshots and HardStates are copies.
//   - IsEmpty reports whether nothing was ever saved (no HardState, no
//     entry, no snapshot): the member has never run and bootstraps from its
//     initial cluster.
//   - Methods are safe for concurrent use (raft reads while the node writes).
type Storage interface {
	raft.Storage
	IsEmpty() bool
	Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error
	CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error)
	Compact(compactIndex uint64) error
	Close() error
}
