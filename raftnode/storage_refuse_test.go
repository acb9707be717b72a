package raftnode

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// dirPrint is what must not change in a refused data directory: every
// name's size, mode, modification time and content hash, and the
// directory's own modification time.
type dirPrint map[string]string

func fingerprint(t *testing.T, dir string) dirPrint {
	t.Helper()
	p := dirPrint{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rec := fmt.Sprintf("%v %s", info.Mode(), info.ModTime().Format(time.RFC3339Nano))
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rec += fmt.Sprintf(" %d bytes sha256 %x", len(b), sha256.Sum256(b))
		}
		p[path] = rec
		return nil
	})
	if err != nil {
		t.Fatalf("fingerprint %s: %v", dir, err)
	}
	return p
}

func assertUnchanged(t *testing.T, before, after dirPrint) {
	t.Helper()
	if len(before) != len(after) {
		t.Errorf("directory entries changed: %d before, %d after", len(before), len(after))
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed:\n before %s\n after  %s", k, v, after[k])
		}
	}
}

// populatedDir returns a data dir of cluster "test" node "n1" holding 40
// entries of 2 KiB, a HardState and a snapshot at 20 with the log compacted
// to 15.
func populatedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s := openTestStorage(t, dir)
	var ents []*raftpb.Entry
	for i := uint64(1); i <= 40; i++ {
		ents = append(ents, &raftpb.Entry{Index: new(i), Term: new(uint64(1)), Data: testCommand(make([]byte, 2048))})
	}
	if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(uint64(30))}, ents, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot(20, &raftpb.ConfState{Voters: []uint64{1}}, []byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(15); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// editDB changes raft.db directly through bbolt, as damage would.
func editDB(t *testing.T, dir string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, storageFileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenStorageRefuses opens data directories that must be refused and
// checks the error names the problem and that nothing in the directory
// changed.
func TestOpenStorageRefuses(t *testing.T) {
	storageLockTimeout = 50 * time.Millisecond
	defer func() { storageLockTimeout = time.Second }()

	dbPath := func(dir string) string { return filepath.Join(dir, storageFileName) }
	cases := []struct {
		name          string
		prepare       func(t *testing.T) string
		cluster, node string
		want          error
		wantText      []string
	}{
		{
			name:     "foreign cluster",
			prepare:  populatedDir,
			cluster:  "other",
			node:     "n1",
			want:     ErrForeignDataDir,
			wantText: []string{`holds cluster "test" node "n1", the config says cluster "other" node "n1"`},
		},
		{
			name:     "foreign node id",
			prepare:  populatedDir,
			node:     "n2",
			want:     ErrForeignDataDir,
			wantText: []string{`holds cluster "test" node "n1", the config says cluster "test" node "n2"`},
		},
		{
			name: "files but no raft.db",
			prepare: func(t *testing.T) string {
				dir := t.TempDir()
				if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrForeignDataDir,
			wantText: []string{"has no raft.db but holds notes.txt"},
		},
		{
			name: "garbage file",
			prepare: func(t *testing.T) string {
				dir := t.TempDir()
				b := make([]byte, 64<<10)
				rng := rand.New(rand.NewPCG(1, 2))
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				if err := os.WriteFile(dbPath(dir), b, 0o600); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"not a bbolt file"},
		},
		{
			name: "empty file",
			prepare: func(t *testing.T) string {
				dir := t.TempDir()
				if err := os.WriteFile(dbPath(dir), nil, 0o600); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"file is empty (0 bytes)"},
		},
		{
			name: "truncated below its data",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				db, err := bolt.Open(dbPath(dir), 0o600, &bolt.Options{ReadOnly: true})
				if err != nil {
					t.Fatal(err)
				}
				var size int64
				_ = db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil })
				_ = db.Close()
				if err := os.Truncate(dbPath(dir), size-int64(os.Getpagesize())); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"truncated: file is"},
		},
		{
			name: "truncated into its meta pages",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				if err := os.Truncate(dbPath(dir), 5000); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"not a bbolt file", "file size too small"},
		},
		{
			name: "corrupted leaf page",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				db, err := bolt.Open(dbPath(dir), 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true})
				if err != nil {
					t.Fatal(err)
				}
				leaf := -1
				_ = db.View(func(tx *bolt.Tx) error {
					for id := 2; leaf < 0; id++ {
						p, err := tx.Page(id)
						if err != nil || p == nil {
							break
						}
						if p.Type == "leaf" {
							leaf = id
						}
					}
					return nil
				})
				pageSize := db.Info().PageSize
				_ = db.Close()
				if leaf < 0 {
					t.Fatal("no leaf page found")
				}
				f, err := os.OpenFile(dbPath(dir), os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				garbage := make([]byte, pageSize)
				for i := range garbage {
					garbage[i] = 0xa5
				}
				if _, err := f.WriteAt(garbage, int64(leaf*pageSize)); err != nil {
					t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"page"},
		},
		{
			name: "unknown format version",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					return tx.Bucket(bucketMeta).Put([]byte(keyFormatVersion), binary.BigEndian.AppendUint32(nil, 99))
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"unknown format version 99 (this walden reads version 1)"},
		},
		{
			name: "meta record without node id",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete([]byte(keyNodeID)) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"meta cluster_name or node_id is missing"},
		},
		{
			name: "raft id not derived from node id",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put([]byte(keyRaftID), uint64Key(7)) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{`raft id 7 does not match node id "n1"`},
		},
		{
			name: "no meta bucket",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketMeta) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{`no "meta" bucket`},
		},
		{
			name: "no entries bucket",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketEntries) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{`no "entries" bucket`},
		},
		{
			name: "gap in the log",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.Bucket(bucketEntries).Delete(uint64Key(25)) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"entries jump from index 24 to 26"},
		},
		{
			name: "snapshot beyond the log",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(100)), Term: new(uint64(1)), ConfState: &raftpb.ConfState{Voters: []uint64{1}}}}
					return putProto(tx.Bucket(bucketState), keySnapshot, snap)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"snapshot index 100 outside the log [15, 40] (first index 16, last index 40)"},
		},
		{
			name: "compacted beyond the snapshot",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					return deleteRange(tx.Bucket(bucketEntries), 15, 22)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"snapshot index 20 outside the log [23, 40]"},
		},
		{
			name: "commit beyond the log",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					hs := &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(41))}
					return putProto(tx.Bucket(bucketState), keyHardState, hs)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"hard state commit 41 beyond last index 40"},
		},
		{
			name: "commit below the compaction point",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					hs := &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(10))}
					return putProto(tx.Bucket(bucketState), keyHardState, hs)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"hard state commit 10 below the compaction point 15"},
		},
		{
			// raft restarts with the snapshot index as applied and panics
			// when that is beyond the commit index.
			name: "commit below the snapshot",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					hs := &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(17))}
					return putProto(tx.Bucket(bucketState), keyHardState, hs)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"hard state commit 17 below the snapshot index 20"},
		},
		{
			name: "undecodable entry",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.Bucket(bucketEntries).Put(uint64Key(30), []byte{0xff, 0xff, 0xff}) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"entry 30 does not decode"},
		},
		{
			// A bit flip inside an entry that leaves the entry well-formed
			// but its command undecodable: the apply path would stop on it.
			name: "entry whose command does not decode",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				e := &raftpb.Entry{Index: new(uint64(31)), Term: new(uint64(1)), Data: []byte{0xff, 0xff, 0xff}}
				editDB(t, dir, func(tx *bolt.Tx) error { return putEntry(tx.Bucket(bucketEntries), e) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"the command of entry 31 (term 1) does not decode"},
		},
		{
			name: "membership change that does not decode",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				e := &raftpb.Entry{Index: new(uint64(32)), Term: new(uint64(1)), Type: raftpb.EntryConfChangeV2.Enum(), Data: []byte{0xff, 0xff, 0xff}}
				editDB(t, dir, func(tx *bolt.Tx) error { return putEntry(tx.Bucket(bucketEntries), e) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"the membership change of entry 32 (term 1) does not decode"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.prepare(t)
			cluster, node := tc.cluster, tc.node
			if cluster == "" {
				cluster = "test"
			}
			if node == "" {
				node = "n1"
			}
			before := fingerprint(t, dir)
			s, err := OpenStorage(dir, cluster, node, nil)
			if err == nil {
				_ = s.Close()
				t.Fatalf("OpenStorage accepted the directory")
			}
			t.Logf("refused: %v", err)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %q does not wrap %v", err, tc.want)
			}
			for _, w := range tc.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), dir) {
				t.Errorf("error %q does not name the directory %s", err, dir)
			}
			assertUnchanged(t, before, fingerprint(t, dir))
		})
	}
}

