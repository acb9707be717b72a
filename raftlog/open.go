package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
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
)

// storageFormatVersion is the layout version of the data directory written
// in raft.db's meta bucket: 2 is raft.db (identity, snapshots) plus the
// segment files of raftlog/. A file of version 1 (everything in raft.db) is
// upgraded when opened; any other version is refused as damaged.
const storageFormatVersion uint32 = 2

// defaultLockTimeout bounds the wait for the file lock of raft.db.
const defaultLockTimeout = time.Second

// storageIgnoredNames may sit in a data directory that has no raft.db yet
// without making it foreign.
var storageIgnoredNames = map[string]bool{"lost+found": true}

// Names inside the data directory and raft.db.
const (
	storageFileName     = "raft.db"
	storageInitFileName = "raft.db.init"

	keyFormatVersion = "format_version"
	keyClusterName   = "cluster_name"
	keyNodeID        = "node_id"
	keyRaftID        = "raft_id"
	// keyLastSegment is the sequence number of the newest segment of the
	// log (0: none yet).
	keyLastSegment = "last_segment"
)

var (
	bucketMeta = []byte("meta")
	// bucketSnapshots: key = snapshot index (uint64), value = raftpb.Snapshot.
	bucketSnapshots = []byte("snapshots")
)

// storageOptions are what tests change about a storage: the file system of
// the log, its segment size, fsync, the wait for raft.db's lock, and a hook
// at every step a crash may interrupt.
type storageOptions struct {
	fs          storageFS
	segmentSize int64
	noSync      bool
	lockTimeout time.Duration
	point       func(step string)
}

func (o storageOptions) withDefaults() storageOptions {
	if o.fs == nil {
		o.fs = osFS{}
	}
	if o.segmentSize == 0 {
		o.segmentSize = defaultSegmentSize
	}
	if o.lockTimeout == 0 {
		o.lockTimeout = defaultLockTimeout
	}
	if o.point == nil {
		o.point = func(string) {}
	}
	return o
}

// Open opens the raft storage in dir for the member nodeID of the
// cluster clusterName, creating dir and the storage when they do not exist.
//
// A new raft.db is written as raft.db.init and renamed once its identity is
// on disk, so raft.db always says whom the directory belongs to; the log's
// first segment is created next. An existing raft.db is first checked in a
// read-only open: its bbolt structure, its identity (format version, cluster
// name, node id, raft id) and its buckets. The raft log is then read in full
// and checked: every segment present, every frame's checksums, the records
// consistent with each other, with the snapshots in raft.db and with the
// HardState. A directory of another cluster or node (ErrForeignDataDir), a
// damaged one (ErrDamagedDataDir) or one locked by another process
// (ErrDataDirInUse) is refused, and nothing in it is changed. What a crash
// can leave is not damage and is cleaned up: an unfinished write at the end
// of the newest segment (zeroed), a half-made segment (.seg.tmp, removed).
// A directory in format 1 (the whole log in raft.db) is upgraded to
// format 2. A directory without raft.db is initialized only when it is empty
// (apart from lost+found and a raft.db.init left by an interrupted
// initialization, which is replaced).
func Open(dir, clusterName, nodeID string, logger *slog.Logger) (*DiskStorage, error) {
	return openWith(dir, clusterName, nodeID, logger, storageOptions{})
}

