package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"walden/internal/testutil"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// TestOpenStorageSurvivesRandomDamage flips random bytes of a valid raft.db
// (seeded) and opens it: the storage either opens, or refuses as damaged or
// foreign without changing the directory. It must never crash the process.
func TestOpenStorageSurvivesRandomDamage(t *testing.T) {
	orig := populatedDir(t)
	clean, err := os.ReadFile(filepath.Join(orig, storageFileName))
	if err != nil {
		t.Fatal(err)
	}
	// The pages in use (not free, below the high-water mark): damage there
	// is what bbolt and the checks can meet.
	db, err := bolt.Open(filepath.Join(orig, storageFileName), 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	var used []int
	_ = db.View(func(tx *bolt.Tx) error {
		for id := 2; ; id++ {
			p, err := tx.Page(id)
			if err != nil || p == nil {
				return nil
			}
			if p.Type != "free" {
				used = append(used, id)
			}
		}
	})
	pageSize := db.Info().PageSize
	_ = db.Close()
	rounds := 200
	if testing.Short() {
		rounds = 30
	}
	refused := 0
	for round := range rounds {
		rng := rand.New(rand.NewPCG(uint64(round), 3))
		b := append([]byte(nil), clean...)
		// Damage a few bytes of pages in use, mostly their headers and
		// element tables, rarely one meta page (both meta pages damaged is
		// the "not a bbolt file" case).
		for range 1 + rng.IntN(4) {
			page := used[rng.IntN(len(used))]
			within := rng.IntN(64)
			if rng.IntN(3) == 0 {
				within = rng.IntN(pageSize)
			}
			if rng.IntN(10) == 0 {
				page = rng.IntN(2)
			}
			b[page*pageSize+within] ^= byte(1 + rng.IntN(255))
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, storageFileName), b, 0o600); err != nil {
			t.Fatal(err)
		}
		before := fingerprint(t, dir)
		s, err := Open(dir, "test", "n1", nil)
		if err == nil {
			// Damage that bbolt cannot see (a freed page, a byte inside a
			// value that still decodes) opens; reading must not crash.
			_, _ = s.Entries(16, 41, 1<<20)
			_, _ = s.Snapshot()
			_ = s.Close()
			continue
		}
		if !errors.Is(err, ErrDamagedDataDir) && !errors.Is(err, ErrForeignDataDir) {
			t.Fatalf("round %d: unexpected refusal %v", round, err)
		}
		refused++
		assertUnchanged(t, before, fingerprint(t, dir))
	}
	if refused == 0 {
		t.Fatal("no damaged file was refused")
	}
	t.Logf("%d of %d damaged files refused", refused, rounds)
}

// FuzzVerifyBoltFile feeds arbitrary bytes, seeded with a valid raft.db, to
// the structural check: it must answer, never panic, loop or exhaust memory.
func FuzzVerifyBoltFile(f *testing.F) {
	dir := f.TempDir()
	s, err := Open(dir, "test", "n1", nil)
	if err != nil {
		f.Fatal(err)
	}
	var ents []*raftpb.Entry
	for i := uint64(1); i <= 30; i++ {
		ents = append(ents, &raftpb.Entry{Index: new(i), Term: new(uint64(1)), Data: testCommand(make([]byte, 100))})
	}
	if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(30))}, ents, nil); err != nil {
		f.Fatal(err)
	}
	if err := s.Close(); err != nil {
		f.Fatal(err)
	}
	clean, err := os.ReadFile(filepath.Join(dir, storageFileName))
	if err != nil {
		f.Fatal(err)
	}
	// Only the pages below the high-water mark matter; a smaller seed
	// fuzzes faster.
	meta, err := readBoltMeta(bytes.NewReader(clean), int64(len(clean)))
	if err != nil {
		f.Fatal(err)
	}
	clean = clean[:meta.hwm*uint64(meta.pageSize)]
	if err := verifyBoltFile(bytes.NewReader(clean), int64(len(clean))); err != nil {
		f.Fatalf("clean file refused: %v", err)
	}
	f.Add(clean)
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = verifyBoltFile(bytes.NewReader(b), int64(len(b)))
	})
}

// memLogFS is a read-only storageFS over segment files held in memory (the
// fuzz target's).
type memLogFS struct {
	osFS
	dir   string
	files map[string][]byte
}

