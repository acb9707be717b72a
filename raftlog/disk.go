package raftlog

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Errors of the durable raft storage.
var (
	// ErrForeignDataDir is returned by Open when the data directory
	// belongs to another cluster name or node id than the configuration says,
	// or holds files that are not a walden raft log. Nothing in it is changed.
	ErrForeignDataDir = errors.New("data directory belongs to another cluster or node")
	// ErrDamagedDataDir is returned by Open when raft.db or a segment
	// of the raft log is unreadable, incomplete or inconsistent: a bbolt file
	// that does not check out, an unknown format version, a segment missing
	// or with a damaged frame, a log that does not fit its snapshot. The
	// message names the file and, in a segment, the offset. Nothing in the
	// directory is changed.
	ErrDamagedDataDir = errors.New("data directory is damaged")
	// ErrDataDirInUse is returned by Open when another process holds
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

// RaftID is the numeric raft id of the member named nodeID, recorded in
// raft.db and in every segment: the first 8 bytes of SHA-256(nodeID),
// big-endian, never zero (raft reserves 0 for "none"; a zero hash maps to
// 1). Every member derives the same id from the same name, so ids need no
// coordination; raftnode.RaftID is this function.
func RaftID(nodeID string) uint64 {
	sum := sha256.Sum256([]byte(nodeID))
	id := binary.BigEndian.Uint64(sum[:8])
	if id == 0 {
		id = 1
	}
	return id
}

// DiskStorage is the durable raft log of one member: the entries and the
// HardState in an append-only log of segment files (dir/raftlog/), the
// snapshots and the directory's identity in a bbolt file (dir/raft.db). It
// implements Storage; docs/raft-storage.md describes the layout and the
// crash argument.
//
// Contract, beyond raft.Storage's own (and checked against raft.MemoryStorage
// by a differential test):
//   - Save writes the HardState (unless empty), the entries and the snapshot
//     position (unless empty) of one Ready as one frame of the log, with one
//     write and one fdatasync, and returns only once it is on disk. A
//     snapshot's data goes to raft.db first (a bbolt transaction); it counts
//     only once the frame that names it is on disk. Entries overwrite any
//     stored entries at the same or higher index (a conflicting suffix is
//     truncated); entries below FirstIndex are ignored. A snapshot replaces
//     the log when its index is beyond the last entry or the stored entry at
//     its index has another term; otherwise it discards the entries up to its
//     index and keeps the rest. The snapshot is applied before the entries of
//     the same call. A snapshot not newer than the stored one fails with
//     raft.ErrSnapOutOfDate; a gap, a non-contiguous batch or entries that
//     overwrite what the stored snapshot covers fail with ErrInvalidSave.
//     A failed Save writes nothing.
//   - After Save returns, every read method reflects it, also after a
//     restart, with one exception (raft.MustSync's): a Save of only a
//     HardState that differs from the stored one in its commit index alone
//     writes nothing. InitialState reflects it at once; it reaches disk with
//     the next write (Save of entries or a snapshot, CreateSnapshot, Compact)
//     or Close. A crash before that restarts the member with a lower commit
//     index, which raft relearns from the leader; term, vote and entries,
//     which are what the member promised to others, are always on disk
//     before Save returns, and a snapshot is never on disk with a commit
//     index below its own.
//   - CreateSnapshot records the state machine's data at applied index i
//     (FirstIndex-1 <= snapshot index < i <= LastIndex, else
//     raft.ErrSnapOutOfDate / ErrUnavailable) and never loses entries after i;
//     a nil ConfState keeps the previous one. It is durable when it returns.
//   - Compact(c) discards the entries up to and including c: FirstIndex
//     becomes c+1 and Term(c) stays answerable (as in raft.MemoryStorage).
//     c must lie in (FirstIndex-1, LastIndex] (else raft.ErrCompacted /
//     ErrUnavailable) and not beyond the stored snapshot
//     (ErrCompactBeyondSnapshot), so that the log plus the snapshot always
//     rebuild the state: FirstIndex-1 <= snapshot index <= LastIndex. It is
//     durable when it returns, and deletes the segments it made useless.
//   - Where raft.MemoryStorage panics on an out-of-range argument (Entries
//     beyond LastIndex+1, CreateSnapshot or Compact beyond LastIndex),
//     DiskStorage returns an error wrapping raft.ErrUnavailable.
//   - Entries are shared, as raft.MemoryStorage shares them: the entries
//     given to Save are kept, and Entries returns them; neither side changes
//     an entry after handing it over. Snapshots and HardStates are copies.
//   - Methods are safe for concurrent use (raft reads while the node writes).
//     The log since the compaction point is held in memory and every read
//     but Snapshot is served from it; a write does its disk I/O without
//     blocking the reads and changes what they see only once it is durable.
//   - After a write to disk failed, every method returns ErrStorageFailed;
//     after Close, ErrStorageClosed.
type DiskStorage struct {
	dir    string
	path   string // raft.db
	db     *bolt.DB
	raftID uint64
	logger *slog.Logger
	opts   storageOptions

	// wmu serializes the writes (Save, CreateSnapshot, Compact, Close).
	// They plan against the image, do their I/O without holding mu and
	// then apply the change under mu, so raft's reads never wait for a
	// disk flush.
	wmu sync.Mutex
	log *segmentWriter
	// hsUnsynced is set when the image's HardState moved only its commit
	// index since it was last written (see the contract): the next write
	// carries it.
	hsUnsynced bool

	mu sync.RWMutex
	// failed is set once a write failed, or the storage was closed; every
	// method then returns it.
	failed error
	closed bool
	img    logImage
	// snapMeta is the metadata of the snapshot img.snapIndex names (zero
	// values when none), with its ConfState.
	snapMeta *raftpb.SnapshotMetadata
}

var _ Storage = (*DiskStorage)(nil)

// RaftID is the numeric raft id recorded in the data directory.
func (s *DiskStorage) RaftID() uint64 { return s.raftID }

// Dir is the data directory.
func (s *DiskStorage) Dir() string { return s.dir }

// IsEmpty reports whether the storage holds no HardState, no entries and no
// snapshot: the member has never run and must bootstrap from its initial
// cluster.
func (s *DiskStorage) IsEmpty() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.img.hs == nil && s.img.last() == 0 && s.img.offset == 0 && s.img.snapIndex == 0
}