func openWith(dir, clusterName, nodeID string, logger *slog.Logger, opts storageOptions) (*DiskStorage, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	opts = opts.withDefaults()
	if clusterName == "" || nodeID == "" {
		return nil, fmt.Errorf("raftlog: open storage: cluster name and node id must be set (got %q, %q)", clusterName, nodeID)
	}
	path := filepath.Join(dir, storageFileName)
	want := storageIdentity{clusterName: clusterName, nodeID: nodeID, raftID: RaftID(nodeID)}

	info, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := initStorageDir(dir, want, logger, opts.lockTimeout); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("raftlog: open storage: %w", err)
	case !info.Mode().IsRegular():
		return nil, fmt.Errorf("raftlog: open storage: %w: %s is not a regular file", ErrDamagedDataDir, path)
	}

	// Check raft.db read-only before the read-write open.
	version, err := checkStorageFile(path, want, opts.lockTimeout)
	if err != nil {
		return nil, err
	}
	db, err := openCheckedBolt(path, opts.lockTimeout)
	if err != nil {
		return nil, err
	}
	s := &DiskStorage{dir: dir, path: path, db: db, raftID: want.raftID, logger: logger, opts: opts}
	if version == storageFormat1 {
		if err := s.upgradeFormat1(); err != nil {
			_ = db.Close()
			return nil, err
		}
	}
	if err := s.openLog(); err != nil {
		_ = db.Close()
		return nil, err
	}
	logger.Info("raft storage opened", "dir", dir, "cluster_name", clusterName, "node_id", nodeID,
		"raft_id", want.raftID, "first_index", s.img.offset+1, "last_index", s.img.last(),
		"snapshot_index", s.img.snapIndex, "commit", s.img.hs.GetCommit(), "term", s.img.hs.GetTerm(),
		"segments", s.log.tailSeq-s.log.firstSeq+1)
	return s, nil
}

// openCheckedBolt opens the checked raft.db for reading and writing. A
// panic or fault of bbolt on damage the checks missed becomes a refusal.
func openCheckedBolt(path string, lockTimeout time.Duration) (db *bolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("raftlog: open storage: %w: %s: unreadable bbolt file: %v", ErrDamagedDataDir, path, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("raftlog: open storage: %w: %s is locked", ErrDataDirInUse, path)
		}
		return nil, fmt.Errorf("raftlog: open storage %s: %w", path, err)
	}
	return db, nil
}

// storageIdentity is what the meta bucket records.
type storageIdentity struct {
	clusterName, nodeID string
	raftID              uint64
}

// initStorageDir creates dir if needed and a new raft.db in it (format 2,
// no log segment yet), refusing a directory that holds anything else.
func initStorageDir(dir string, id storageIdentity, logger *slog.Logger, lockTimeout time.Duration) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("raftlog: create data dir: %w", err)
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("raftlog: read data dir: %w", err)
	}
	var foreign []string
	for _, n := range names {
		if n.Name() == logDirName {
			return fmt.Errorf("raftlog: open storage: %w: %s holds a raft log (%s/) but no %s",
				ErrDamagedDataDir, dir, logDirName, storageFileName)
		}
		if !storageIgnoredNames[n.Name()] && n.Name() != storageInitFileName {
			foreign = append(foreign, n.Name())
		}
	}
	if len(foreign) > 0 {
		sort.Strings(foreign)
		if len(foreign) > 5 {
			foreign = append(foreign[:5], "...")
		}
		return fmt.Errorf("raftlog: open storage: %w: %s has no %s but holds %s",
			ErrForeignDataDir, dir, storageFileName, strings.Join(foreign, ", "))
	}

	tmp := filepath.Join(dir, storageInitFileName)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("raftlog: remove stale %s: %w", tmp, err)
	}
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return fmt.Errorf("raftlog: create %s: %w", tmp, err)
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
			{keyLastSegment, uint64Key(0)},
		}
		for _, p := range puts {
			if err := meta.Put([]byte(p.k), p.v); err != nil {
				return err
			}
		}
		_, err = tx.CreateBucket(bucketSnapshots)
		return err
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("raftlog: initialize %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, storageFileName)); err != nil {
		return fmt.Errorf("raftlog: initialize data dir: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	logger.Info("raft storage initialized", "dir", dir, "cluster_name", id.clusterName, "node_id", id.nodeID, "raft_id", id.raftID)
	return nil
}

// checkStorageFile opens path read-only and verifies its structure, identity
// and, for format 1, the whole log; for format 2 the snapshots (the log is
// checked when it is read). It returns the format version and changes
// nothing in the file.
func checkStorageFile(path string, want storageIdentity, lockTimeout time.Duration) (version uint32, err error) {
	damaged := func(format string, args ...any) error {
		return fmt.Errorf("raftlog: open storage: %w: %s: %s", ErrDamagedDataDir, path, fmt.Sprintf(format, args...))
	}
	info, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("raftlog: open storage: %w", err)
	}
	if info.Size() == 0 {
		return 0, damaged("file is empty (0 bytes)")
	}
	// bbolt reads pages through a memory map: a damaged file can make it
	// panic or fault. Both become a refusal.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = damaged("unreadable bbolt file: %v", r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return 0, fmt.Errorf("raftlog: open storage: %w: %s is locked", ErrDataDirInUse, path)
		}
		return 0, damaged("not a bbolt file: %v", err)
	}
	defer db.Close()
	// Check the b-tree from the file before bbolt reads it through its
	// memory map (bbolt holds the shared lock meanwhile).
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("raftlog: open storage: %w", err)
	}
	defer f.Close()
	if err := verifyBoltFile(f, info.Size()); err != nil {
		return 0, damaged("%v", err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		if tx.Size() > info.Size() {
			return damaged("truncated: file is %d bytes, its meta page says %d", info.Size(), tx.Size())
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return damaged("no %q bucket", bucketMeta)
		}
		var got storageIdentity
		var err error
		got, version, err = readIdentity(meta)
		if err != nil {
			return damaged("%v", err)
		}
		if got.clusterName != want.clusterName || got.nodeID != want.nodeID {
			return fmt.Errorf("raftlog: open storage: %w: %s holds cluster %q node %q, the config says cluster %q node %q",
				ErrForeignDataDir, path, got.clusterName, got.nodeID, want.clusterName, want.nodeID)
		}
		if got.raftID != want.raftID {
			return damaged("raft id %d does not match node id %q (expected %d)", got.raftID, got.nodeID, want.raftID)
		}
		if version == storageFormat1 {
			return checkLogV1(tx, damaged)
		}
		return checkSnapshots(tx, damaged)
	})
	return version, err
}

