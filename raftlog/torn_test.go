package raftlog

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// tornDir returns a data dir whose only segment ends with two frames: A
// (entries 1-5, HardState term 1 vote 1 commit 0) and B (entries 6-10 of
// 600 bytes, HardState commit 8), B spanning several sectors. It returns the
// path of the segment and B's offset and length.
func tornDir(t *testing.T) (dir, seg string, bOff, bLen int64) {
	t.Helper()
	dir = t.TempDir()
	s, err := openWith(dir, "test", "n1", nil, storageOptions{segmentSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(crashHS(1, 1, 0), crashEntries(1, 5, 1, 100), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(crashHS(1, 1, 8), crashEntries(6, 10, 1, 600), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	seg = segmentPaths(t, dir)[0]
	frames := readFrames(t, seg)
	b := frames[len(frames)-1]
	info, _ := os.Stat(seg)
	end := info.Size()
	// B ends where the zeros start.
	data, _ := os.ReadFile(seg)
	for end > b.off && data[end-1] == 0 {
		end--
	}
	return dir, seg, b.off, alignFrame(end - b.off)
}

// zeroRange writes zeros over [from, to) of path: sectors that never
// reached the disk.
func zeroRange(t *testing.T, path string, from, to int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, to-from), from); err != nil {
		t.Fatal(err)
	}
}

// TestStorageDiscardsUnfinishedWrite opens logs whose last frame a crash cut
// short in the ways a disk can (sectors that never reached it read as
// zeros): the frame is discarded with a warning naming the file and the
// offset, the state is the one before it, the bytes are zeroed, and the log
// takes new writes.
func TestStorageDiscardsUnfinishedWrite(t *testing.T) {
	cases := []struct {
		name string
		tear func(t *testing.T, seg string, off, n int64)
	}{
		{"a middle sector lost", func(t *testing.T, seg string, off, n int64) {
			s := (off/sectorSize + 2) * sectorSize
			zeroRange(t, seg, s, s+sectorSize)
		}},
		{"the header's sector lost, the rest written", func(t *testing.T, seg string, off, n int64) {
			zeroRange(t, seg, off, (off/sectorSize+1)*sectorSize)
		}},
		{"only the first sector written", func(t *testing.T, seg string, off, n int64) {
			zeroRange(t, seg, (off/sectorSize+1)*sectorSize, off+n)
		}},
		{"the last sector lost", func(t *testing.T, seg string, off, n int64) {
			zeroRange(t, seg, ((off+n-1)/sectorSize)*sectorSize, off+n)
		}},
		{"nothing written", func(t *testing.T, seg string, off, n int64) {
			zeroRange(t, seg, off, off+n)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, seg, off, n := tornDir(t)
			tc.tear(t, seg, off, n)
			var logs bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&logs, nil))
			s, err := openWith(dir, "test", "n1", logger, storageOptions{segmentSize: 64 << 10})
			if err != nil {
				t.Fatalf("open after a torn write: %v", err)
			}
			if last, _ := s.LastIndex(); last != 5 {
				t.Errorf("last index %d, want 5 (frame B discarded)", last)
			}
			if hs, _, _ := s.InitialState(); hs.GetCommit() != 0 || hs.GetTerm() != 1 {
				t.Errorf("hard state %v, want frame A's", hs)
			}
			if tc.name != "nothing written" && !strings.Contains(logs.String(), "discarded an unfinished write") ||
				tc.name != "nothing written" && !strings.Contains(logs.String(), seg) {
				t.Errorf("no warning naming %s:\n%s", seg, logs.String())
			}
			data, _ := os.ReadFile(seg)
			if !allZero(data[off:]) {
				t.Error("the unfinished write was not zeroed")
			}
			// New entries go where B was and survive a restart.
			if err := s.Save(crashHS(2, 1, 7), crashEntries(6, 7, 2, 300), nil); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s, err = Open(dir, "test", "n1", nil)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			defer s.Close()
			ents, err := s.Entries(6, 8, 1<<30)
			if err != nil || len(ents) != 2 || ents[1].GetTerm() != 2 {
				t.Fatalf("entries 6-7 after repair and restart: %v, %v", ents, err)
			}
		})
	}
}

