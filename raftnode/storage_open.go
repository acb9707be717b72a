package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// storageLockTimeout bounds the wait for the file lock of raft.db (a
// variable so that tests can shorten it).
var storageLockTimeout = time.Second

// storageIgnoredNames may sit in a data directory that has no raft.db yet
// without making it foreign.
var storageIgnoredNames = map[string]bool{"lost+found": true}

// OpenStorage opens the raft log in dir/raft.db for the member nodeID of the
// cluster clusterName, creating dir and the file when they do not exist.
//
// A new log is written to dir/raft.db.init and renamed to raft.db once its
// meta record is on disk, so raft.db always holds an identity. An existing
// raft.db is first checked in a read-only open: its bbolt structure, its meta
// record (format version, cluster name, node id, raft id), its buckets and the
// consistency of its log, snapshot and HardState. A directory of another
// cluster or node (ErrForeignDataDir), a damaged one (ErrDamagedDataDir) or one
// locked by another process (ErrDataDirInUse) is refused, and nothing in it is
// changed. A directory without raft.db is initialized only when it is empty
// (apart from lost+found and a raft.db.init left by an interrupted
// initialization, which is replaced).
func OpenStorage(dir, clusterName, nodeID string, logger *slog.Logger) (*BoltStorage, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clusterName == "" || nodeID == "" {
		return nil, fmt.Errorf("raftnode: open storage: cluster name and node id must be set (got %q, %q)", clusterName, nodeID)
	}
	path := filepath.Join(dir, storageFileName)
	want := storageIdentity{clusterName: clusterName, nodeID: nodeID, raftID: storageRaftID(nodeID)}

	info, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := initStorageDir(dir, want, logger); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("raftnode: open storage: %w", err)
	case !info.Mode().IsRegular():
		return nil, fmt.Errorf("raftnode: open storage: %w: %s is not a regular file", ErrDamagedDataDir, path)
	}

	// Check everything read-only before the read-write open.
	if err := checkStorageFile(path, want); err != nil {
		return nil, err
	}

	s, err := openCheckedStorage(path, want.raftID, logger)
	if err != nil {
		return nil, err
	}
	logger.Info("raft storage opened", "path", path, "cluster_name", clusterName, "node_id", nodeID,
		"raft_id", want.raftID, "first_index", s.offset+1, "last_index", s.last,
		"snapshot_index", s.snapMeta.GetIndex(), "commit", s.hardState.GetCommit(), "term", s.hardState.GetTerm())
	return s, nil
}

// openCheckedStorage opens the checked raft.db for reading and writing. A
// panic or fault of bbolt on damage the checks missed becomes a refusal.
func openCheckedStorage(path string, raftID uint64, logger *slog.Logger) (s *BoltStorage, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("raftnode: open storage: %w: %s: unreadable bbolt file: %v", ErrDamagedDataDir, path, r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: storageLockTimeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("raftnode: open storage: %w: %s is locked", ErrDataDirInUse, path)
		}
		return nil, fmt.Errorf("raftnode: open storage %s: %w", path, err)
	}
	s = &BoltStorage{db: db, path: path, raftID: raftID, logger: logger}
	if err := s.loadCache(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// storageIdentity is what the meta bucket records.
type storageIdentity struct {
	clusterName, nodeID string
	raftID              uint64
}

// initStorageDir creates dir if needed and a new raft.db in it, refusing a
// directory that holds anything else.
func initStorageDir(dir string, id storageIdentity, logger *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("raftnode: create data dir: %w", err)
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("raftnode: read data dir: %w", err)
	}
	var foreign []string
	for _, n := range names {
		if !storageIgnoredNames[n.Name()] && n.Name() != storageInitFileName {
			foreign = append(foreign, n.Name())
		}
	}
	if len(foreign) > 0 {
		sort.Strings(foreign)
		if len(foreign) > 5 {
			foreign = append(foreign[:5], "...")
		}
		return fmt.Errorf("raftnode: open storage: %w: %s has no %s but holds %s",
			ErrForeignDataDir, dir, storageFileName, strings.Join(foreign, ", "))
	}

	tmp := filepath.Join(dir, storageInitFileName)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("raftnode: remove stale %s: %w", tmp, err)
	}
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: storageLockTimeout})
	if err != nil {
		return fmt.Errorf("raftnode: create %s: %w", tmp, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		puts := []struct {
			k string
			v []byte
		}{
			{keyFormatVersion, binary.BigEndian.AppendUint32(nil, storageFormatVersion)},
			{keyClusterName, []byte(id.clusterName)},
			{keyNodeID, []byte(id.nodeID)},
			{keyRaftID, uint64Key(id.raftID)},
		}
		for _, p := range puts {
			if err := meta.Put([]byte(p.k), p.v); err != nil {
				return err
			}
		}
		eb, err := tx.CreateBucket(bucketEntries)
		if err != nil {
			return err
		}
		if err := putEntry(eb, &raftpb.Entry{Index: new(uint64(0)), Term: new(uint64(0))}); err != nil {
			return err
		}
		_, err = tx.CreateBucket(bucketState)
		return err
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("raftnode: initialize %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, storageFileName)); err != nil {
		return fmt.Errorf("raftnode: initialize data dir: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	logger.Info("raft storage initialized", "dir", dir, "cluster_name", id.clusterName, "node_id", id.nodeID, "raft_id", id.raftID)
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("raftnode: sync data dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("raftnode: sync data dir: %w", err)
	}
	return nil
}

// checkStorageFile opens path read-only and verifies its structure, identity
// and consistency. It changes nothing in the file.
func checkStorageFile(path string, want storageIdentity) (err error) {
	damaged := func(format string, args ...any) error {
		return fmt.Errorf("raftnode: open storage: %w: %s: %s", ErrDamagedDataDir, path, fmt.Sprintf(format, args...))
	}
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("raftnode: open storage: %w", err)
	}
	if info.Size() == 0 {
		return damaged("file is empty (0 bytes)")
	}
	// bbolt reads pages through a memory map: a damaged file can make it
	// panic or fault. Both become a refusal.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = damaged("unreadable bbolt file: %v", r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: storageLockTimeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return fmt.Errorf("raftnode: open storage: %w: %s is locked", ErrDataDirInUse, path)
		}
		return damaged("not a bbolt file: %v", err)
	}
	defer db.Close()
	// Check the b-tree from the file before bbolt reads it through its
	// memory map (bbolt holds the shared lock meanwhile).
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("raftnode: open storage: %w", err)
	}
	defer f.Close()
	if err := verifyBoltFile(f, info.Size()); err != nil {
		return damaged("%v", err)
	}
	return db.View(func(tx *bolt.Tx) error {
		if tx.Size() > info.Size() {
			return damaged("truncated: file is %d bytes, its meta page says %d", info.Size(), tx.Size())
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return damaged("no %q bucket", bucketMeta)
		}
		got, err := readIdentity(meta)
		if err != nil {
			return damaged("%v", err)
		}
		if got.clusterName != want.clusterName || got.nodeID != want.nodeID {
			return fmt.Errorf("raftnode: open storage: %w: %s holds cluster %q node %q, the config says cluster %q node %q",
				ErrForeignDataDir, path, got.clusterName, got.nodeID, want.clusterName, want.nodeID)
		}
		if got.raftID != want.raftID {
			return damaged("raft id %d does not match node id %q (expected %d)", got.raftID, got.nodeID, want.raftID)
		}
		return checkLog(tx, damaged)
	})
}