// readIdentity decodes the meta record, checking the format version first.
func readIdentity(meta *bolt.Bucket) (storageIdentity, uint32, error) {
	var id storageIdentity
	v := meta.Get([]byte(keyFormatVersion))
	if len(v) != 4 {
		return id, 0, fmt.Errorf("meta %s is missing or not 4 bytes", keyFormatVersion)
	}
	ver := binary.BigEndian.Uint32(v)
	if ver != storageFormatVersion && ver != storageFormat1 {
		return id, 0, fmt.Errorf("unknown format version %d (this walden reads versions %d and %d)", ver, storageFormat1, storageFormatVersion)
	}
	id.clusterName = string(meta.Get([]byte(keyClusterName)))
	id.nodeID = string(meta.Get([]byte(keyNodeID)))
	if id.clusterName == "" || id.nodeID == "" {
		return id, 0, fmt.Errorf("meta %s or %s is missing", keyClusterName, keyNodeID)
	}
	v = meta.Get([]byte(keyRaftID))
	if len(v) != 8 {
		return id, 0, fmt.Errorf("meta %s is missing or not 8 bytes", keyRaftID)
	}
	id.raftID = binary.BigEndian.Uint64(v)
	if ver == storageFormatVersion {
		if v := meta.Get([]byte(keyLastSegment)); len(v) != 8 {
			return id, 0, fmt.Errorf("meta %s is missing or not 8 bytes", keyLastSegment)
		}
	}
	return id, ver, nil
}

// checkSnapshots verifies the snapshots bucket of a format-2 file: every
// snapshot decodes and is stored under its own index.
func checkSnapshots(tx *bolt.Tx, damaged func(string, ...any) error) error {
	b := tx.Bucket(bucketSnapshots)
	if b == nil {
		return damaged("no %q bucket", bucketSnapshots)
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return damaged("snapshots key %x is not 8 bytes", k)
		}
		snap := &raftpb.Snapshot{}
		if err := proto.Unmarshal(v, snap); err != nil {
			return damaged("snapshot %d does not decode: %v", binary.BigEndian.Uint64(k), err)
		}
		if idx := binary.BigEndian.Uint64(k); snap.GetMetadata().GetIndex() != idx {
			return damaged("snapshot under key %d says index %d", idx, snap.GetMetadata().GetIndex())
		}
	}
	return nil
}

