package raftlog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The crash tests run a workload that takes every write path of the
// storage (entries, a commit index left for later, a conflicting suffix,
// local and received snapshots, compaction, segment cuts and checkpoints,
// the upgrade of a format-1 directory, Close) and interrupt it at every
// step a crash can fall on (opts.point: before and after each write, sync,
// rename, removal and bbolt transaction). After each crash the directory
// must open — a crash is not damage — and hold the state of the last
// completed step or of the interrupted one, never anything else; and it must
// take new writes.
//
// Two ways to crash:
//   - TestStorageCrashAtEveryPoint builds the disk images a power loss at
//     each point could leave, through crashFS (unsynced sectors and
//     directory changes lost, all or at random);
//   - TestStorageKilledAtEveryPoint runs the workload in a child process
//     and kills it with SIGKILL at each point: what a process crash leaves
//     (the kernel keeps every write), including names renamed but not yet
//     synced and files half made.

// crashSegmentSize keeps the segments small, so that the workload cuts
// several and checkpoints.
const crashSegmentSize = 4 << 10

// crashStep is one step of a crash workload.
type crashStep struct {
	name string
	run  func(s **DiskStorage, open func() (*DiskStorage, error)) error
}

func crashEntries(from, to, term uint64, size int) []*raftpb.Entry {
	var ents []*raftpb.Entry
	for i := from; i <= to; i++ {
		ents = append(ents, &raftpb.Entry{Index: new(i), Term: new(term), Data: testCommand(bytes.Repeat([]byte{byte(i), byte(term)}, size/2))})
	}
	return ents
}

func crashHS(term, vote, commit uint64) *raftpb.HardState {
	return &raftpb.HardState{Term: new(term), Vote: new(vote), Commit: new(commit)}
}

func crashSnap(index, term uint64, data string) *raftpb.Snapshot {
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(index), Term: new(term),
		ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}, Data: []byte(data)}
}

func save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) func(**DiskStorage, func() (*DiskStorage, error)) error {
	return func(s **DiskStorage, _ func() (*DiskStorage, error)) error { return (*s).Save(hs, ents, snap) }
}

// crashWorkload is the workload on a new directory (fresh: true) or on a
// copy of the format-1 directory testdata/v1/populated (fresh: false).
func crashWorkload(fresh bool) []crashStep {
	open := crashStep{"open", func(s **DiskStorage, open func() (*DiskStorage, error)) error {
		var err error
		*s, err = open()
		return err
	}}
	closeStep := crashStep{"close", func(s **DiskStorage, _ func() (*DiskStorage, error)) error { return (*s).Close() }}
	if !fresh {
		// The fixture: entries 16..40 (terms 1 and 2), commit 30,
		// snapshot 20.
		return []crashStep{
			open,
			{"save 41-45", save(crashHS(2, 1, 35), crashEntries(41, 45, 2, 300), nil)},
			{"snapshot 35", func(s **DiskStorage, _ func() (*DiskStorage, error)) error {
				_, err := (*s).CreateSnapshot(35, nil, []byte("state at 35"))
				return err
			}},
			{"compact 30", func(s **DiskStorage, _ func() (*DiskStorage, error)) error { return (*s).Compact(30) }},
			{"commit 45 (deferred)", save(crashHS(2, 1, 45), nil, nil)},
			closeStep,
		}
	}
	return []crashStep{
		open,
		{"save 1-3", save(crashHS(1, 1, 0), crashEntries(1, 3, 1, 200), nil)},
		{"commit 2 (deferred)", save(crashHS(1, 1, 2), nil, nil)},
		{"save 4-12", save(nil, crashEntries(4, 12, 1, 700), nil)},
		{"save 8-14 over 8-12", save(crashHS(2, 2, 7), crashEntries(8, 14, 2, 500), nil)},
		{"snapshot 6", func(s **DiskStorage, _ func() (*DiskStorage, error)) error {
			_, err := (*s).CreateSnapshot(6, &raftpb.ConfState{Voters: []uint64{1, 2}}, []byte("state at 6"))
			return err
		}},
		{"compact 4", func(s **DiskStorage, _ func() (*DiskStorage, error)) error { return (*s).Compact(4) }},
		{"received snapshot 20", save(crashHS(3, 3, 20), nil, crashSnap(20, 3, "leader's state at 20"))},
		{"save 21-30", save(crashHS(3, 3, 25), crashEntries(21, 30, 3, 600), nil)},
		{"snapshot 25", func(s **DiskStorage, _ func() (*DiskStorage, error)) error {
			_, err := (*s).CreateSnapshot(25, nil, []byte("state at 25"))
			return err
		}},
		{"compact 24", func(s **DiskStorage, _ func() (*DiskStorage, error)) error { return (*s).Compact(24) }},
		{"received snapshot 28 (keeps 29-30)", save(crashHS(3, 3, 29), nil, crashSnap(28, 3, "leader's state at 28"))},
		{"commit 30 (deferred)", save(crashHS(3, 3, 30), nil, nil)},
		closeStep,
	}
}