// readIdentity decodes the meta record, checking the format version first.
func readIdentity(meta *bolt.Bucket) (storageIdentity, error) {
	var id storageIdentity
	v := meta.Get([]byte(keyFormatVersion))
	if len(v) != 4 {
		return id, fmt.Errorf("meta %s is missing or not 4 bytes", keyFormatVersion)
	}
	if ver := binary.BigEndian.Uint32(v); ver != storageFormatVersion {
		return id, fmt.Errorf("unknown format version %d (this walden reads version %d)", ver, storageFormatVersion)
	}
	id.clusterName = string(meta.Get([]byte(keyClusterName)))
	id.nodeID = string(meta.Get([]byte(keyNodeID)))
	if id.clusterName == "" || id.nodeID == "" {
		return id, fmt.Errorf("meta %s or %s is missing", keyClusterName, keyNodeID)
	}
	v = meta.Get([]byte(keyRaftID))
	if len(v) != 8 {
		return id, fmt.Errorf("meta %s is missing or not 8 bytes", keyRaftID)
	}
	id.raftID = binary.BigEndian.Uint64(v)
	return id, nil
}

// checkLog verifies the entries and state buckets: contiguous entries whose
// stored index matches their key, whose terms never decrease and whose
// commands or membership changes decode (the apply path would stop on
// them), a decodable
// HardState, snapshot and ConfState, FirstIndex-1 <= snapshot index <=
// LastIndex with matching terms, and a commit index between the snapshot
// index (so also the compaction point) and LastIndex.
func checkLog(tx *bolt.Tx, damaged func(string, ...any) error) error {
	eb, sb := tx.Bucket(bucketEntries), tx.Bucket(bucketState)
	if eb == nil {
		return damaged("no %q bucket", bucketEntries)
	}
	if sb == nil {
		return damaged("no %q bucket", bucketState)
	}
	snap := &raftpb.Snapshot{}
	if err := decodeOptional(sb, keySnapshot, snap); err != nil {
		return damaged("%v", err)
	}
	cs := &raftpb.ConfState{}
	if err := decodeOptional(sb, keyConfState, cs); err != nil {
		return damaged("%v", err)
	}
	hs := &raftpb.HardState{}
	if err := decodeOptional(sb, keyHardState, hs); err != nil {
		return damaged("%v", err)
	}
	si, st := snap.GetMetadata().GetIndex(), snap.GetMetadata().GetTerm()

	var (
		first, prev, prevTerm, termAtSnap uint64
		n                                 int
	)
	c := eb.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return damaged("entries key %x is not 8 bytes", k)
		}
		idx := binary.BigEndian.Uint64(k)
		if n > 0 && idx != prev+1 {
			return damaged("entries jump from index %d to %d", prev, idx)
		}
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(v, e); err != nil {
			return damaged("entry %d does not decode: %v", idx, err)
		}
		if e.GetIndex() != idx {
			return damaged("entry under key %d says index %d", idx, e.GetIndex())
		}
		if what, err := decodeEntryData(e); err != nil {
			return damaged("the %s of entry %d (term %d) does not decode: %v", what, idx, e.GetTerm(), err)
		}
		if n > 0 && e.GetTerm() < prevTerm {
			return damaged("entry %d has term %d after term %d", idx, e.GetTerm(), prevTerm)
		}
		if n == 0 {
			first = idx
		}
		if idx == si {
			termAtSnap = e.GetTerm()
		}
		prev, prevTerm = idx, e.GetTerm()
		n++
	}
	if n == 0 {
		return damaged("entries bucket is empty (no compaction point)")
	}
	last := prev
	if si < first || si > last {
		return damaged("snapshot index %d outside the log [%d, %d] (first index %d, last index %d)", si, first, last, first+1, last)
	}
	if termAtSnap != st {
		return damaged("snapshot %d has term %d but the log has term %d there", si, st, termAtSnap)
	}
	if snapCS := snap.GetMetadata().GetConfState(); !proto.Equal(raftpb.EnsureConfState(cs), raftpb.EnsureConfState(proto.Clone(snapCS).(*raftpb.ConfState))) {
		return damaged("conf_state %v differs from the snapshot's %v", cs, snapCS)
	}
	if hs.GetCommit() > last {
		return damaged("hard state commit %d beyond last index %d", hs.GetCommit(), last)
	}
	if hs.GetCommit() < first {
		// raft restarts with the compaction point as committed and refuses
		// a HardState below it.
		return damaged("hard state commit %d below the compaction point %d", hs.GetCommit(), first)
	}
	if hs.GetCommit() < si {
		// The node restarts raft with the snapshot index as applied, and
		// raft refuses an applied index beyond the commit index.
		return damaged("hard state commit %d below the snapshot index %d", hs.GetCommit(), si)
	}
	return nil
}