// readLastSegment reads the newest segment recorded in raft.db.
func readLastSegment(db *bolt.DB) (uint64, error) {
	var last uint64
	err := db.View(func(tx *bolt.Tx) error {
		last = binary.BigEndian.Uint64(tx.Bucket(bucketMeta).Get([]byte(keyLastSegment)))
		return nil
	})
	return last, err
}

// recordLastSegment records in raft.db that segment seq is the newest one
// (one fsynced transaction).
func (s *DiskStorage) recordLastSegment(seq uint64) error {
	s.opts.point("bolt commit")
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte(keyLastSegment), uint64Key(seq))
	})
	s.opts.point("bolt committed")
	if err != nil {
		return fmt.Errorf("record segment %d in %s: %w", seq, s.path, err)
	}
	return nil
}

// openLog reads and checks the raft log, repairs what a crash left (an
// unfinished write at the end, a half-made segment), creates the first
// segment of a new log, and opens the newest segment for appending.
func (s *DiskStorage) openLog() error {
	logDir := filepath.Join(s.dir, logDirName)
	recorded, err := readLastSegment(s.db)
	if err != nil {
		return fmt.Errorf("raftlog: open storage: %w", err)
	}
	r, err := readLog(s.opts.fs, logDir, s.raftID, recorded)
	if err != nil {
		return err
	}
	if r.img.snapIndex > 0 {
		snap, err := readSnapshot(s.db, r.img.snapIndex)
		if err != nil {
			return fmt.Errorf("raftlog: open storage: %w: %s: %v (the raft log's snapshot)", ErrDamagedDataDir, s.path, err)
		}
		if snap.GetMetadata().GetTerm() != r.img.snapTerm {
			return fmt.Errorf("raftlog: open storage: %w: %s: snapshot %d has term %d, the raft log says term %d",
				ErrDamagedDataDir, s.path, r.img.snapIndex, snap.GetMetadata().GetTerm(), r.img.snapTerm)
		}
		s.snapMeta = snap.GetMetadata()
	} else {
		s.snapMeta = raftpb.EnsureSnapshot(&raftpb.Snapshot{}).GetMetadata()
	}

	// Everything checked: from here on the directory may change.
	s.img = r.img
	s.log = &segmentWriter{
		fs: s.opts.fs, dir: logDir, raftID: s.raftID, segSize: s.opts.segmentSize,
		noSync: s.opts.noSync, point: s.opts.point, recordLast: s.recordLastSegment,
	}
	for _, tmp := range r.tmps {
		if err := s.opts.fs.Remove(filepath.Join(logDir, tmp)); err != nil {
			return fmt.Errorf("raftlog: open storage: remove %s: %w", tmp, err)
		}
		s.logger.Warn("removed a segment file left half-made by a crash", "file", filepath.Join(logDir, tmp))
	}
	for _, seq := range r.obsolete {
		path := filepath.Join(logDir, segmentName(seq))
		if err := s.opts.fs.Remove(path); err != nil {
			return fmt.Errorf("raftlog: open storage: remove %s: %w", path, err)
		}
		s.logger.Warn("removed a segment a checkpoint made useless (a crash interrupted its deletion)", "file", path)
	}
	if len(r.tmps)+len(r.obsolete) > 0 && !s.opts.noSync {
		if err := s.opts.fs.SyncDir(logDir); err != nil {
			return fmt.Errorf("raftlog: open storage: sync %s: %w", logDir, err)
		}
	}
	if len(r.segments) == 0 {
		// A new log: its first segment starts with an empty checkpoint.
		if err := s.opts.fs.MkdirAll(logDir); err != nil {
			return fmt.Errorf("raftlog: open storage: create %s: %w", logDir, err)
		}
		if !s.opts.noSync {
			if err := s.opts.fs.SyncDir(s.dir); err != nil {
				return fmt.Errorf("raftlog: open storage: sync %s: %w", s.dir, err)
			}
		}
		s.log.frameSeq = 1
		if err := s.log.cut(s.fillCheckpoint, 0); err != nil {
			_ = s.log.close()
			return fmt.Errorf("raftlog: open storage: %w", err)
		}
		return nil
	}
	last := r.segments[len(r.segments)-1]
	f, err := s.opts.fs.OpenRW(filepath.Join(logDir, segmentName(last)))
	if err != nil {
		return fmt.Errorf("raftlog: open storage: %w", err)
	}
	s.log.firstSeq, s.log.tailSeq, s.log.tail, s.log.tailSize = r.segments[0], last, f, r.tailSize
	s.log.off, s.log.frameSeq = r.tail.end, r.tail.nextSeq
	if r.tail.tornEnd > r.tail.end {
		// An unfinished write: zero it, so that the next frame is followed
		// by zeros, as the reader expects.
		zeros := make([]byte, r.tail.tornEnd-r.tail.end)
		if _, err := f.WriteAt(zeros, r.tail.end); err != nil {
			_ = s.log.close()
			return fmt.Errorf("raftlog: open storage: discard unfinished write in %s: %w", segmentName(last), err)
		}
		if err := f.Datasync(); err != nil {
			_ = s.log.close()
			return fmt.Errorf("raftlog: open storage: discard unfinished write in %s: %w", segmentName(last), err)
		}
		s.opts.point("log torn tail zeroed")
		s.logger.Warn("discarded an unfinished write at the end of the raft log (a crash interrupted it before it was synced)",
			"file", filepath.Join(logDir, segmentName(last)), "offset", r.tail.end, "bytes", len(zeros))
	}
	if last != recorded {
		if err := s.recordLastSegment(last); err != nil {
			_ = s.log.close()
			return fmt.Errorf("raftlog: open storage: %w", err)
		}
	}
	return nil
}

