package raftlog

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestStorageUpgradesFormat1 opens the format-1 fixture (written by the
// bbolt-only storage) and checks that the upgraded storage holds exactly
// what it held, that the directory is format 2 on disk, and that it keeps
// working across restarts.
func TestStorageUpgradesFormat1(t *testing.T) {
	dir := v1Dir(t)
	s := openTestStorage(t, dir)
	check := func(s *DiskStorage) {
		t.Helper()
		if f, _ := s.FirstIndex(); f != 16 {
			t.Errorf("FirstIndex = %d, want 16", f)
		}
		if l, _ := s.LastIndex(); l != 40 {
			t.Errorf("LastIndex = %d, want 40", l)
		}
		if term, err := s.Term(15); term != 1 || err != nil {
			t.Errorf("Term(15) = %d, %v, want 1 (the compaction point)", term, err)
		}
		ents, err := s.Entries(16, 41, math.MaxUint64)
		if err != nil || len(ents) != 25 {
			t.Fatalf("Entries(16, 41) = %d entries, %v", len(ents), err)
		}
		for k, e := range ents {
			i := uint64(16 + k)
			if e.GetIndex() != i || e.GetTerm() != 1+i/30 || !bytes.Equal(e.GetData(), testCommand(bytes.Repeat([]byte{byte(i)}, 100))) {
				t.Fatalf("entry %d = index %d term %d data %x...", i, e.GetIndex(), e.GetTerm(), e.GetData()[:4])
			}
		}
		hs, cs, err := s.InitialState()
		if err != nil || hs.GetTerm() != 2 || hs.GetVote() != 1 || hs.GetCommit() != 30 {
			t.Errorf("HardState = %v, %v, want term 2 vote 1 commit 30", hs, err)
		}
		if !proto.Equal(cs, raftpb.EnsureConfState(&raftpb.ConfState{Voters: []uint64{1}})) {
			t.Errorf("ConfState = %v, want voters [1]", cs)
		}
		snap, err := s.Snapshot()
		if err != nil || snap.GetMetadata().GetIndex() != 20 || snap.GetMetadata().GetTerm() != 1 || string(snap.GetData()) != "state" {
			t.Errorf("Snapshot = %v, %v", snap, err)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// On disk: format 2, the format-1 buckets gone, the log in segment 1.
	db, err := bolt.Open(filepath.Join(dir, storageFileName), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.View(func(tx *bolt.Tx) error {
		if _, version, err := readIdentity(tx.Bucket(bucketMeta)); err != nil || version != storageFormatVersion {
			t.Errorf("format version %d, %v after the upgrade", version, err)
		}
		if tx.Bucket(bucketEntriesV1) != nil || tx.Bucket(bucketStateV1) != nil {
			t.Error("format-1 buckets left after the upgrade")
		}
		return nil
	})
	_ = db.Close()
	if _, err := os.Stat(filepath.Join(dir, logDirName, segmentName(1))); err != nil {
		t.Fatalf("no first segment after the upgrade: %v", err)
	}

	s = openTestStorage(t, dir)
	check(s)
	// It keeps working: new entries, a snapshot and a compaction.
	if err := s.Save(&raftpb.HardState{Term: new(uint64(2)), Vote: new(uint64(1)), Commit: new(uint64(41))},
		[]*raftpb.Entry{{Index: new(uint64(41)), Term: new(uint64(2)), Data: testCommand([]byte("after"))}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot(41, nil, []byte("state at 41")); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(35); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTestStorage(t, dir)
	defer s.Close()
	if f, _ := s.FirstIndex(); f != 36 {
		t.Errorf("FirstIndex after compaction = %d, want 36", f)
	}
	if ents, _ := s.Entries(41, 42, math.MaxUint64); len(ents) != 1 || !bytes.Equal(ents[0].GetData(), testCommand([]byte("after"))) {
		t.Errorf("entry 41 = %v", ents)
	}
	if snap, _ := s.Snapshot(); snap.GetMetadata().GetIndex() != 41 || !proto.Equal(snap.GetMetadata().GetConfState(), raftpb.EnsureConfState(&raftpb.ConfState{Voters: []uint64{1}})) {
		t.Errorf("snapshot after the upgrade = %v", snap.GetMetadata())
	}
}