// decodeEntryData decodes what the apply path decodes from e: the command of
// a normal entry, the membership change and its member description of a
// conf change entry. It returns what failed to decode.
func decodeEntryData(e *raftpb.Entry) (what string, err error) {
	var cctx []byte
	switch e.GetType() {
	case raftpb.EntryNormal:
		if len(e.GetData()) == 0 {
			return "", nil
		}
		return "command", proto.Unmarshal(e.GetData(), new(waldenv1.Command))
	case raftpb.EntryConfChange:
		cc := new(raftpb.ConfChange)
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			return "membership change", err
		}
		cctx = cc.GetContext()
	case raftpb.EntryConfChangeV2:
		cc := new(raftpb.ConfChangeV2)
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			return "membership change", err
		}
		cctx = cc.GetContext()
	default:
		return "entry type", fmt.Errorf("unknown entry type %d", e.GetType())
	}
	if len(cctx) == 0 {
		return "", nil
	}
	return "membership change's member description", proto.Unmarshal(cctx, new(waldenv1.ConfChangeContext))
}

// decodeOptional decodes key into m when present.
func decodeOptional(b *bolt.Bucket, key string, m proto.Message) error {
	v := b.Get([]byte(key))
	if v == nil {
		return nil
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return fmt.Errorf("%s does not decode: %v", key, err)
	}
	return nil
}

// loadCache fills the cached indexes and states from the read-write db.
func (s *BoltStorage) loadCache() error {
	return s.db.View(func(tx *bolt.Tx) error {
		eb, sb := tx.Bucket(bucketEntries), tx.Bucket(bucketState)
		if eb == nil || sb == nil {
			return fmt.Errorf("raftnode: open storage: %w: %s: missing buckets", ErrDamagedDataDir, s.path)
		}
		c := eb.Cursor()
		fk, fv := c.First()
		lk, _ := c.Last()
		if fk == nil {
			return fmt.Errorf("raftnode: open storage: %w: %s: no compaction point", ErrDamagedDataDir, s.path)
		}
		dummy := &raftpb.Entry{}
		if err := proto.Unmarshal(fv, dummy); err != nil {
			return fmt.Errorf("raftnode: open storage: %w: %s: entry %d: %v", ErrDamagedDataDir, s.path, binary.BigEndian.Uint64(fk), err)
		}
		s.offset, s.offsetTerm = binary.BigEndian.Uint64(fk), dummy.GetTerm()
		s.last = binary.BigEndian.Uint64(lk)

		snap := &raftpb.Snapshot{}
		hs := &raftpb.HardState{}
		for _, d := range []struct {
			key string
			m   proto.Message
		}{{keySnapshot, snap}, {keyHardState, hs}} {
			if err := decodeOptional(sb, d.key, d.m); err != nil {
				return fmt.Errorf("raftnode: open storage: %w: %s: %v", ErrDamagedDataDir, s.path, err)
			}
		}
		s.snapMeta = raftpb.EnsureSnapshot(snap).GetMetadata()
		if sb.Get([]byte(keyHardState)) != nil {
			s.hardState = hs
		}
		return nil
	})
}