// InitialState implements raft.Storage.
func (s *DiskStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return nil, nil, s.failed
	}
	var hs *raftpb.HardState
	if s.img.hs != nil {
		hs = proto.Clone(s.img.hs).(*raftpb.HardState)
	}
	cs := proto.Clone(s.snapMeta.GetConfState()).(*raftpb.ConfState)
	return hs, raftpb.EnsureConfState(cs), nil
}

// Entries implements raft.Storage.
func (s *DiskStorage) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return nil, s.failed
	}
	last := s.img.last()
	switch {
	case lo <= s.img.offset:
		return nil, raft.ErrCompacted
	case hi > last+1:
		return nil, fmt.Errorf("raftlog: entries [%d, %d) beyond last index %d: %w", lo, hi, last, raft.ErrUnavailable)
	case last == s.img.offset:
		return nil, raft.ErrUnavailable
	case lo > hi:
		return nil, fmt.Errorf("raftlog: entries [%d, %d): empty range: %w", lo, hi, raft.ErrUnavailable)
	}
	ents := s.img.slice(lo, hi)
	if maxSize == math.MaxUint64 || len(ents) <= 1 {
		return ents, nil
	}
	// As raft.MemoryStorage: the first entry always, then as many as fit.
	size := uint64(proto.Size(ents[0]))
	for k := 1; k < len(ents); k++ {
		size += uint64(proto.Size(ents[k]))
		if size > maxSize {
			return ents[:k:k], nil
		}
	}
	return ents, nil
}

// Term implements raft.Storage.
func (s *DiskStorage) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return 0, s.failed
	}
	return s.img.term(i)
}

// LastIndex implements raft.Storage.
func (s *DiskStorage) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return 0, s.failed
	}
	return s.img.last(), nil
}

// FirstIndex implements raft.Storage.
func (s *DiskStorage) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return 0, s.failed
	}
	return s.img.offset + 1, nil
}

// Snapshot implements raft.Storage. It reads the snapshot's data from
// raft.db.
func (s *DiskStorage) Snapshot() (*raftpb.Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.failed != nil {
		return nil, s.failed
	}
	if s.img.snapIndex == 0 {
		return raftpb.EnsureSnapshot(&raftpb.Snapshot{}), nil
	}
	// Holding mu keeps the snapshot the image names in raft.db: a later
	// snapshot deletes it only after the image moved past it.
	snap, err := readSnapshot(s.db, s.img.snapIndex)
	if err != nil {
		return nil, fmt.Errorf("raftlog: read snapshot %d from %s: %w", s.img.snapIndex, s.path, err)
	}
	return snap, nil
}