// upgradeFormat1 turns a checked format-1 raft.db into format 2: the log
// (compaction point, entries, HardState, snapshot position) is written as
// the checkpoint of a new segment 1, then one bbolt transaction moves the
// snapshot to the snapshots bucket, drops the format-1 buckets and sets the
// version. Until that transaction commits raft.db is format 1 and whole, and
// a raftlog/ beside it is a leftover of an interrupted upgrade that is
// rebuilt.
func (s *DiskStorage) upgradeFormat1() error {
	var (
		img  logImage
		snap *raftpb.Snapshot
	)
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		img, snap, err = readV1(tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("raftlog: open storage: %w: %s: %v", ErrDamagedDataDir, s.path, err)
	}
	logDir := filepath.Join(s.dir, logDirName)
	fsys := s.opts.fs
	if names, err := fsys.ReadDir(logDir); err == nil {
		s.logger.Warn("removing the raft log of an interrupted upgrade; raft.db is still in format 1 and holds the whole log",
			"dir", logDir, "files", len(names))
		if err := fsys.RemoveAll(logDir); err != nil {
			return fmt.Errorf("raftlog: upgrade storage: %w", err)
		}
	}
	if err := fsys.MkdirAll(logDir); err != nil {
		return fmt.Errorf("raftlog: upgrade storage: %w", err)
	}
	if !s.opts.noSync {
		if err := fsys.SyncDir(s.dir); err != nil {
			return fmt.Errorf("raftlog: upgrade storage: sync %s: %w", s.dir, err)
		}
	}
	s.opts.point("upgrade log dir")
	w := &segmentWriter{
		fs: fsys, dir: logDir, raftID: s.raftID, segSize: s.opts.segmentSize, noSync: s.opts.noSync,
		point: s.opts.point, recordLast: func(uint64) error { return nil }, frameSeq: 1,
	}
	err = w.cut(func(fb *frameBuf) error { return fillCheckpoint(fb, &img) }, 0)
	if cerr := w.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("raftlog: upgrade storage: %w", err)
	}
	s.opts.point("bolt commit")
	err = s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put([]byte(keyFormatVersion), binary.BigEndian.AppendUint32(nil, storageFormatVersion)); err != nil {
			return err
		}
		if err := meta.Put([]byte(keyLastSegment), uint64Key(1)); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(bucketSnapshots)
		if err != nil {
			return err
		}
		if snap != nil {
			v, err := proto.Marshal(snap)
			if err != nil {
				return err
			}
			if err := b.Put(uint64Key(snap.GetMetadata().GetIndex()), v); err != nil {
				return err
			}
		}
		if err := tx.DeleteBucket(bucketEntriesV1); err != nil {
			return err
		}
		return tx.DeleteBucket(bucketStateV1)
	})
	s.opts.point("bolt committed")
	if err != nil {
		return fmt.Errorf("raftlog: upgrade storage %s: %w", s.path, err)
	}
	s.logger.Info("raft storage upgraded from format 1 (log in raft.db) to format 2 (log in segment files)",
		"dir", s.dir, "entries", len(img.ents), "first_index", img.offset+1, "last_index", img.last(),
		"snapshot_index", img.snapIndex)
	return nil
}

