package raftnode

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

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
		s, err := OpenStorage(dir, "test", "n1", nil)
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
	s, err := OpenStorage(dir, "test", "n1", nil)
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