// TestStorageRefusesDamageThatIsNoTornWrite opens logs whose end holds what
// a crash cannot leave: nothing is changed and the error names the file
// and the offset.
func TestStorageRefusesDamageThatIsNoTornWrite(t *testing.T) {
	cases := []struct {
		name string
		harm func(t *testing.T, seg string, off, n int64)
		want string
	}{
		{"a byte of the last frame changed", func(t *testing.T, seg string, off, n int64) {
			flipByte(t, seg, off+n/2)
		}, "the frame's checksum does not match"},
		{"garbage after the last frame", func(t *testing.T, seg string, off, n int64) {
			f, err := os.OpenFile(seg, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, 16), off+n); err != nil {
				t.Fatal(err)
			}
		}, "the frame header's checksum does not match"},
		{"a torn frame followed by a complete one", func(t *testing.T, seg string, off, n int64) {
			data, _ := os.ReadFile(seg)
			frame := append([]byte(nil), data[off:off+n]...)
			s := (off/sectorSize + 2) * sectorSize
			zeroRange(t, seg, s, s+sectorSize)
			f, err := os.OpenFile(seg, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(frame, off+n); err != nil {
				t.Fatal(err)
			}
		}, "is followed by a complete frame at offset"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, seg, off, n := tornDir(t)
			tc.harm(t, seg, off, n)
			before := fingerprint(t, dir)
			s, err := Open(dir, "test", "n1", nil)
			if err == nil {
				_ = s.Close()
				t.Fatal("opened a damaged log")
			}
			if !errors.Is(err, ErrDamagedDataDir) || !strings.Contains(err.Error(), seg) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrDamagedDataDir naming %s and saying %q", err, seg, tc.want)
			}
			assertUnchanged(t, before, fingerprint(t, dir))
		})
	}
}

// TestStorageEntriesSurviveReopenAcrossSegments reads a log of several
// segments back, then checkpoints it into one.
func TestStorageEntriesSurviveReopenAcrossSegments(t *testing.T) {
	dir := multiSegmentDir(t)
	s, err := openWith(dir, "test", "n1", nil, storageOptions{segmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ents, err := s.Entries(1, 31, 1<<30)
	if err != nil || len(ents) != 30 {
		t.Fatalf("entries 1-30 across %d segments: %d, %v", len(segmentPaths(t, dir)), len(ents), err)
	}
	for i, e := range ents {
		if e.GetIndex() != uint64(i+1) || !bytes.Equal(e.GetData(), testCommand(bytes.Repeat([]byte{byte(i + 1)}, 1024))) {
			t.Fatalf("entry %d = %v", i+1, e.GetIndex())
		}
	}
	// A snapshot and compaction with several segments writes a checkpoint
	// segment and deletes the others.
	if _, err := s.CreateSnapshot(25, &raftpb.ConfState{Voters: []uint64{1}}, []byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(20); err != nil {
		t.Fatal(err)
	}
	if n := len(segmentPaths(t, dir)); n != 1 {
		t.Fatalf("%d segments after the checkpoint, want 1", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, "test", "n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if f, _ := s.FirstIndex(); f != 21 {
		t.Fatalf("first index %d after the checkpoint, want 21", f)
	}
	if ents, err := s.Entries(21, 31, 1<<30); err != nil || len(ents) != 10 {
		t.Fatalf("entries 21-30 after the checkpoint: %d, %v", len(ents), err)
	}
	if snap, _ := s.Snapshot(); snap.GetMetadata().GetIndex() != 25 || string(snap.GetData()) != "state" {
		t.Fatalf("snapshot after the checkpoint: %v", snap.GetMetadata())
	}
}