// storedState is what a storage holds, as its read methods say.
type storedState struct {
	first, last, offsetTerm uint64
	ents                    []*raftpb.Entry
	hs                      *raftpb.HardState
	snap                    *raftpb.Snapshot
}

func captureState(t testing.TB, s *DiskStorage) storedState {
	t.Helper()
	var st storedState
	var err error
	if st.first, err = s.FirstIndex(); err != nil {
		t.Fatal(err)
	}
	if st.last, err = s.LastIndex(); err != nil {
		t.Fatal(err)
	}
	if st.offsetTerm, err = s.Term(st.first - 1); err != nil {
		t.Fatal(err)
	}
	if st.last >= st.first {
		if st.ents, err = s.Entries(st.first, st.last+1, math.MaxUint64); err != nil {
			t.Fatal(err)
		}
	}
	hs, _, err := s.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	st.hs = hs
	if st.snap, err = s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	return st
}

// sameLog compares everything but the commit index.
func (a storedState) sameLog(b storedState) bool {
	if a.first != b.first || a.last != b.last || a.offsetTerm != b.offsetTerm || len(a.ents) != len(b.ents) ||
		a.hs.GetTerm() != b.hs.GetTerm() || a.hs.GetVote() != b.hs.GetVote() || (a.hs == nil) != (b.hs == nil) ||
		!equalSnapshots(a.snap, b.snap) {
		return false
	}
	for i := range a.ents {
		if !proto.Equal(a.ents[i], b.ents[i]) {
			return false
		}
	}
	return true
}

func (a storedState) String() string {
	return fmt.Sprintf("log [%d, %d] (term %d at %d), hard state %v, snapshot %d", a.first, a.last, a.offsetTerm, a.first-1, a.hs, a.snap.GetMetadata().GetIndex())
}

// expectedStates runs the workload without crashing and returns the state
// after each step and the commit index on disk then (a deferred commit
// index is not).
func expectedStates(t *testing.T, fresh bool) (states []storedState, durable []uint64) {
	t.Helper()
	dir := crashStartDir(t, fresh)
	var s *DiskStorage
	open := func() (*DiskStorage, error) {
		return openWith(dir, "test", "n1", nil, storageOptions{segmentSize: crashSegmentSize, noSync: true})
	}
	var commitOnDisk uint64
	for _, step := range crashWorkload(fresh) {
		if step.name == "close" {
			if err := step.run(&s, open); err != nil {
				t.Fatal(err)
			}
			var err error
			if s, err = open(); err != nil {
				t.Fatal(err)
			}
		} else if err := step.run(&s, open); err != nil {
			t.Fatalf("step %q: %v", step.name, err)
		}
		st := captureState(t, s)
		if !strings.Contains(step.name, "deferred") {
			commitOnDisk = st.hs.GetCommit()
		}
		states = append(states, st)
		durable = append(durable, commitOnDisk)
	}
	_ = s.Close()
	return states, durable
}