// Save implements Storage: the snapshot position, the entries and the
// HardState of one Ready in one frame, written and fdatasynced once.
func (s *DiskStorage) Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// Only writers change the image, and wmu is held: read it freely.
	if err := s.err(); err != nil {
		return err
	}
	p, err := s.img.planSave(hs, ents, snap)
	if err != nil {
		return err
	}
	if p.snap == nil && len(p.ents) == 0 && p.hs == nil {
		return nil
	}
	var newHS *raftpb.HardState
	if p.hs != nil {
		newHS = proto.Clone(p.hs).(*raftpb.HardState)
	}
	if cur := s.img.hs; p.snap == nil && len(p.ents) == 0 && cur != nil &&
		newHS.GetTerm() == cur.GetTerm() && newHS.GetVote() == cur.GetVote() {
		// Only the commit index moved: nothing this member promised to
		// others depends on it (raft.MustSync), so skip the write and its
		// fdatasync, as etcd does. The next write carries it.
		s.mu.Lock()
		s.img.hs = newHS
		s.mu.Unlock()
		s.hsUnsynced = true
		return nil
	}
	if newHS == nil && s.hsUnsynced {
		newHS = s.img.hs
	}

	var newSnap *raftpb.Snapshot
	if p.snap != nil {
		// The snapshot's data first: the frame below makes it count.
		newSnap = raftpb.EnsureSnapshot(proto.Clone(p.snap).(*raftpb.Snapshot))
		if err := s.putSnapshot(newSnap); err != nil {
			return s.fail("save snapshot", err)
		}
	}
	fb := s.log.frame()
	if newSnap != nil {
		fb.addUint64s(recSnapshot, newSnap.GetMetadata().GetIndex(), newSnap.GetMetadata().GetTerm())
	}
	for _, e := range p.ents {
		if err := fb.addProto(recEntry, e); err != nil {
			return err
		}
	}
	if newHS != nil {
		if err := fb.addProto(recHardState, newHS); err != nil {
			return err
		}
	}
	if err := s.log.write(); err != nil {
		return s.fail("save", err)
	}

	s.mu.Lock()
	if newSnap != nil {
		s.img.applySnapshot(newSnap.GetMetadata().GetIndex(), newSnap.GetMetadata().GetTerm())
		s.snapMeta = newSnap.GetMetadata()
	}
	s.img.appendEntries(p.ents)
	if newHS != nil {
		s.img.hs = newHS
		s.hsUnsynced = false
	}
	s.mu.Unlock()
	return nil
}

// CreateSnapshot implements Storage.
func (s *DiskStorage) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.err(); err != nil {
		return nil, err
	}
	if i <= s.img.snapIndex {
		return nil, raft.ErrSnapOutOfDate
	}
	if last := s.img.last(); i > last {
		return nil, fmt.Errorf("raftlog: create snapshot at %d beyond last index %d: %w", i, last, raft.ErrUnavailable)
	}
	term, err := s.img.term(i)
	if err != nil {
		return nil, err
	}
	meta := proto.Clone(s.snapMeta).(*raftpb.SnapshotMetadata)
	meta.Index, meta.Term = new(i), new(term)
	if cs != nil {
		meta.ConfState = proto.Clone(cs).(*raftpb.ConfState)
	}
	snap := raftpb.EnsureSnapshot(&raftpb.Snapshot{Metadata: meta, Data: data})
	if err := s.putSnapshot(snap); err != nil {
		return nil, s.fail("create snapshot", err)
	}
	fb := s.log.frame()
	fb.addUint64s(recSnapshotTaken, i, term)
	// The commit index on disk must not stay below the snapshot's index
	// (raft refuses to restart so).
	if err := s.addUnsyncedHardState(fb); err != nil {
		return nil, err
	}
	if err := s.log.write(); err != nil {
		return nil, s.fail("create snapshot", err)
	}
	s.mu.Lock()
	s.img.snapIndex, s.img.snapTerm = i, term
	s.snapMeta = snap.GetMetadata()
	s.mu.Unlock()
	s.hsUnsynced = false
	return proto.Clone(snap).(*raftpb.Snapshot), nil
}

// Compact implements Storage. Once the log spans more than one segment, it
// also writes the live log as a checkpoint at the start of a new segment and
// deletes the older ones.
func (s *DiskStorage) Compact(compactIndex uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.err(); err != nil {
		return err
	}
	if compactIndex <= s.img.offset {
		return raft.ErrCompacted
	}
	if last := s.img.last(); compactIndex > last {
		return fmt.Errorf("raftlog: compact %d beyond last index %d: %w", compactIndex, last, raft.ErrUnavailable)
	}
	if compactIndex > s.img.snapIndex {
		return fmt.Errorf("raftlog: compact %d: snapshot is at %d: %w", compactIndex, s.img.snapIndex, ErrCompactBeyondSnapshot)
	}
	term, err := s.img.term(compactIndex)
	if err != nil {
		return err
	}
	fb := s.log.frame()
	fb.addUint64s(recCompact, compactIndex, term)
	if err := s.addUnsyncedHardState(fb); err != nil {
		return err
	}
	if err := s.log.write(); err != nil {
		return s.fail("compact", err)
	}
	s.mu.Lock()
	s.img.compact(compactIndex)
	s.mu.Unlock()
	s.hsUnsynced = false

	if s.log.tailSeq > s.log.firstSeq {
		if err := s.log.checkpoint(s.fillCheckpoint); err != nil {
			return s.fail("checkpoint", err)
		}
	}
	return nil
}

