package raftnode

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Errors of the durable raft storage.
var (
	// ErrForeignDataDir is returned by OpenStorage when the data directory
	// belongs to another cluster name or node id than the configuration says,
	// or holds files that are not a walden raft log. Nothing in it is changed.
	ErrForeignDataDir = errors.New("data directory belongs to another cluster or node")
	// ErrDamagedDataDir is returned by OpenStorage when raft.db is not a
	// readable bbolt file, lacks its meta record or buckets, has an unknown
	// format version, or its log is inconsistent with its snapshot. Nothing in
	// the directory is changed.
	ErrDamagedDataDir = errors.New("data directory is damaged")
	// ErrDataDirInUse is returned by OpenStorage when another process holds
	// the lock on raft.db.
	ErrDataDirInUse = errors.New("data directory is in use by another process")
	// ErrInvalidSave is returned by Save when the entries or the snapshot do not
	// fit the stored log: a gap after the last entry, a batch that is not
	// contiguous, or entries that would overwrite what the stored snapshot
	// covers. Nothing is written.
	ErrInvalidSave = errors.New("save does not fit the stored log")
	// ErrCompactBeyondSnapshot is returned by Compact when compactIndex is
	// beyond the stored snapshot: the entries between them could then be
	// rebuilt neither from the log nor from the snapshot.
	ErrCompactBeyondSnapshot = errors.New("compaction beyond the stored snapshot")
	// ErrStorageFailed is returned by every method after a write to disk
	// failed: what is on disk is then unknown and the member must restart.
	ErrStorageFailed = errors.New("storage failed")
	// ErrStorageClosed is returned by every method after Close.
	ErrStorageClosed = errors.New("storage closed")
)

// storageFormatVersion is the layout version of raft.db written in the meta
// bucket. A file with another version is refused as damaged.
const storageFormatVersion uint32 = 1

// Names inside the data directory and raft.db.
const (
	storageFileName     = "raft.db"
	storageInitFileName = "raft.db.init"

	keyFormatVersion = "format_version"
	keyClusterName   = "cluster_name"
	keyNodeID        = "node_id"
	keyRaftID        = "raft_id"
	keyHardState     = "hard_state"
	keyConfState     = "conf_state"
	keySnapshot      = "snapshot"
)

var (
	bucketMeta    = []byte("meta")
	bucketEntries = []byte("entries")
	bucketState   = []byte("state")
)

// storageRaftID is the numeric raft id of the member named nodeID, recorded
// in the meta bucket: the first 8 bytes of SHA-256(nodeID), big-endian, with
// 0 (raft's "no node") mapped to 1 — the node's own derivation, repeated here
// so that the storage stands alone.
func storageRaftID(nodeID string) uint64 {
	sum := sha256.Sum256([]byte(nodeID))
	id := binary.BigEndian.Uint64(sum[:8])
	if id == 0 {
		id = 1
	}
	return id
}

