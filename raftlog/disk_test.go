package raftlog

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// testCommand is the data of a normal entry: a Noop command carrying
// payload.
func testCommand(payload []byte) []byte {
	b, err := proto.Marshal(&waldenv1.Command{Op: &waldenv1.Command_Noop{Noop: &waldenv1.Noop{Payload: payload}}})
	if err != nil {
		panic(err)
	}
	return b
}

// openTestStorage opens the storage of cluster "test" node "n1" in dir,
// with segments of 256 KiB (copying and reading them back is then quick).
func openTestStorage(t testing.TB, dir string) *DiskStorage {
	t.Helper()
	s, err := openWith(dir, "test", "n1", nil, storageOptions{segmentSize: 256 << 10})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// diffModel drives a DiskStorage and a raft.MemoryStorage with the same
// operations and compares every answer.
type diffModel struct {
	t    *testing.T
	rng  *rand.Rand
	dir  string
	mem  *raft.MemoryStorage
	bolt *DiskStorage
	// term is the highest term used so far; commit the last saved commit.
	term, commit uint64
	log          []string
}

func (m *diffModel) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...))
}

func (m *diffModel) fatalf(format string, args ...any) {
	m.t.Helper()
	start := max(0, len(m.log)-15)
	m.t.Fatalf("%s\nlast operations:\n%s", fmt.Sprintf(format, args...), joinLines(m.log[start:]))
}

func joinLines(lines []string) string {
	out := ""
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out
}

// state reads the memory side's indexes.
func (m *diffModel) state() (offset, last, snapIndex uint64) {
	first, _ := m.mem.FirstIndex()
	last, _ = m.mem.LastIndex()
	snap, _ := m.mem.Snapshot()
	return first - 1, last, snap.GetMetadata().GetIndex()
}

func (m *diffModel) randEntries(from uint64, n int) []*raftpb.Entry {
	if m.rng.IntN(3) == 0 {
		m.term++
	}
	ents := make([]*raftpb.Entry, n)
	for i := range ents {
		e := &raftpb.Entry{Index: new(from + uint64(i)), Term: new(m.term)}
		switch m.rng.IntN(6) {
		case 0:
			e.Type = raftpb.EntryConfChangeV2.Enum()
		case 1:
			e.Type = raftpb.EntryNormal.Enum()
		}
		if sz := m.rng.IntN(80); sz > 0 {
			payload := make([]byte, sz)
			for j := range payload {
				payload[j] = byte(m.rng.Uint32())
			}
			// The data decodes as what the entry's type says (the start-up
			// check decodes it).
			if e.GetType() == raftpb.EntryConfChangeV2 {
				e.Data, _ = proto.Marshal(&raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{NodeId: new(uint64(sz))}}})
			} else {
				e.Data = testCommand(payload)
			}
		}
		ents[i] = e
	}
	return ents
}

func (m *diffModel) randConfState() *raftpb.ConfState {
	cs := &raftpb.ConfState{}
	for id := uint64(1); id <= 5; id++ {
		switch m.rng.IntN(3) {
		case 0:
			cs.Voters = append(cs.Voters, id)
		case 1:
			cs.Learners = append(cs.Learners, id)
		}
	}
	if m.rng.IntN(2) == 0 {
		cs.AutoLeave = new(false)
	}
	return cs
}

func (m *diffModel) randData() []byte {
	if m.rng.IntN(4) == 0 {
		return nil
	}
	d := make([]byte, m.rng.IntN(200))
	for i := range d {
		d[i] = byte(m.rng.Uint32())
	}
	return d
}

