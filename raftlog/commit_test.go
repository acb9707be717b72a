package raftlog

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"walden/internal/testutil"
)

// copyStorageFile copies the data directory dir to a new directory: what a
// crash of the process at this moment would leave on disk (the storage
// writes nothing between its calls).
func copyStorageFile(t *testing.T, dir string) string {
	t.Helper()
	dst := t.TempDir()
	testutil.CopyTree(t, dir, dst)
	return dst
}

func commitOnDisk(t *testing.T, dir string) uint64 {
	t.Helper()
	s := openTestStorage(t, dir)
	defer s.Close()
	hs, _, err := s.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	return hs.GetCommit()
}

// TestStorageCommitOnlyHardStateIsWrittenLater checks the MustSync exception
// of the contract: a HardState that moves only the commit index is visible
// at once but reaches disk with the next transaction (or Close), and a
// snapshot never lands on disk with a commit index below its own.
func TestStorageCommitOnlyHardStateIsWrittenLater(t *testing.T) {
	dir := t.TempDir()
	s := openTestStorage(t, dir)
	defer s.Close()
	var ents []*raftpb.Entry
	for i := uint64(1); i <= 5; i++ {
		ents = append(ents, &raftpb.Entry{Index: new(i), Term: new(uint64(1))})
	}
	hs := func(commit uint64) *raftpb.HardState {
		return &raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(7)), Commit: new(commit)}
	}
	if err := s.Save(hs(1), ents, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(hs(3), nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.InitialState(); got.GetCommit() != 3 {
		t.Fatalf("InitialState commit %d after commit-only Save, want 3", got.GetCommit())
	}
	if got := commitOnDisk(t, copyStorageFile(t, dir)); got != 1 {
		t.Fatalf("commit on disk %d after commit-only Save, want 1 (not written yet)", got)
	}

	// A snapshot at the commit index writes the commit index with it.
	if _, err := s.CreateSnapshot(3, nil, []byte("state")); err != nil {
		t.Fatal(err)
	}
	if got := commitOnDisk(t, copyStorageFile(t, dir)); got != 3 {
		t.Fatalf("commit on disk %d after CreateSnapshot(3), want 3", got)
	}

	// A term change is never deferred.
	if err := s.Save(&raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(3))}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := copyStorageFile(t, dir); func() uint64 {
		st := openTestStorage(t, got)
		defer st.Close()
		h, _, _ := st.InitialState()
		return h.GetTerm()
	}() != 2 {
		t.Fatal("term change not on disk when Save returned")
	}

	// Close writes a deferred commit index.
	if err := s.Save(&raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(5))}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := commitOnDisk(t, dir); got != 5 {
		t.Fatalf("commit on disk %d after Close, want 5", got)
	}
}