// TestOpenStorageRefusesLockedDir opens a data directory that a running
// storage holds.
func TestOpenStorageRefusesLockedDir(t *testing.T) {
	storageLockTimeout = 50 * time.Millisecond
	defer func() { storageLockTimeout = time.Second }()
	dir := populatedDir(t)
	s := openTestStorage(t, dir)
	defer s.Close()
	before := fingerprint(t, dir)
	if _, err := OpenStorage(dir, "test", "n1", nil); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second OpenStorage: %v, want ErrDataDirInUse", err)
	}
	assertUnchanged(t, before, fingerprint(t, dir))
}

// TestOpenStorageInitializes checks the directories that are initialized: a
// missing one, an empty one, one with lost+found and one with a raft.db.init
// left by an interrupted initialization.
func TestOpenStorageInitializes(t *testing.T) {
	cases := map[string]func(t *testing.T) string{
		"missing": func(t *testing.T) string { return filepath.Join(t.TempDir(), "a", "b") },
		"empty":   func(t *testing.T) string { return t.TempDir() },
		"lost+found": func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "lost+found"), 0o700); err != nil {
				t.Fatal(err)
			}
			return dir
		},
		"interrupted init": func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, storageInitFileName), []byte("half"), 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		},
	}
	for name, prepare := range cases {
		t.Run(name, func(t *testing.T) {
			dir := prepare(t)
			s := openTestStorage(t, dir)
			if !s.IsEmpty() {
				t.Error("initialized storage is not empty")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, storageInitFileName)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s left behind: %v", storageInitFileName, err)
			}
			// The meta record says who owns it.
			db, err := bolt.Open(filepath.Join(dir, storageFileName), 0o600, &bolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			_ = db.View(func(tx *bolt.Tx) error {
				id, err := readIdentity(tx.Bucket(bucketMeta))
				if err != nil || id != (storageIdentity{clusterName: "test", nodeID: "n1", raftID: storageRaftID("n1")}) {
					t.Errorf("meta record = %+v, %v", id, err)
				}
				return nil
			})
		})
	}
}

// TestStorageReopenKeepsState checks a populated directory reopens with the
// same log, snapshot and HardState.
func TestStorageReopenKeepsState(t *testing.T) {
	dir := populatedDir(t)
	s := openTestStorage(t, dir)
	defer s.Close()
	if f, _ := s.FirstIndex(); f != 16 {
		t.Errorf("FirstIndex = %d, want 16", f)
	}
	if l, _ := s.LastIndex(); l != 40 {
		t.Errorf("LastIndex = %d, want 40", l)
	}
	hs, cs, _ := s.InitialState()
	if hs.GetCommit() != 30 || !proto.Equal(cs, raftpb.EnsureConfState(&raftpb.ConfState{Voters: []uint64{1}})) {
		t.Errorf("InitialState = %v, %v", hs, cs)
	}
	snap, err := s.Snapshot()
	if err != nil || snap.GetMetadata().GetIndex() != 20 || string(snap.GetData()) != "state" {
		t.Errorf("Snapshot = %v, %v", snap, err)
	}
}