// BoltStorage is the durable raft log of one member in a bbolt file,
// dir/raft.db. It implements Storage.
//
// Contract, beyond raft.Storage's own (and checked against raft.MemoryStorage
// by a differential test):
//   - Save writes the HardState (unless empty), the entries and the snapshot
//     (unless empty) of one Ready in one bbolt transaction, and returns only
//     once it is on disk (fsync). Entries overwrite any stored entries at the
//     same or higher index (a conflicting suffix is truncated); entries below
//     FirstIndex are ignored. A snapshot replaces the log when its index is
//     beyond the last entry or the stored entry at its index has another
//     term; otherwise it discards the entries up to its index and keeps the
//     rest. The snapshot is applied before the entries of the same call.
//     A snapshot not newer than the stored one fails with
//     raft.ErrSnapOutOfDate; a gap, a non-contiguous batch or entries that
//     overwrite what the stored snapshot covers fail with ErrInvalidSave.
//     A failed Save writes nothing.
//   - After Save returns, every read method reflects it, also after a restart,
//     with one exception (raft.MustSync's): a Save of only a HardState that
//     differs from the stored one in its commit index alone writes nothing.
//     InitialState reflects it at once; it reaches disk with the next write
//     (Save of entries or a snapshot, CreateSnapshot, Compact) or Close. A
//     crash before that restarts the member with a lower commit index, which
//     raft relearns from the leader; term, vote and entries, which are what
//     the member promised to others, are always on disk before Save returns,
//     and a snapshot is never on disk with a commit index below its own.
//   - CreateSnapshot records the state machine's data at applied index i
//     (FirstIndex-1 <= snapshot index < i <= LastIndex, else
//     raft.ErrSnapOutOfDate / ErrUnavailable) and never loses entries after i;
//     a nil ConfState keeps the previous one. It is durable when it returns.
//   - Compact(c) discards the entries up to and including c: FirstIndex
//     becomes c+1 and Term(c) stays answerable (as in raft.MemoryStorage).
//     c must lie in (FirstIndex-1, LastIndex] (else raft.ErrCompacted /
//     ErrUnavailable) and not beyond the stored snapshot
//     (ErrCompactBeyondSnapshot), so that the log plus the snapshot always
//     rebuild the state: FirstIndex-1 <= snapshot index <= LastIndex.
//   - Where raft.MemoryStorage panics on an out-of-range argument (Entries
//     beyond LastIndex+1, CreateSnapshot or Compact beyond LastIndex),
//     BoltStorage returns an error wrapping raft.ErrUnavailable.
//   - Returned entries and snapshots are copies: neither side mutates them.
//   - Methods are safe for concurrent use (raft reads while the node writes).
//     FirstIndex, LastIndex, InitialState and Term(FirstIndex-1) are served
//     from a cache that is updated only after a transaction committed; the
//     other reads go to disk.
//   - After a write to disk failed, every method returns ErrStorageFailed;
//     after Close, ErrStorageClosed.
//
// Layout of raft.db (all integers big-endian):
//   - bucket "meta": format_version (uint32), cluster_name, node_id,
//     raft_id (uint64, derived from node_id as the node derives it).
//   - bucket "entries": key = index (uint64), value = marshaled raftpb.Entry.
//     The first key is the compaction point FirstIndex-1, whose value keeps
//     only its index and term; index 0 term 0 in a new log.
//   - bucket "state": hard_state (raftpb.HardState), snapshot (raftpb.Snapshot,
//     metadata and data) and conf_state (raftpb.ConfState, the snapshot's),
//     each absent until first written.
type BoltStorage struct {
	db     *bolt.DB
	path   string
	raftID uint64
	logger *slog.Logger

	mu sync.RWMutex
	// failed is set once a write transaction failed to commit, or the
	// storage was closed; every method then returns it.
	failed error
	closed bool
	// offset is the compaction point: the index of the first key in the
	// entries bucket, FirstIndex()-1. offsetTerm is its term.
	offset, offsetTerm uint64
	// last is the index of the last stored entry (offset if none).
	last uint64
	// hardState is nil until one was saved.
	hardState *raftpb.HardState
	// hardStateUnsynced is set when hardState moved only its commit index
	// since it was last written (see the contract): the next write
	// transaction writes it.
	hardStateUnsynced bool
	// snapMeta is the stored snapshot's metadata (zero values when none).
	snapMeta *raftpb.SnapshotMetadata
}

var _ Storage = (*BoltStorage)(nil)

// RaftID is the numeric raft id recorded in the data directory.
func (s *BoltStorage) RaftID() uint64 { return s.raftID }

// Path is the path of the bbolt file.
func (s *BoltStorage) Path() string { return s.path }

// IsEmpty reports whether the storage holds no HardState, no entries and no
// snapshot: the member has never run and must bootstrap from its initial
// cluster.
func (s *BoltStorage) IsEmpty() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.hardState == nil && s.last == 0 && s.offset == 0 && s.snapMeta.GetIndex() == 0
}

// InitialState implements raft.Storage.
func (s *BoltStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return nil, nil, s.failed
	}
	var hs *raftpb.HardState
	if s.hardState != nil {
		hs = proto.Clone(s.hardState).(*raftpb.HardState)
	}
	cs := proto.Clone(s.snapMeta.GetConfState()).(*raftpb.ConfState)
	return hs, raftpb.EnsureConfState(cs), nil
}