// opSave saves a random Ready: maybe a snapshot, maybe entries (possibly
// overwriting a suffix), maybe a HardState.
func (m *diffModel) opSave() {
	offset, last, snapIndex := m.state()
	var (
		snap   *raftpb.Snapshot
		suffix []*raftpb.Entry
	)
	if m.rng.IntN(6) == 0 {
		// A snapshot sent to a follower is never below its commit index.
		low := max(snapIndex+1, m.commit)
		idx := low + uint64(m.rng.IntN(int(last+4-low)))
		term := m.term + 1
		if idx > offset && idx <= last && m.rng.IntN(2) == 0 {
			// The log holds the snapshot's entry: keep what follows.
			term, _ = m.mem.Term(idx)
			if idx < last {
				suffix, _ = m.mem.Entries(idx+1, last+1, math.MaxUint64)
			}
		}
		m.term = max(m.term, term)
		snap = &raftpb.Snapshot{
			Metadata: &raftpb.SnapshotMetadata{Index: new(idx), Term: new(term), ConfState: m.randConfState()},
			Data:     m.randData(),
		}
	}
	// Plan entries against the state after the snapshot.
	pOffset, pLast, pSnap := offset, last, snapIndex
	if snap != nil {
		pOffset, pSnap = snap.GetMetadata().GetIndex(), snap.GetMetadata().GetIndex()
		pLast = pOffset + uint64(len(suffix))
	}
	var ents []*raftpb.Entry
	if m.rng.IntN(4) != 0 {
		low := max(pSnap, m.commit) + 1
		from := low + uint64(m.rng.IntN(int(pLast+2-low)))
		if pSnap == pOffset && m.commit <= pOffset && m.rng.IntN(5) == 0 {
			// Start below FirstIndex: the compacted head is ignored.
			from = pOffset + 1 - min(pOffset, uint64(m.rng.IntN(3)))
			from = max(from, 1)
		}
		ents = m.randEntries(from, 1+m.rng.IntN(8))
	}
	newLast := pLast
	if len(ents) > 0 {
		if l := ents[len(ents)-1].GetIndex(); l > pOffset {
			newLast = l
		}
	}
	var hs *raftpb.HardState
	// A Ready with a snapshot always carries the HardState that commits it.
	if snap != nil || m.rng.IntN(2) == 0 {
		commit := m.commit
		if snap != nil {
			commit = max(commit, snap.GetMetadata().GetIndex())
		}
		commit += uint64(m.rng.IntN(int(newLast-min(commit, newLast)) + 1))
		commit = min(commit, newLast)
		hs = &raftpb.HardState{Term: new(m.term), Vote: new(uint64(m.rng.IntN(4))), Commit: new(commit)}
	}
	m.logf("Save(hs=%v, ents=%d from %d, snap=%v)", hs, len(ents), firstIndexOf(ents), snap.GetMetadata())

	if err := m.bolt.Save(hs, ents, snap); err != nil {
		m.fatalf("Save: %v", err)
	}
	if snap != nil {
		if err := m.mem.ApplySnapshot(snap); err != nil {
			m.fatalf("memory ApplySnapshot: %v", err)
		}
		if err := m.mem.Append(suffix); err != nil {
			m.fatalf("memory Append suffix: %v", err)
		}
	}
	if err := m.mem.Append(ents); err != nil {
		m.fatalf("memory Append: %v", err)
	}
	if !raft.IsEmptyHardState(hs) {
		_ = m.mem.SetHardState(hs)
		m.commit = hs.GetCommit()
	}
}

func firstIndexOf(ents []*raftpb.Entry) uint64 {
	if len(ents) == 0 {
		return 0
	}
	return ents[0].GetIndex()
}

// opSaveRefused saves something the contract refuses; nothing may change.
func (m *diffModel) opSaveRefused() {
	offset, last, snapIndex := m.state()
	var (
		err  error
		want error
	)
	switch m.rng.IntN(3) {
	case 0:
		if snapIndex == 0 {
			return
		}
		low := max(1, offset)
		idx := low + uint64(m.rng.IntN(int(snapIndex-low)+1))
		m.logf("Save(stale snapshot %d)", idx)
		snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(idx), Term: new(m.term)}}
		err, want = m.bolt.Save(nil, m.randEntries(last+1, 1), snap), raft.ErrSnapOutOfDate
		if merr := m.mem.ApplySnapshot(snap); !errors.Is(merr, raft.ErrSnapOutOfDate) {
			m.fatalf("memory ApplySnapshot of stale snapshot: %v", merr)
		}
	case 1:
		m.logf("Save(gap after %d)", last)
		err, want = m.bolt.Save(nil, m.randEntries(last+2, 2), nil), ErrInvalidSave
	case 2:
		if snapIndex <= offset {
			return
		}
		m.logf("Save(overwrite snapshot %d)", snapIndex)
		err, want = m.bolt.Save(nil, m.randEntries(snapIndex, 1), nil), ErrInvalidSave
	}
	if !errors.Is(err, want) {
		m.fatalf("refused Save: got %v, want %v", err, want)
	}
}