// logRead is what reading the raft log found.
type logRead struct {
	img      logImage
	segments []uint64 // sequence numbers of the log, oldest first
	obsolete []uint64 // segments before the log's first checkpoint
	tmps     []string // half-made segment files
	tail     segmentScan
	tailSize int64
}

// readLog reads every segment in dir, checks it and replays it into an
// image. recorded is the newest segment raft.db knows of. It changes
// nothing.
func readLog(fsys storageFS, dir string, raftID, recorded uint64) (logRead, error) {
	var r logRead
	damaged := func(file string, format string, args ...any) error {
		return fmt.Errorf("raftlog: open storage: %w: %s: %s", ErrDamagedDataDir, file, fmt.Sprintf(format, args...))
	}
	names, err := fsys.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if recorded > 0 {
			return r, damaged(dir, "the raft log directory is missing (raft.db records segments up to %s)", segmentName(recorded))
		}
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("raftlog: open storage: %w", err)
	}
	for _, n := range names {
		if seq, ok := parseSegmentName(n); ok {
			r.segments = append(r.segments, seq)
			continue
		}
		if _, ok := parseSegmentName(strings.TrimSuffix(n, ".tmp")); ok && strings.HasSuffix(n, segmentTmpSuffix) {
			r.tmps = append(r.tmps, n)
			continue
		}
		return r, damaged(filepath.Join(dir, n), "not a segment of the raft log")
	}
	sort.Slice(r.segments, func(i, j int) bool { return r.segments[i] < r.segments[j] })
	if len(r.segments) == 0 {
		if recorded > 0 {
			return r, damaged(dir, "no segment, raft.db records segments up to %s", segmentName(recorded))
		}
		return r, nil
	}
	// The log starts at the newest segment that starts with a checkpoint:
	// a checkpoint holds the whole live log, and the segments before it
	// are deleted once it is durable. Any still there are the leftovers of
	// a deletion a crash interrupted.
	start := -1
	for i := len(r.segments) - 1; i >= 0 && start < 0; i-- {
		ok, err := startsWithCheckpoint(fsys, filepath.Join(dir, segmentName(r.segments[i])))
		if err != nil {
			return r, fmt.Errorf("raftlog: open storage: %w", err)
		}
		if ok {
			start = i
		}
	}
	if start < 0 {
		// None does: replaying the oldest says why (its first frame is
		// damaged, or older segments are missing).
		start = 0
	}
	r.obsolete, r.segments = r.segments[:start], r.segments[start:]
	for i := 1; i < len(r.segments); i++ {
		if r.segments[i] != r.segments[i-1]+1 {
			return r, damaged(filepath.Join(dir, segmentName(r.segments[i-1]+1)), "segment is missing (%s and %s are present)",
				segmentName(r.segments[i-1]), segmentName(r.segments[i]))
		}
	}
	newest := r.segments[len(r.segments)-1]
	if newest < recorded {
		return r, damaged(filepath.Join(dir, segmentName(recorded)), "segment is missing: raft.db records it as the newest, the directory ends at %s", segmentName(newest))
	}
	if newest > recorded+1 {
		return r, damaged(filepath.Join(dir, segmentName(newest)), "segment is newer than raft.db records (%s)", segmentName(recorded))
	}

	rp := &replayer{img: &r.img, raftID: raftID}
	var wantSeq uint64
	for k, seq := range r.segments {
		path := filepath.Join(dir, segmentName(seq))
		f, err := fsys.Open(path)
		if err != nil {
			return r, fmt.Errorf("raftlog: open storage: %w", err)
		}
		size, err := f.Size()
		if err != nil {
			_ = f.Close()
			return r, fmt.Errorf("raftlog: open storage: %w", err)
		}
		rp.beginSegment(seq, k == 0)
		last := k == len(r.segments)-1
		scan, err := scanSegment(&segmentReader{f: f, size: size}, wantSeq, last, rp.frame)
		_ = f.Close()
		if err != nil {
			return r, damaged(path, "%v", err)
		}
		if rp.frames == 0 {
			return r, damaged(path, "the segment holds no complete frame")
		}
		wantSeq = scan.nextSeq
		if last {
			r.tail, r.tailSize = scan, size
		}
	}
	if err := r.img.check(); err != nil {
		return r, damaged(dir, "%v", err)
	}
	return r, nil
}