// Entries implements raft.Storage.
func (s *BoltStorage) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return nil, s.failed
	}
	if lo <= s.offset {
		return nil, raft.ErrCompacted
	}
	if hi > s.last+1 {
		return nil, fmt.Errorf("raftnode: entries [%d, %d) beyond last index %d: %w", lo, hi, s.last, raft.ErrUnavailable)
	}
	if s.last == s.offset {
		return nil, raft.ErrUnavailable
	}
	if lo > hi {
		return nil, fmt.Errorf("raftnode: entries [%d, %d): empty range: %w", lo, hi, raft.ErrUnavailable)
	}
	ents := make([]*raftpb.Entry, 0, min(hi-lo, 64))
	var size uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEntries).Cursor()
		next := lo
		for k, v := c.Seek(uint64Key(lo)); next < hi; k, v = c.Next() {
			if k == nil || binary.BigEndian.Uint64(k) != next {
				return fmt.Errorf("raftnode: entry %d missing from %s: %w", next, s.path, ErrDamagedDataDir)
			}
			e := &raftpb.Entry{}
			if err := proto.Unmarshal(v, e); err != nil {
				return fmt.Errorf("raftnode: decode entry %d: %w: %v", next, ErrDamagedDataDir, err)
			}
			size += uint64(proto.Size(e))
			if len(ents) > 0 && size > maxSize {
				break
			}
			ents = append(ents, e)
			next++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ents, nil
}

// Term implements raft.Storage.
func (s *BoltStorage) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return 0, s.failed
	}
	return s.termLocked(i)
}

// termLocked answers Term with s.mu held.
func (s *BoltStorage) termLocked(i uint64) (uint64, error) {
	switch {
	case i < s.offset:
		return 0, raft.ErrCompacted
	case i > s.last:
		return 0, raft.ErrUnavailable
	case i == s.offset:
		return s.offsetTerm, nil
	}
	var term uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		e, err := readEntry(tx.Bucket(bucketEntries), i)
		if err != nil {
			return err
		}
		term = e.GetTerm()
		return nil
	})
	return term, err
}

// LastIndex implements raft.Storage.
func (s *BoltStorage) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return 0, s.failed
	}
	return s.last, nil
}

// FirstIndex implements raft.Storage.
func (s *BoltStorage) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return 0, s.failed
	}
	return s.offset + 1, nil
}