func (m *diffModel) opCreateSnapshot() {
	_, last, snapIndex := m.state()
	var i uint64
	switch m.rng.IntN(5) {
	case 0:
		i = uint64(m.rng.IntN(int(snapIndex) + 1)) // out of date
	case 1:
		i = last + 1 + uint64(m.rng.IntN(3)) // beyond the log
	default:
		// The node snapshots at its applied index, never beyond the commit
		// index.
		if m.commit <= snapIndex {
			return
		}
		i = snapIndex + 1 + uint64(m.rng.IntN(int(m.commit-snapIndex)))
	}
	var cs *raftpb.ConfState
	if m.rng.IntN(3) != 0 {
		cs = m.randConfState()
	}
	data := m.randData()
	m.logf("CreateSnapshot(%d, %v, %d bytes)", i, cs, len(data))
	got, err := m.bolt.CreateSnapshot(i, cs, data)
	if i > last {
		if !errors.Is(err, raft.ErrUnavailable) {
			m.fatalf("CreateSnapshot(%d) beyond last %d: got %v, want ErrUnavailable", i, last, err)
		}
		return
	}
	want, werr := m.mem.CreateSnapshot(i, cs, data)
	if !sameErr(err, werr) {
		m.fatalf("CreateSnapshot(%d): bolt error %v, memory error %v", i, err, werr)
	}
	if werr == nil && !equalSnapshots(got, want) {
		m.fatalf("CreateSnapshot(%d): bolt %v, memory %v", i, got, want)
	}
}

func (m *diffModel) opCompact() {
	offset, last, snapIndex := m.state()
	var c uint64
	switch m.rng.IntN(5) {
	case 0:
		c = uint64(m.rng.IntN(int(offset) + 1)) // already compacted
	case 1:
		if snapIndex == last {
			return
		}
		c = snapIndex + 1 + uint64(m.rng.IntN(int(last-snapIndex)+2))
	default:
		if snapIndex == offset {
			return
		}
		c = offset + 1 + uint64(m.rng.IntN(int(snapIndex-offset)))
	}
	m.logf("Compact(%d)", c)
	err := m.bolt.Compact(c)
	switch {
	case c > last:
		if !errors.Is(err, raft.ErrUnavailable) {
			m.fatalf("Compact(%d) beyond last %d: got %v", c, last, err)
		}
		return
	case c > snapIndex:
		if !errors.Is(err, ErrCompactBeyondSnapshot) {
			m.fatalf("Compact(%d) beyond snapshot %d: got %v", c, snapIndex, err)
		}
		return
	}
	if werr := m.mem.Compact(c); !sameErr(err, werr) {
		m.fatalf("Compact(%d): bolt error %v, memory error %v", c, err, werr)
	}
}

// opRead calls one read method with random, possibly out-of-range, arguments.
func (m *diffModel) opRead() {
	offset, last, _ := m.state()
	switch m.rng.IntN(4) {
	case 0:
		lo := uint64(m.rng.IntN(int(last) + 3))
		hi := lo + uint64(m.rng.IntN(int(last-min(lo, last))+3))
		var maxSize uint64
		switch m.rng.IntN(3) {
		case 0:
			maxSize = math.MaxUint64
		case 1:
			maxSize = uint64(m.rng.IntN(400))
		}
		m.checkEntries(lo, hi, maxSize, offset, last)
	case 1:
		i := uint64(m.rng.IntN(int(last) + 3))
		m.checkTerm(i)
	case 2:
		m.checkSnapshot()
	default:
		m.checkIndexes()
		m.checkInitialState()
	}
}