// fillCheckpoint adds the whole live log to fb: base, snapshot position,
// every entry and the HardState (wmu held).
func (s *DiskStorage) fillCheckpoint(fb *frameBuf) error {
	return fillCheckpoint(fb, &s.img)
}

func fillCheckpoint(fb *frameBuf, img *logImage) error {
	fb.addUint64s(recCheckpoint, img.offset, img.offsetTerm, img.snapIndex, img.snapTerm)
	for _, e := range img.ents {
		if err := fb.addProto(recEntry, e); err != nil {
			return err
		}
	}
	if img.hs != nil {
		return fb.addProto(recHardState, img.hs)
	}
	return nil
}

// addUnsyncedHardState adds the HardState whose commit index Save left in
// memory (wmu held).
func (s *DiskStorage) addUnsyncedHardState(fb *frameBuf) error {
	if !s.hsUnsynced {
		return nil
	}
	return fb.addProto(recHardState, s.img.hs)
}

// putSnapshot stores snap in raft.db (one fsynced transaction) and deletes
// every stored snapshot but it and the one the image names.
func (s *DiskStorage) putSnapshot(snap *raftpb.Snapshot) error {
	v, err := proto.Marshal(snap)
	if err != nil {
		return fmt.Errorf("raftlog: encode snapshot: %w", err)
	}
	keep := s.img.snapIndex
	s.opts.point("bolt commit")
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		var stale [][]byte
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if i := binary.BigEndian.Uint64(k); i != keep {
				stale = append(stale, append([]byte(nil), k...))
			}
		}
		for _, k := range stale {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return b.Put(uint64Key(snap.GetMetadata().GetIndex()), v)
	})
	s.opts.point("bolt committed")
	if err != nil {
		return fmt.Errorf("write snapshot to %s: %w", s.path, err)
	}
	return nil
}

// readSnapshot reads the snapshot at index from raft.db; the result does
// not refer to the transaction's memory.
func readSnapshot(db *bolt.DB, index uint64) (*raftpb.Snapshot, error) {
	snap := &raftpb.Snapshot{}
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		if b == nil {
			return fmt.Errorf("no %q bucket", bucketSnapshots)
		}
		v := b.Get(uint64Key(index))
		if v == nil {
			return fmt.Errorf("no snapshot at index %d", index)
		}
		if err := proto.Unmarshal(v, snap); err != nil {
			return fmt.Errorf("snapshot %d does not decode: %v", index, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return raftpb.EnsureSnapshot(snap), nil
}

// Close writes a commit index that Save left in memory, closes the files
// and releases the directory; later calls return ErrStorageClosed. Closing
// twice is harmless.
func (s *DiskStorage) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	closed, failed := s.closed, s.failed
	s.mu.RUnlock()
	if closed {
		return nil
	}
	var flushErr error
	if failed == nil && s.hsUnsynced {
		fb := s.log.frame()
		if err := s.addUnsyncedHardState(fb); err != nil {
			flushErr = err
		} else if err := s.log.write(); err != nil {
			flushErr = s.fail("write hard state on close", err)
		} else {
			s.hsUnsynced = false
		}
	}
	s.mu.Lock()
	s.closed = true
	if s.failed == nil {
		s.failed = fmt.Errorf("raftlog: storage %s: %w", s.dir, ErrStorageClosed)
	}
	s.mu.Unlock()
	var errs []error
	if err := s.log.close(); err != nil {
		errs = append(errs, fmt.Errorf("raftlog: close raft log in %s: %w", s.dir, err))
	}
	if err := s.db.Close(); err != nil {
		errs = append(errs, fmt.Errorf("raftlog: close storage %s: %w", s.path, err))
	}
	if flushErr != nil {
		errs = append(errs, flushErr)
	}
	return errors.Join(errs...)
}

// err returns the sticky error, if any.
func (s *DiskStorage) err() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.failed
}

// fail records a failed write: the state on disk is unknown, so every later
// call returns the error.
func (s *DiskStorage) fail(op string, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed = fmt.Errorf("raftlog: %s in %s: %w: %w", op, s.dir, ErrStorageFailed, err)
	s.logger.Error("raft storage write failed; the member must restart", "op", op, "dir", s.dir, "err", err)
	return s.failed
}

func uint64Key(i uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), i)
}