// startsWithCheckpoint reports whether the first frame of the segment at
// path is complete and holds a segment record and a checkpoint.
func startsWithCheckpoint(fsys storageFS, path string) (bool, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return false, err
	}
	if size < frameHeaderSize {
		return false, nil
	}
	r := &segmentReader{f: f, size: size}
	hdr, err := r.at(0, frameHeaderSize)
	if err != nil {
		return false, nil
	}
	h, ok := parseFrameHeader(hdr)
	if !ok || h.length > maxFramePayload || frameHeaderSize+int64(h.length) > size {
		return false, nil
	}
	payload, err := r.at(frameHeaderSize, int(h.length))
	if err != nil || crc32.Checksum(payload, castagnoli) != h.crc {
		return false, nil
	}
	recs, err := parseRecords(payload, nil)
	return err == nil && len(recs) >= 2 && recs[0].typ == recSegment && recs[1].typ == recCheckpoint, nil
}

// replayer applies the records of the log's frames to an image, checking
// each against the rules the writes follow.
type replayer struct {
	img    *logImage
	raftID uint64
	// Per segment.
	seq    uint64
	first  bool // the first segment on disk: it must start with a checkpoint
	frames int
	recs   []logRecord
}

func (rp *replayer) beginSegment(seq uint64, first bool) {
	rp.seq, rp.first, rp.frames = seq, first, 0
}

// frame applies one frame's records.
func (rp *replayer) frame(_ int64, payload []byte) error {
	recs, err := parseRecords(payload, rp.recs)
	rp.recs = recs
	if err != nil {
		return err
	}
	firstFrame := rp.frames == 0
	rp.frames++
	inCheckpoint := false
	for k, rec := range recs {
		if firstFrame && k == 0 {
			if rec.typ != recSegment {
				return fmt.Errorf("the segment does not start with a segment record (record type %d)", rec.typ)
			}
			v, err := rec.uint64s(3)
			if err != nil {
				return err
			}
			switch {
			case v[0] != segmentFormat:
				return fmt.Errorf("unknown segment format %d (this walden reads format %d)", v[0], segmentFormat)
			case v[1] != rp.seq:
				return fmt.Errorf("segment record says segment %d", v[1])
			case v[2] != rp.raftID:
				return fmt.Errorf("segment belongs to raft id %d, raft.db to %d", v[2], rp.raftID)
			}
			continue
		}
		if firstFrame && k == 1 && rp.first && rec.typ != recCheckpoint {
			return errors.New("the oldest segment does not start with a checkpoint (older segments are missing)")
		}
		if err := rp.record(rec, firstFrame, &inCheckpoint); err != nil {
			return err
		}
	}
	if firstFrame && rp.first && len(recs) < 2 {
		return errors.New("the oldest segment does not start with a checkpoint (older segments are missing)")
	}
	return nil
}