func (m *diffModel) checkEntries(lo, hi, maxSize, offset, last uint64) {
	m.t.Helper()
	got, err := m.bolt.Entries(lo, hi, maxSize)
	if lo > offset && (hi > last+1 || lo > hi) {
		// raft.MemoryStorage panics here; the contract is an error.
		if !errors.Is(err, raft.ErrUnavailable) {
			m.fatalf("Entries(%d, %d) out of range (last %d): got %v", lo, hi, last, err)
		}
		return
	}
	want, werr := m.mem.Entries(lo, hi, maxSize)
	if !sameErr(err, werr) {
		m.fatalf("Entries(%d, %d, %d): bolt error %v, memory error %v", lo, hi, maxSize, err, werr)
	}
	if len(got) != len(want) {
		m.fatalf("Entries(%d, %d, %d): bolt %d entries, memory %d", lo, hi, maxSize, len(got), len(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			m.fatalf("Entries(%d, %d, %d)[%d]: bolt %v, memory %v", lo, hi, maxSize, i, got[i], want[i])
		}
	}
}

func (m *diffModel) checkTerm(i uint64) {
	m.t.Helper()
	got, err := m.bolt.Term(i)
	want, werr := m.mem.Term(i)
	if got != want || !sameErr(err, werr) {
		m.fatalf("Term(%d): bolt %d, %v; memory %d, %v", i, got, err, want, werr)
	}
}

func (m *diffModel) checkSnapshot() {
	m.t.Helper()
	got, err := m.bolt.Snapshot()
	want, _ := m.mem.Snapshot()
	if err != nil || !equalSnapshots(got, want) {
		m.fatalf("Snapshot: bolt %v, %v; memory %v", got, err, want)
	}
}

func (m *diffModel) checkIndexes() {
	m.t.Helper()
	f, err1 := m.bolt.FirstIndex()
	l, err2 := m.bolt.LastIndex()
	wf, _ := m.mem.FirstIndex()
	wl, _ := m.mem.LastIndex()
	if f != wf || l != wl || err1 != nil || err2 != nil {
		m.fatalf("First/LastIndex: bolt %d, %d (%v, %v); memory %d, %d", f, l, err1, err2, wf, wl)
	}
}

func (m *diffModel) checkInitialState() {
	m.t.Helper()
	hs, cs, err := m.bolt.InitialState()
	whs, wcs, _ := m.mem.InitialState()
	if err != nil || !proto.Equal(hs, whs) || !proto.Equal(raftpb.EnsureConfState(cs), raftpb.EnsureConfState(proto.Clone(wcs).(*raftpb.ConfState))) {
		m.fatalf("InitialState: bolt %v %v (%v); memory %v %v", hs, cs, err, whs, wcs)
	}
}

// checkAll compares everything: indexes, every term, the whole log, the
// snapshot and the initial state.
func (m *diffModel) checkAll() {
	m.t.Helper()
	m.checkIndexes()
	m.checkInitialState()
	m.checkSnapshot()
	offset, last, _ := m.state()
	for i := uint64(0); i <= last+1; i++ {
		m.checkTerm(i)
	}
	m.checkEntries(offset+1, last+1, math.MaxUint64, offset, last)
}

func (m *diffModel) restart() {
	m.logf("restart")
	if err := m.bolt.Close(); err != nil {
		m.fatalf("Close: %v", err)
	}
	s, err := openWith(m.dir, "test", "n1", nil, diffStorageOptions)
	if err != nil {
		m.fatalf("reopen: %v", err)
	}
	s.noSyncForTest()
	m.bolt = s
}

// sameErr reports whether both errors are nil or both wrap the same raft
// storage error.
func sameErr(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	for _, e := range []error{raft.ErrCompacted, raft.ErrUnavailable, raft.ErrSnapOutOfDate, raft.ErrSnapshotTemporarilyUnavailable} {
		if errors.Is(b, e) {
			return errors.Is(a, e)
		}
	}
	return false
}

// equalSnapshots compares snapshots after raftpb.EnsureSnapshot: raft treats
// an absent field and its zero value alike.
func equalSnapshots(a, b *raftpb.Snapshot) bool {
	a = raftpb.EnsureSnapshot(proto.Clone(a).(*raftpb.Snapshot))
	b = raftpb.EnsureSnapshot(proto.Clone(b).(*raftpb.Snapshot))
	return proto.Equal(a, b)
}

// diffStorageOptions are the differential test's: no fsync, segments of
// 4 KiB.
var diffStorageOptions = storageOptions{noSync: true, segmentSize: 4 << 10}

// TestStorageDifferential runs seeded random operation sequences against
// DiskStorage and raft.MemoryStorage and requires the same answers and
// errors, including across restarts of the DiskStorage.
func TestStorageDifferential(t *testing.T) {
	seeds, ops := 80, 150
	if testing.Short() {
		seeds = 20
	}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			dir := t.TempDir()
			// The differential test checks the logic; fsync is the
			// benchmark's and the crash tests' business. Small segments
			// make the log cut and checkpoint often.
			s, err := openWith(dir, "test", "n1", nil, diffStorageOptions)
			if err != nil {
				t.Fatal(err)
			}
			m := &diffModel{t: t, rng: rand.New(rand.NewPCG(uint64(seed), 7)), dir: dir, mem: raft.NewMemoryStorage(), bolt: s}
			defer func() { _ = m.bolt.Close() }()
			m.checkAll()
			for range ops {
				switch r := m.rng.IntN(100); {
				case r < 40:
					m.opSave()
				case r < 45:
					m.opSaveRefused()
				case r < 55:
					m.opCreateSnapshot()
				case r < 63:
					m.opCompact()
				case r < 66:
					m.restart()
					m.checkAll()
				default:
					m.opRead()
				}
			}
			m.checkAll()
			m.restart()
			m.checkAll()
		})
	}
}

