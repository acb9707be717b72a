package raftlog

import (
	"bytes"
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

	"walden/internal/testutil"

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
// entries of 2 KiB (saved 10 at a time, so the segment holds several
// frames), a HardState (term 1, vote 1, commit 30) and a snapshot at 20 with
// the log compacted to 15. Entry i's data is the byte i repeated: no frame
// has a sector of zeros, which the reader would take for an unfinished
// write.
func populatedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s, err := openWith(dir, "test", "n1", nil, storageOptions{segmentSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var ents []*raftpb.Entry
	for i := uint64(1); i <= 40; i++ {
		ents = append(ents, &raftpb.Entry{Index: new(i), Term: new(uint64(1)), Data: testCommand(bytes.Repeat([]byte{byte(i)}, 2048))})
	}
	for k := 0; k < 40; k += 10 {
		var hs *raftpb.HardState
		if k == 30 {
			hs = &raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(uint64(30))}
		}
		if err := s.Save(hs, ents[k:k+10], nil); err != nil {
			t.Fatal(err)
		}
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

// multiSegmentDir returns a data dir of cluster "test" node "n1" whose log
// spans several segments of 4 KiB: 30 entries of 1 KiB, one per Save, and
// no compaction.
func multiSegmentDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s, err := openWith(dir, "test", "n1", nil, storageOptions{segmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 30; i++ {
		e := &raftpb.Entry{Index: new(i), Term: new(uint64(1)), Data: testCommand(bytes.Repeat([]byte{byte(i)}, 1024))}
		hs := &raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(i)}
		if err := s.Save(hs, []*raftpb.Entry{e}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(segmentPaths(t, dir)); n < 4 {
		t.Fatalf("%d segments, want several", n)
	}
	return dir
}

// v1Dir returns a copy of the format-1 data dir of testdata/v1/populated:
// cluster "test" node "n1", 40 entries, snapshot at 20, compacted to 15.
func v1Dir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	testutil.CopyTree(t, filepath.Join("testdata", "v1", "populated"), dir)
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

// editEntries rewrites the entry records of the newest segment of dir.
func editEntries(t *testing.T, dir string, fn func(e *raftpb.Entry) []logRecord) {
	t.Helper()
	editLastSegment(t, dir, func(frames []loggedFrame) []loggedFrame {
		return mapRecords(frames, func(r logRecord) []logRecord {
			if r.typ != recEntry {
				return []logRecord{r}
			}
			return fn(entryOf(t, r))
		})
	})
}

// setHardState replaces every HardState record of the newest segment of dir.
func setHardState(t *testing.T, dir string, hs *raftpb.HardState) {
	t.Helper()
	editLastSegment(t, dir, func(frames []loggedFrame) []loggedFrame {
		return mapRecords(frames, func(r logRecord) []logRecord {
			if r.typ == recHardState {
				return []logRecord{protoRecord(t, recHardState, hs)}
			}
			return []logRecord{r}
		})
	})
}

// TestOpenStorageRefuses opens data directories that must be refused and
// checks the error names the problem and that nothing in the directory
// changed.
func TestOpenStorageRefuses(t *testing.T) {
	short := storageOptions{lockTimeout: 50 * time.Millisecond}

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
			wantText: []string{"unknown format version 99 (this walden reads versions 1 and 2)"},
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
			name: "no snapshots bucket",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketSnapshots) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{`raft.db: no "snapshots" bucket`},
		},
		{
			name: "the log's snapshot missing from raft.db",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.Bucket(bucketSnapshots).Delete(uint64Key(20)) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"raft.db: no snapshot at index 20 (the raft log's snapshot)"},
		},
		{
			name: "the log's snapshot of another term in raft.db",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(20)), Term: new(uint64(5))}}
					return putProtoKey(tx.Bucket(bucketSnapshots), uint64Key(20), snap)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"raft.db: snapshot 20 has term 5, the raft log says term 1"},
		},
		{
			name: "raft log directory missing",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				if err := os.RemoveAll(filepath.Join(dir, logDirName)); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"raftlog: the raft log directory is missing (raft.db records segments up to 0000000000000001.seg)"},
		},
		{
			name: "a foreign file in the raft log",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				if err := os.WriteFile(filepath.Join(dir, logDirName, "notes.txt"), []byte("mine"), 0o600); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"raftlog/notes.txt: not a segment of the raft log"},
		},
		{
			name: "a segment missing in the middle",
			prepare: func(t *testing.T) string {
				dir := multiSegmentDir(t)
				if err := os.Remove(segmentPaths(t, dir)[1]); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"0000000000000002.seg: segment is missing (0000000000000001.seg and 0000000000000003.seg are present)"},
		},
		{
			name: "the newest segment missing",
			prepare: func(t *testing.T) string {
				dir := multiSegmentDir(t)
				paths := segmentPaths(t, dir)
				if err := os.Remove(paths[len(paths)-1]); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"segment is missing: raft.db records it as the newest"},
		},
		{
			name: "the oldest segment missing",
			prepare: func(t *testing.T) string {
				dir := multiSegmentDir(t)
				if err := os.Remove(segmentPaths(t, dir)[0]); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"0000000000000002.seg: frame", "at offset 0: the oldest segment does not start with a checkpoint (older segments are missing)"},
		},
		{
			name: "the oldest segment's checkpoint damaged",
			prepare: func(t *testing.T) string {
				dir := multiSegmentDir(t)
				flipByte(t, segmentPaths(t, dir)[0], frameHeaderSize+10)
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"0000000000000001.seg: unreadable data at offset 0, after the last complete frame of a segment that is not the last"},
		},
		{
			name: "a damaged frame in an older segment",
			prepare: func(t *testing.T) string {
				dir := multiSegmentDir(t)
				path := segmentPaths(t, dir)[1]
				frames := readFrames(t, path)
				flipByte(t, path, frames[1].off+frameHeaderSize+100)
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"0000000000000002.seg: unreadable data at offset", "after the last complete frame of a segment that is not the last"},
		},
		{
			name: "a damaged frame followed by complete frames",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				path := segmentPaths(t, dir)[0]
				frames := readFrames(t, path)
				flipByte(t, path, frames[1].off+frameHeaderSize+300)
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"0000000000000001.seg: unreadable data at offset", "is followed by a complete frame at offset"},
		},
		{
			name: "the last frame damaged, not cut short",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				path := segmentPaths(t, dir)[0]
				frames := readFrames(t, path)
				flipByte(t, path, frames[len(frames)-1].off+frameHeaderSize+5)
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"0000000000000001.seg: damaged frame at offset", "the frame's checksum does not match"},
		},
		{
			name: "the segment file cut inside its last frame",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				path := segmentPaths(t, dir)[0]
				frames := readFrames(t, path)
				if err := os.Truncate(path, frames[len(frames)-1].off+30); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"0000000000000001.seg: damaged frame at offset", "runs past the end of the file"},
		},
		{
			name: "a segment of another member",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editLastSegment(t, dir, func(frames []loggedFrame) []loggedFrame {
					var fb frameBuf
					fb.reset()
					fb.addUint64s(recSegment, segmentFormat, 1, 7)
					frames[0].recs[0] = logRecord{typ: recSegment, data: fb.b[frameHeaderSize+2:]}
					return frames
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"segment belongs to raft id 7, raft.db to"},
		},
		{
			name: "gap in the log",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editEntries(t, dir, func(e *raftpb.Entry) []logRecord {
					if e.GetIndex() == 25 {
						return nil
					}
					return []logRecord{protoRecord(t, recEntry, e)}
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"entry 26 leaves a gap after the last index 24"},
		},
		{
			name: "terms going down",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editEntries(t, dir, func(e *raftpb.Entry) []logRecord {
					if e.GetIndex() == 33 {
						e.Term = new(uint64(3))
					}
					return []logRecord{protoRecord(t, recEntry, e)}
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"entry 34 has term 1 after term 3"},
		},
		{
			name: "undecodable entry",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editEntries(t, dir, func(e *raftpb.Entry) []logRecord {
					if e.GetIndex() == 30 {
						return []logRecord{{typ: recEntry, data: []byte{0xff, 0xff, 0xff}}}
					}
					return []logRecord{protoRecord(t, recEntry, e)}
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"entry does not decode"},
		},
		{
			name: "unknown record",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editLastSegment(t, dir, func(frames []loggedFrame) []loggedFrame {
					frames[2].recs = append(frames[2].recs, logRecord{typ: 99, data: []byte("x")})
					return frames
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"unknown record type 99"},
		},
		{
			name: "snapshot position beyond the log",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editLastSegment(t, dir, func(frames []loggedFrame) []loggedFrame {
					return mapRecords(frames, func(r logRecord) []logRecord {
						if r.typ == recSnapshotTaken {
							r.data = append(uint64Key(100), uint64Key(1)...)
						}
						return []logRecord{r}
					})
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"snapshot 100 outside (0, 40]"},
		},
		{
			name: "commit beyond the log",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				setHardState(t, dir, &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(41))})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"hard state commit 41 beyond last index 40"},
		},
		{
			name: "commit below the compaction point",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				setHardState(t, dir, &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(10))})
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
				setHardState(t, dir, &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(17))})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"hard state commit 17 below the snapshot index 20"},
		},
		// Format 1 (the whole log in raft.db) is checked as before, and a
		// damaged one is refused before anything is upgraded.
		{
			name: "format 1: no entries bucket",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketEntriesV1) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{`no "entries" bucket`},
		},
		{
			name: "format 1: gap in the log",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				editDB(t, dir, func(tx *bolt.Tx) error { return tx.Bucket(bucketEntriesV1).Delete(uint64Key(25)) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"entries jump from index 24 to 26"},
		},
		{
			name: "format 1: snapshot beyond the log",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(100)), Term: new(uint64(1)), ConfState: &raftpb.ConfState{Voters: []uint64{1}}}}
					return putProtoKey(tx.Bucket(bucketStateV1), []byte(keySnapshotV1), snap)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"snapshot index 100 outside the log [15, 40] (first index 16, last index 40)"},
		},
		{
			name: "format 1: compacted beyond the snapshot",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					for i := uint64(15); i <= 22; i++ {
						if err := tx.Bucket(bucketEntriesV1).Delete(uint64Key(i)); err != nil {
							return err
						}
					}
					return nil
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"snapshot index 20 outside the log [23, 40]"},
		},
		{
			name: "format 1: commit beyond the log",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					hs := &raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(41))}
					return putProtoKey(tx.Bucket(bucketStateV1), []byte(keyHardStateV1), hs)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"hard state commit 41 beyond last index 40"},
		},
		{
			name: "format 1: commit below the snapshot",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					hs := &raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(17))}
					return putProtoKey(tx.Bucket(bucketStateV1), []byte(keyHardStateV1), hs)
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"hard state commit 17 below the snapshot index 20"},
		},
		{
			name: "format 1: undecodable entry",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				editDB(t, dir, func(tx *bolt.Tx) error {
					return tx.Bucket(bucketEntriesV1).Put(uint64Key(30), []byte{0xff, 0xff, 0xff})
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"entry 30 does not decode"},
		},
		{
			// A bit flip inside an entry that leaves the entry well-formed
			// but its command undecodable: the apply path would stop on it.
			name: "format 1: entry whose command does not decode",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				e := &raftpb.Entry{Index: new(uint64(31)), Term: new(uint64(2)), Data: []byte{0xff, 0xff, 0xff}}
				editDB(t, dir, func(tx *bolt.Tx) error { return putProtoKey(tx.Bucket(bucketEntriesV1), uint64Key(31), e) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"the command of entry 31 (term 2) does not decode"},
		},
		{
			name: "format 1: membership change that does not decode",
			prepare: func(t *testing.T) string {
				dir := v1Dir(t)
				e := &raftpb.Entry{Index: new(uint64(32)), Term: new(uint64(2)), Type: raftpb.EntryConfChangeV2.Enum(), Data: []byte{0xff, 0xff, 0xff}}
				editDB(t, dir, func(tx *bolt.Tx) error { return putProtoKey(tx.Bucket(bucketEntriesV1), uint64Key(32), e) })
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"the membership change of entry 32 (term 2) does not decode"},
		},
		{
			name: "entry whose command does not decode",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editEntries(t, dir, func(e *raftpb.Entry) []logRecord {
					if e.GetIndex() == 31 {
						e.Data = []byte{0xff, 0xff, 0xff}
					}
					return []logRecord{protoRecord(t, recEntry, e)}
				})
				return dir
			},
			want:     ErrDamagedDataDir,
			wantText: []string{"the command of entry 31 (term 1) does not decode"},
		},
		{
			name: "membership change that does not decode",
			prepare: func(t *testing.T) string {
				dir := populatedDir(t)
				editEntries(t, dir, func(e *raftpb.Entry) []logRecord {
					if e.GetIndex() == 32 {
						e.Type, e.Data = raftpb.EntryConfChangeV2.Enum(), []byte{0xff, 0xff, 0xff}
					}
					return []logRecord{protoRecord(t, recEntry, e)}
				})
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
			s, err := openWith(dir, cluster, node, nil, short)
			if err == nil {
				_ = s.Close()
				t.Fatalf("Open accepted the directory")
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

// putProtoKey stores m marshaled under key in b.
func putProtoKey(b *bolt.Bucket, key []byte, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put(key, v)
}

// TestOpenStorageRefusesLockedDir opens a data directory that a running
// storage holds.
func TestOpenStorageRefusesLockedDir(t *testing.T) {
	dir := populatedDir(t)
	s := openTestStorage(t, dir)
	defer s.Close()
	before := fingerprint(t, dir)
	if _, err := openWith(dir, "test", "n1", nil, storageOptions{lockTimeout: 50 * time.Millisecond}); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second Open: %v, want ErrDataDirInUse", err)
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
				id, version, err := readIdentity(tx.Bucket(bucketMeta))
				if err != nil || version != storageFormatVersion || id != (storageIdentity{clusterName: "test", nodeID: "n1", raftID: RaftID("n1")}) {
					t.Errorf("meta record = %+v, version %d, %v", id, version, err)
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