func (rp *replayer) record(rec logRecord, firstFrame bool, inCheckpoint *bool) error {
	l := rp.img
	switch rec.typ {
	case recCheckpoint:
		if !firstFrame || *inCheckpoint {
			return errors.New("a checkpoint record inside the segment")
		}
		v, err := rec.uint64s(4)
		if err != nil {
			return err
		}
		*inCheckpoint = true
		*l = logImage{offset: v[0], offsetTerm: v[1], snapIndex: v[2], snapTerm: v[3]}
	case recEntry:
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(rec.data, e); err != nil {
			return fmt.Errorf("entry does not decode: %v", err)
		}
		if what, err := decodeEntryData(e); err != nil {
			// The apply path would stop on it.
			return fmt.Errorf("the %s of entry %d (term %d) does not decode: %v", what, e.GetIndex(), e.GetTerm(), err)
		}
		idx, last := e.GetIndex(), l.last()
		switch {
		case *inCheckpoint && idx != last+1:
			return fmt.Errorf("checkpoint entry %d does not follow %d", idx, last)
		case idx > last+1:
			return fmt.Errorf("entry %d leaves a gap after the last index %d", idx, last)
		case idx <= l.offset:
			return fmt.Errorf("entry %d is at or below the compaction point %d", idx, l.offset)
		case !*inCheckpoint && idx <= l.snapIndex:
			return fmt.Errorf("entry %d overwrites entries covered by snapshot %d", idx, l.snapIndex)
		}
		l.appendEntries([]*raftpb.Entry{e})
	case recHardState:
		hs := &raftpb.HardState{}
		if err := proto.Unmarshal(rec.data, hs); err != nil {
			return fmt.Errorf("hard state does not decode: %v", err)
		}
		l.hs = hs
	case recSnapshot:
		v, err := rec.uint64s(2)
		if err != nil {
			return err
		}
		if l.snapIndex != 0 && v[0] <= l.snapIndex {
			return fmt.Errorf("snapshot %d is not newer than snapshot %d", v[0], l.snapIndex)
		}
		l.applySnapshot(v[0], v[1])
	case recSnapshotTaken:
		v, err := rec.uint64s(2)
		if err != nil {
			return err
		}
		if v[0] <= l.snapIndex || v[0] > l.last() {
			return fmt.Errorf("snapshot %d outside (%d, %d]", v[0], l.snapIndex, l.last())
		}
		if t, _ := l.term(v[0]); t != v[1] {
			return fmt.Errorf("snapshot %d has term %d, the log has term %d there", v[0], v[1], t)
		}
		l.snapIndex, l.snapTerm = v[0], v[1]
	case recCompact:
		v, err := rec.uint64s(2)
		if err != nil {
			return err
		}
		if v[0] <= l.offset || v[0] > l.last() || v[0] > l.snapIndex {
			return fmt.Errorf("compaction to %d outside (%d, min(%d, %d)]", v[0], l.offset, l.last(), l.snapIndex)
		}
		if t, _ := l.term(v[0]); t != v[1] {
			return fmt.Errorf("compaction to %d with term %d, the log has term %d there", v[0], v[1], t)
		}
		l.compact(v[0])
	case recSegment:
		return errors.New("a segment record inside the segment")
	default:
		return fmt.Errorf("unknown record type %d", rec.typ)
	}
	return nil
}