// TestStorageSaveSnapshotKeepsMatchingSuffix checks the contract's case that
// raft.MemoryStorage does not have: a snapshot inside the log whose term
// matches discards only the entries up to it.
func TestStorageSaveSnapshotKeepsMatchingSuffix(t *testing.T) {
	s := openTestStorage(t, t.TempDir())
	defer s.Close()
	var ents []*raftpb.Entry
	for i := uint64(1); i <= 10; i++ {
		ents = append(ents, &raftpb.Entry{Index: new(i), Term: new(uint64(2)), Data: testCommand([]byte{byte(i)})})
	}
	if err := s.Save(&raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(4))}, ents, nil); err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(6)), Term: new(uint64(2))}, Data: []byte("state")}
	if err := s.Save(nil, nil, snap); err != nil {
		t.Fatal(err)
	}
	if f, _ := s.FirstIndex(); f != 7 {
		t.Fatalf("FirstIndex = %d, want 7", f)
	}
	if l, _ := s.LastIndex(); l != 10 {
		t.Fatalf("LastIndex = %d, want 10", l)
	}
	got, err := s.Entries(7, 11, math.MaxUint64)
	if err != nil || len(got) != 4 || !proto.Equal(got[0], ents[6]) {
		t.Fatalf("Entries(7, 11) = %v, %v", got, err)
	}
	// A snapshot whose term differs from the log's replaces the log.
	snap2 := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(8)), Term: new(uint64(3))}}
	if err := s.Save(nil, nil, snap2); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.LastIndex(); l != 8 {
		t.Fatalf("LastIndex after conflicting snapshot = %d, want 8", l)
	}
	if term, _ := s.Term(8); term != 3 {
		t.Fatalf("Term(8) = %d, want 3", term)
	}
}

// TestStorageIsEmptyAndIdentity checks the bootstrap signal and the recorded
// raft id across a restart.
func TestStorageIsEmptyAndIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "does", "not", "exist")
	s := openTestStorage(t, dir)
	if !s.IsEmpty() {
		t.Fatal("new storage is not empty")
	}
	if s.RaftID() != RaftID("n1") || s.RaftID() == 0 {
		t.Fatalf("RaftID = %d, want %d", s.RaftID(), RaftID("n1"))
	}
	hs, cs, err := s.InitialState()
	if err != nil || hs != nil || cs == nil {
		t.Fatalf("InitialState of a new storage = %v, %v, %v", hs, cs, err)
	}
	if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1))}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if s.IsEmpty() {
		t.Fatal("storage with a HardState is empty")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTestStorage(t, dir)
	defer s.Close()
	if s.IsEmpty() {
		t.Fatal("reopened storage is empty")
	}
	if hs, _, _ := s.InitialState(); hs.GetTerm() != 1 || hs.GetVote() != 1 {
		t.Fatalf("HardState after restart = %v", hs)
	}
}