// Snapshot implements raft.Storage. It reads the snapshot's data from disk.
func (s *BoltStorage) Snapshot() (*raftpb.Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return nil, s.failed
	}
	snap := &raftpb.Snapshot{}
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketState).Get([]byte(keySnapshot))
		if v == nil {
			return nil
		}
		if err := proto.Unmarshal(v, snap); err != nil {
			return fmt.Errorf("raftnode: decode snapshot: %w: %v", ErrDamagedDataDir, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return raftpb.EnsureSnapshot(snap), nil
}

// Save implements Storage: the snapshot, the entries and the HardState of one
// Ready in one fsynced transaction.
func (s *BoltStorage) Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return s.failed
	}
	// Plan the change against the cache; nothing is written on refusal.
	offset, offsetTerm, last := s.offset, s.offsetTerm, s.last
	var (
		newSnap    *raftpb.Snapshot
		keepSuffix bool
	)
	if !raft.IsEmptySnap(snap) {
		idx, term := snap.GetMetadata().GetIndex(), snap.GetMetadata().GetTerm()
		if cur := s.snapMeta.GetIndex(); cur != 0 && cur >= idx {
			return fmt.Errorf("raftnode: save snapshot %d over snapshot %d: %w", idx, cur, raft.ErrSnapOutOfDate)
		}
		if idx > offset && idx <= last {
			t, err := s.termLocked(idx)
			if err != nil {
				return err
			}
			keepSuffix = t == term
		}
		newSnap = raftpb.EnsureSnapshot(proto.Clone(snap).(*raftpb.Snapshot))
		offset, offsetTerm = idx, term
		if !keepSuffix {
			last = idx
		}
	}
	snapIndex := s.snapMeta.GetIndex()
	if newSnap != nil {
		snapIndex = newSnap.GetMetadata().GetIndex()
	}
	var toWrite []*raftpb.Entry
	if len(ents) > 0 {
		for i := 1; i < len(ents); i++ {
			if ents[i].GetIndex() != ents[i-1].GetIndex()+1 {
				return fmt.Errorf("raftnode: save entries: index %d follows %d: %w", ents[i].GetIndex(), ents[i-1].GetIndex(), ErrInvalidSave)
			}
		}
		first := ents[0].GetIndex()
		if lastNew := first + uint64(len(ents)) - 1; lastNew > offset {
			toWrite = ents
			if first <= offset {
				toWrite = ents[offset+1-first:]
				first = offset + 1
			}
			if first > last+1 {
				return fmt.Errorf("raftnode: save entries from %d: last index is %d: %w", first, last, ErrInvalidSave)
			}
			if first <= snapIndex {
				return fmt.Errorf("raftnode: save entries from %d: would overwrite entries covered by snapshot %d: %w", first, snapIndex, ErrInvalidSave)
			}
		}
	}
	var newHS *raftpb.HardState
	if !raft.IsEmptyHardState(hs) {
		newHS = proto.Clone(hs).(*raftpb.HardState)
	}
	if newSnap == nil && len(toWrite) == 0 && newHS == nil {
		return nil
	}
	if newSnap == nil && len(toWrite) == 0 && s.hardState != nil &&
		newHS.GetTerm() == s.hardState.GetTerm() && newHS.GetVote() == s.hardState.GetVote() {
		// Only the commit index moved: nothing this member promised to
		// others depends on it (raft.MustSync), so skip the fsync, as etcd
		// does. Here that means no transaction at all: a bbolt transaction
		// without fsync may be reordered by the disk and leave a meta page
		// pointing at unwritten pages after a power loss. The commit index
		// is written by the next transaction.
		s.hardState = newHS
		s.hardStateUnsynced = true
		return nil
	}
	if newHS == nil && s.hardStateUnsynced {
		newHS = s.hardState
	}

	err := s.db.Update(func(tx *bolt.Tx) error {
		eb, sb := tx.Bucket(bucketEntries), tx.Bucket(bucketState)
		if newSnap != nil {
			// Drop the entries the snapshot covers (all of them unless the
			// suffix after it matches) and keep its index and term as the
			// compaction point.
			upTo := newSnap.GetMetadata().GetIndex()
			if !keepSuffix {
				upTo = s.last
			}
			if err := deleteRange(eb, s.offset, upTo); err != nil {
				return err
			}
			if err := putEntry(eb, &raftpb.Entry{Index: new(offset), Term: new(offsetTerm)}); err != nil {
				return err
			}
			if err := putProto(sb, keySnapshot, newSnap); err != nil {
				return err
			}
			if err := putProto(sb, keyConfState, newSnap.GetMetadata().GetConfState()); err != nil {
				return err
			}
		}
		if len(toWrite) > 0 {
			if err := deleteRange(eb, toWrite[0].GetIndex(), last); err != nil {
				return err
			}
			for _, e := range toWrite {
				if err := putEntry(eb, e); err != nil {
					return err
				}
			}
		}
		if newHS != nil {
			if err := putProto(sb, keyHardState, newHS); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.fail("save", err)
	}
	if newSnap != nil {
		s.snapMeta = newSnap.GetMetadata()
	}
	if len(toWrite) > 0 {
		last = toWrite[len(toWrite)-1].GetIndex()
	}
	s.offset, s.offsetTerm, s.last = offset, offsetTerm, last
	if newHS != nil {
		s.hardState = newHS
		s.hardStateUnsynced = false
	}
	return nil
}

// putUnsyncedHardStateLocked writes the HardState whose commit index Save
// left in memory, inside a write transaction (s.mu held).
func (s *BoltStorage) putUnsyncedHardStateLocked(tx *bolt.Tx) error {
	if !s.hardStateUnsynced {
		return nil
	}
	return putProto(tx.Bucket(bucketState), keyHardState, s.hardState)
}

// CreateSnapshot implements Storage.
func (s *BoltStorage) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return nil, s.failed
	}
	if i <= s.snapMeta.GetIndex() {
		return nil, raft.ErrSnapOutOfDate
	}
	if i > s.last {
		return nil, fmt.Errorf("raftnode: create snapshot at %d beyond last index %d: %w", i, s.last, raft.ErrUnavailable)
	}
	term, err := s.termLocked(i)
	if err != nil {
		return nil, err
	}
	meta := proto.Clone(s.snapMeta).(*raftpb.SnapshotMetadata)
	meta.Index, meta.Term = new(i), new(term)
	if cs != nil {
		meta.ConfState = proto.Clone(cs).(*raftpb.ConfState)
	}
	snap := &raftpb.Snapshot{Metadata: meta, Data: data}
	err = s.db.Update(func(tx *bolt.Tx) error {
		sb := tx.Bucket(bucketState)
		if err := putProto(sb, keySnapshot, snap); err != nil {
			return err
		}
		// The commit index on disk must not stay below the snapshot's
		// index (raft refuses to restart so).
		if err := s.putUnsyncedHardStateLocked(tx); err != nil {
			return err
		}
		return putProto(sb, keyConfState, meta.GetConfState())
	})
	if err != nil {
		return nil, s.fail("create snapshot", err)
	}
	s.snapMeta = meta
	s.hardStateUnsynced = false
	return proto.Clone(snap).(*raftpb.Snapshot), nil
}