// crashStartDir is the directory a workload starts on.
func crashStartDir(t *testing.T, fresh bool) string {
	t.Helper()
	if fresh {
		return filepath.Join(t.TempDir(), "data")
	}
	return v1Dir(t)
}

// checkCrashImage opens a crash image of the interrupted step k and checks
// it holds the state before or after the step, then that it takes a new
// entry and keeps it across a restart.
func checkCrashImage(t *testing.T, dir, what string, k int, states []storedState, durable []uint64) (repaired bool) {
	t.Helper()
	s, err := openWith(dir, "test", "n1", nil, storageOptions{segmentSize: crashSegmentSize, noSync: true,
		point: func(where string) { repaired = repaired || where == "log torn tail zeroed" }})
	if err != nil {
		t.Fatalf("%s: the crash image does not open: %v", what, err)
	}
	got := captureState(t, s)
	before := states[max(k-1, 0)]
	after := states[k]
	if !got.sameLog(before) && !got.sameLog(after) {
		_ = s.Close()
		t.Fatalf("%s: state after the crash\n  %v\nis neither the state before the step\n  %v\nnor after it\n  %v", what, got, before, after)
	}
	lowCommit := durable[max(k-1, 0)]
	if k == 0 {
		lowCommit = 0
	}
	if c := got.hs.GetCommit(); c < lowCommit || c > max(before.hs.GetCommit(), after.hs.GetCommit()) {
		_ = s.Close()
		t.Fatalf("%s: commit index %d after the crash, want between %d (on disk before the step) and %d", what, c, lowCommit, max(before.hs.GetCommit(), after.hs.GetCommit()))
	}
	// The repaired log takes new writes.
	term := max(got.hs.GetTerm(), got.offsetTerm)
	if n := len(got.ents); n > 0 {
		term = max(term, got.ents[n-1].GetTerm())
	}
	next := crashEntries(got.last+1, got.last+1, term, 100)
	if err := s.Save(nil, next, nil); err != nil {
		_ = s.Close()
		t.Fatalf("%s: save after the crash: %v", what, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("%s: close after the crash: %v", what, err)
	}
	s, err = openWith(dir, "test", "n1", nil, storageOptions{segmentSize: crashSegmentSize, noSync: true})
	if err != nil {
		t.Fatalf("%s: reopen after a write after the crash: %v", what, err)
	}
	defer s.Close()
	if last, _ := s.LastIndex(); last != got.last+1 {
		t.Fatalf("%s: last index %d after a write and a restart, want %d", what, last, got.last+1)
	}
	return repaired
}

// TestStorageCrashAtEveryPoint interrupts the workloads at every crash
// point with a simulated power loss (crashFS): nothing unsynced survives,
// everything survives, and twice each unsynced sector and directory change
// at random.
func TestStorageCrashAtEveryPoint(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		name := "fresh"
		if !fresh {
			name = "upgraded from format 1"
		}
		t.Run(name, func(t *testing.T) {
			states, durable := expectedStates(t, fresh)
			dir := crashStartDir(t, fresh)
			cfs := newCrashFS(dir)
			imageDir := t.TempDir()
			var (
				step     int
				points   int
				images   int
				repaired int
				rng      = rand.New(rand.NewPCG(11, 17))
			)
			opts := storageOptions{fs: cfs, segmentSize: crashSegmentSize, point: func(where string) {
				points++
				modes := []crashMode{loseNothing, loseAll, loseSome, loseSome}
				if where == "log write" {
					// A frame written, not synced: tear it more ways.
					modes = append(modes, loseSome, loseSome, loseSome, loseSome)
				}
				for _, mode := range modes {
					images++
					img := filepath.Join(imageDir, fmt.Sprintf("%d-%s-%d", points, mode, rng.Uint32()))
					cfs.image(t, img, mode, rng)
					if checkCrashImage(t, img, fmt.Sprintf("step %d %q, crash at %q (point %d, %v)", step, crashWorkload(fresh)[step].name, where, points, mode), step, states, durable) {
						repaired++
					}
					_ = os.RemoveAll(img)
				}
			}}
			open := func() (*DiskStorage, error) { return openWith(dir, "test", "n1", nil, opts) }
			var s *DiskStorage
			for k, st := range crashWorkload(fresh) {
				step = k
				if err := st.run(&s, open); err != nil {
					t.Fatalf("step %q: %v", st.name, err)
				}
			}
			t.Logf("%d crash points, %d images checked, %d with an unfinished write discarded", points, images, repaired)
			if points < 20 || repaired == 0 {
				t.Fatalf("%d crash points, %d unfinished writes: the workload missed write paths", points, repaired)
			}
		})
	}
}