// TestStorageConcurrentReads reads while another goroutine saves; run it
// with -race.
func TestStorageConcurrentReads(t *testing.T) {
	s := openTestStorage(t, t.TempDir())
	defer s.Close()
	s.noSyncForTest()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				first, _ := s.FirstIndex()
				last, _ := s.LastIndex()
				if last >= first {
					if _, err := s.Entries(first, last+1, math.MaxUint64); err != nil && !errors.Is(err, raft.ErrCompacted) {
						t.Errorf("Entries: %v", err)
						return
					}
				}
				_, _ = s.Term(last)
				_, _, _ = s.InitialState()
			}
		})
	}
	for i := uint64(1); i <= 200; i++ {
		e := &raftpb.Entry{Index: new(i), Term: new(uint64(1)), Data: testCommand([]byte("x"))}
		if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(i)}, []*raftpb.Entry{e}, nil); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 {
			if _, err := s.CreateSnapshot(i, &raftpb.ConfState{Voters: []uint64{1}}, nil); err != nil {
				t.Fatal(err)
			}
			if err := s.Compact(i - 10); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
}

// BenchmarkStorageSave measures one durable Save of a Ready with a
// HardState and 1 or 16 entries of 256 bytes, side by side with its floor:
// the same number of bytes written into an allocated file and fdatasynced
// ("raw"). The gap is what the storage adds to the disk's flush.
func BenchmarkStorageSave(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			s := openTestStorage(b, b.TempDir())
			defer s.Close()
			payload := make([]byte, 256)
			next := uint64(1)
			b.SetBytes(int64(n * len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				ents := make([]*raftpb.Entry, n)
				for i := range ents {
					ents[i] = &raftpb.Entry{Index: new(next), Term: new(uint64(1)), Data: payload}
					next++
				}
				hs := &raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(next - 1)}
				if err := s.Save(hs, ents, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("raw=%d", n), func(b *testing.B) {
			f, err := osFS{}.Create(filepath.Join(b.TempDir(), "raw"), 64<<20)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			// A frame of n entries and a HardState is about this long.
			buf := make([]byte, frameHeaderSize+n*(len(payloadOf256)+16)+16)
			b.SetBytes(int64(n * 256))
			var off int64
			for b.Loop() {
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				if err := f.Datasync(); err != nil {
					b.Fatal(err)
				}
				off += alignFrame(int64(len(buf)))
			}
		})
	}
}

var payloadOf256 = make([]byte, 256)

// TestStorageFailedWriteIsSticky checks that after a write transaction
// failed every method refuses with ErrStorageFailed.
func TestStorageFailedWriteIsSticky(t *testing.T) {
	s := openTestStorage(t, t.TempDir())
	e := &raftpb.Entry{Index: new(uint64(1)), Term: new(uint64(1))}
	if err := s.Save(nil, []*raftpb.Entry{e}, nil); err != nil {
		t.Fatal(err)
	}
	// Pull the segment file out from under the storage: the next write
	// fails.
	if err := s.log.tail.Close(); err != nil {
		t.Fatal(err)
	}
	e2 := &raftpb.Entry{Index: new(uint64(2)), Term: new(uint64(1))}
	if err := s.Save(nil, []*raftpb.Entry{e2}, nil); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("Save on a failed file: %v, want ErrStorageFailed", err)
	}
	if _, err := s.LastIndex(); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("LastIndex after a failed write: %v", err)
	}
	if _, err := s.Entries(1, 2, math.MaxUint64); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("Entries after a failed write: %v", err)
	}
	if err := s.Compact(1); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("Compact after a failed write: %v", err)
	}
}

func TestStorageClosed(t *testing.T) {
	s := openTestStorage(t, t.TempDir())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.LastIndex(); !errors.Is(err, ErrStorageClosed) {
		t.Fatalf("LastIndex after Close: %v", err)
	}
	if err := s.Save(&raftpb.HardState{Term: new(uint64(1))}, nil, nil); !errors.Is(err, ErrStorageClosed) {
		t.Fatalf("Save after Close: %v", err)
	}
}

// noSyncForTest turns fsync off: the tests that check logic, not
// durability, run faster without it.
func (s *DiskStorage) noSyncForTest() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.db.NoSync = true
	s.opts.noSync = true
	s.log.noSync = true
}