// Compact implements Storage.
func (s *BoltStorage) Compact(compactIndex uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return s.failed
	}
	if compactIndex <= s.offset {
		return raft.ErrCompacted
	}
	if compactIndex > s.last {
		return fmt.Errorf("raftnode: compact %d beyond last index %d: %w", compactIndex, s.last, raft.ErrUnavailable)
	}
	if snap := s.snapMeta.GetIndex(); compactIndex > snap {
		return fmt.Errorf("raftnode: compact %d: snapshot is at %d: %w", compactIndex, snap, ErrCompactBeyondSnapshot)
	}
	term, err := s.termLocked(compactIndex)
	if err != nil {
		return err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		eb := tx.Bucket(bucketEntries)
		if err := deleteRange(eb, s.offset, compactIndex); err != nil {
			return err
		}
		if err := s.putUnsyncedHardStateLocked(tx); err != nil {
			return err
		}
		return putEntry(eb, &raftpb.Entry{Index: new(compactIndex), Term: new(term)})
	})
	if err != nil {
		return s.fail("compact", err)
	}
	s.offset, s.offsetTerm = compactIndex, term
	s.hardStateUnsynced = false
	return nil
}

// Close closes the bbolt file; later calls return ErrStorageClosed. Closing
// twice is harmless.
func (s *BoltStorage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	// Write a commit index that Save left in memory.
	var flushErr error
	if s.failed == nil && s.hardStateUnsynced {
		if err := s.db.Update(s.putUnsyncedHardStateLocked); err != nil {
			flushErr = s.fail("write hard state on close", err)
		} else {
			s.hardStateUnsynced = false
		}
	}
	if s.failed == nil {
		s.failed = fmt.Errorf("raftnode: storage %s: %w", s.path, ErrStorageClosed)
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("raftnode: close storage %s: %w", s.path, err)
	}
	return flushErr
}

// fail records a failed write transaction: the state on disk is unknown, so
// every later call returns the error.
func (s *BoltStorage) fail(op string, err error) error {
	s.failed = fmt.Errorf("raftnode: %s in %s: %w: %w", op, s.path, ErrStorageFailed, err)
	s.logger.Error("raft storage write failed; the member must restart", "op", op, "path", s.path, "err", err)
	return s.failed
}

func uint64Key(i uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), i)
}

func putEntry(b *bolt.Bucket, e *raftpb.Entry) error {
	v, err := proto.Marshal(e)
	if err != nil {
		return fmt.Errorf("raftnode: encode entry %d: %w", e.GetIndex(), err)
	}
	return b.Put(uint64Key(e.GetIndex()), v)
}

func putProto(b *bolt.Bucket, key string, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("raftnode: encode %s: %w", key, err)
	}
	return b.Put([]byte(key), v)
}

// readEntry decodes the entry at index i; the result does not refer to the
// transaction's memory.
func readEntry(b *bolt.Bucket, i uint64) (*raftpb.Entry, error) {
	v := b.Get(uint64Key(i))
	if v == nil {
		return nil, fmt.Errorf("raftnode: entry %d missing: %w", i, ErrDamagedDataDir)
	}
	e := &raftpb.Entry{}
	if err := proto.Unmarshal(v, e); err != nil {
		return nil, fmt.Errorf("raftnode: decode entry %d: %w: %v", i, ErrDamagedDataDir, err)
	}
	return e, nil
}

// deleteRange deletes the entries with from <= index <= to.
func deleteRange(b *bolt.Bucket, from, to uint64) error {
	if from > to {
		return nil
	}
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(uint64Key(from)); k != nil && binary.BigEndian.Uint64(k) <= to; k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("raftnode: delete entry %d: %w", binary.BigEndian.Uint64(k), err)
		}
	}
	return nil
}