// TestStorageKilledAtEveryPoint runs the workloads in a child process and
// kills it (SIGKILL) at the n-th crash point, for every n until the child
// finishes; each time the directory must open with the state before or
// after the step it was killed in.
func TestStorageKilledAtEveryPoint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process per crash point")
	}
	for _, fresh := range []bool{true, false} {
		name := "fresh"
		if !fresh {
			name = "upgraded from format 1"
		}
		t.Run(name, func(t *testing.T) {
			states, durable := expectedStates(t, fresh)
			for n := 1; ; n++ {
				dir := crashStartDir(t, fresh)
				cmd := exec.Command(os.Args[0], "-test.run=^TestStorageCrashChild$", "-test.count=1")
				cmd.Env = append(os.Environ(), "WALDEN_CRASH_DIR="+dir, "WALDEN_CRASH_AT="+strconv.Itoa(n),
					"WALDEN_CRASH_FRESH="+strconv.FormatBool(fresh))
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				err := cmd.Run()
				done := -1
				sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
				for sc.Scan() {
					if v, ok := strings.CutPrefix(sc.Text(), "crash-step-done "); ok {
						done, _ = strconv.Atoi(v)
					}
				}
				var exit *exec.ExitError
				killed := errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signaled()
				if !killed {
					if err != nil {
						t.Fatalf("child with crash point %d: %v\n%s", n, err, out.String())
					}
					if done != len(states)-1 {
						t.Fatalf("child finished after step %d of %d:\n%s", done, len(states)-1, out.String())
					}
					t.Logf("killed at each of %d crash points", n-1)
					if n < 20 {
						t.Fatalf("only %d crash points: the workload missed write paths", n-1)
					}
					return
				}
				k := done + 1 // the step the child was in
				checkCrashImage(t, dir, fmt.Sprintf("killed at point %d in step %d %q", n, k, crashWorkload(fresh)[k].name), k, states, durable)
			}
		})
	}
}

// TestStorageCrashChild is the child of TestStorageKilledAtEveryPoint.
func TestStorageCrashChild(t *testing.T) {
	dir := os.Getenv("WALDEN_CRASH_DIR")
	if dir == "" {
		t.Skip("run by TestStorageKilledAtEveryPoint")
	}
	at, _ := strconv.Atoi(os.Getenv("WALDEN_CRASH_AT"))
	fresh, _ := strconv.ParseBool(os.Getenv("WALDEN_CRASH_FRESH"))
	points := 0
	opts := storageOptions{segmentSize: crashSegmentSize, point: func(string) {
		points++
		if points == at {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}}
	open := func() (*DiskStorage, error) { return openWith(dir, "test", "n1", nil, opts) }
	var s *DiskStorage
	for k, st := range crashWorkload(fresh) {
		if err := st.run(&s, open); err != nil {
			t.Fatalf("step %q: %v", st.name, err)
		}
		fmt.Fprintf(os.Stdout, "crash-step-done %d\n", k)
	}
}