func (m memLogFS) ReadDir(dir string) ([]string, error) {
	var names []string
	for n := range m.files {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

func (m memLogFS) Open(name string) (storageFile, error) {
	b, ok := m.files[filepath.Base(name)]
	if !ok {
		return nil, os.ErrNotExist
	}
	return memFile{bytes.NewReader(b)}, nil
}

type memFile struct{ *bytes.Reader }

func (memFile) WriteAt([]byte, int64) (int, error) { return 0, errors.New("read-only") }
func (memFile) Datasync() error                    { return nil }
func (memFile) Sync() error                        { return nil }
func (f memFile) Size() (int64, error)             { return f.Reader.Size(), nil }
func (memFile) Close() error                       { return nil }

// FuzzReadLog feeds arbitrary bytes as the only segment of a raft log to the
// reader and the replay, seeded with real segments: they must answer (a log
// or a refusal), never panic, loop or exhaust memory.
func FuzzReadLog(f *testing.F) {
	for _, dir := range []string{populatedDirF(f), v1DirUpgradedF(f)} {
		for _, p := range segmentPaths(f, dir) {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			// The zeros after the frames add nothing but time.
			end := len(b)
			for end > 0 && b[end-1] == 0 {
				end--
			}
			f.Add(b[:min(len(b), int(alignFrame(int64(end)))+64)])
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fsys := memLogFS{files: map[string][]byte{segmentName(1): b}}
		r, err := readLog(fsys, "raftlog", RaftID("n1"), 1)
		if err == nil {
			if cerr := r.img.check(); cerr != nil {
				t.Fatalf("readLog accepted a log that fails its own check: %v", cerr)
			}
		} else if !errors.Is(err, ErrDamagedDataDir) {
			t.Fatalf("readLog: %v, want a refusal as damaged", err)
		}
	})
}

// populatedDirF is populatedDir for a fuzz target's seed corpus.
func populatedDirF(f *testing.F) string {
	dir := f.TempDir()
	s, err := openWith(dir, "test", "n1", nil, storageOptions{segmentSize: 64 << 10, noSync: true})
	if err != nil {
		f.Fatal(err)
	}
	if err := s.Save(crashHS(1, 1, 5), crashEntries(1, 10, 1, 50), nil); err != nil {
		f.Fatal(err)
	}
	if _, err := s.CreateSnapshot(5, &raftpb.ConfState{Voters: []uint64{1}}, []byte("state")); err != nil {
		f.Fatal(err)
	}
	if err := s.Compact(3); err != nil {
		f.Fatal(err)
	}
	if err := s.Save(crashHS(2, 1, 8), crashEntries(9, 12, 2, 50), nil); err != nil {
		f.Fatal(err)
	}
	if err := s.Close(); err != nil {
		f.Fatal(err)
	}
	return dir
}

// v1DirUpgradedF is the format-1 fixture, upgraded (its segment starts with
// a checkpoint of 25 entries).
func v1DirUpgradedF(f *testing.F) string {
	dir := f.TempDir()
	testutil.CopyTree(f, filepath.Join("testdata", "v1", "populated"), dir)
	s, err := openWith(dir, "test", "n1", nil, storageOptions{segmentSize: 64 << 10, noSync: true})
	if err != nil {
		f.Fatal(err)
	}
	if err := s.Close(); err != nil {
		f.Fatal(err)
	}
	return dir
}

// FuzzReplayFrames checks the replay's rules rather than the checksums: the
// input is cut into frame payloads (at each "|||"), each framed with valid
// checksums after a valid segment header and empty checkpoint. The replay
// must refuse what breaks the log's rules and accept only logs that pass
// its own check, without panicking. Seeded with the payloads of real frames.
func FuzzReplayFrames(f *testing.F) {
	sep := []byte("|||")
	dir := populatedDirF(f)
	frames := readFrames(f, segmentPaths(f, dir)[0])
	var seed [][]byte
	for _, fr := range frames[1:] {
		var fb frameBuf
		fb.reset()
		for _, r := range fr.recs {
			fb.b = append(fb.b, r.typ)
			fb.b = binary.AppendUvarint(fb.b, uint64(len(r.data)))
			fb.b = append(fb.b, r.data...)
		}
		seed = append(seed, fb.b[frameHeaderSize:])
	}
	f.Add(bytes.Join(seed, sep))
	f.Fuzz(func(t *testing.T, b []byte) {
		raftID := RaftID("n1")
		var seg []byte
		var fb frameBuf
		fb.reset()
		fb.addUint64s(recSegment, segmentFormat, 1, raftID)
		fb.addUint64s(recCheckpoint, 0, 0, 0, 0)
		seg = append(seg, fb.seal(1)...)
		for k, payload := range bytes.Split(b, sep) {
			fb.reset()
			fb.b = append(fb.b, payload...)
			seg = append(seg, fb.seal(uint64(k+2))...)
		}
		seg = append(seg, make([]byte, 64)...)
		r, err := readLog(memLogFS{files: map[string][]byte{segmentName(1): seg}}, "raftlog", raftID, 1)
		if err == nil {
			if cerr := r.img.check(); cerr != nil {
				t.Fatalf("readLog accepted a log that fails its own check: %v", cerr)
			}
		} else if !errors.Is(err, ErrDamagedDataDir) {
			t.Fatalf("readLog: %v, want a refusal as damaged", err)
		}
	})
}
