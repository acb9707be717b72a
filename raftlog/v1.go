package raftlog

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// Storage format 1 kept the whole raft log in raft.db: a bucket "entries"
// (key: index, value: raftpb.Entry; the first key is the compaction point,
// holding only its index and term) and a bucket "state" (hard_state,
// snapshot, conf_state). Open checks such a file as before and
// upgrades it to format 2 (see upgradeFormat1).
const storageFormat1 uint32 = 1

var (
	bucketEntriesV1 = []byte("entries")
	bucketStateV1   = []byte("state")
)

const (
	keyHardStateV1 = "hard_state"
	keyConfStateV1 = "conf_state"
	keySnapshotV1  = "snapshot"
)

// checkLogV1 verifies the entries and state buckets of a format-1 file:
// contiguous entries whose stored index matches their key, whose terms
// never decrease and whose commands or membership changes decode (the apply
// path would stop on them), a decodable HardState, snapshot and ConfState, FirstIndex-1
// <= snapshot index <= LastIndex with matching terms, and a commit index
// between the snapshot index (so also the compaction point) and LastIndex.
func checkLogV1(tx *bolt.Tx, damaged func(string, ...any) error) error {
	eb, sb := tx.Bucket(bucketEntriesV1), tx.Bucket(bucketStateV1)
	if eb == nil {
		return damaged("no %q bucket", bucketEntriesV1)
	}
	if sb == nil {
		return damaged("no %q bucket", bucketStateV1)
	}
	snap := &raftpb.Snapshot{}
	if err := decodeOptional(sb, keySnapshotV1, snap); err != nil {
		return damaged("%v", err)
	}
	cs := &raftpb.ConfState{}
	if err := decodeOptional(sb, keyConfStateV1, cs); err != nil {
		return damaged("%v", err)
	}
	hs := &raftpb.HardState{}
	if err := decodeOptional(sb, keyHardStateV1, hs); err != nil {
		return damaged("%v", err)
	}
	si, st := snap.GetMetadata().GetIndex(), snap.GetMetadata().GetTerm()

	var (
		first, prev, prevTerm, termAtSnap uint64
		n                                 int
	)
	c := eb.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return damaged("entries key %x is not 8 bytes", k)
		}
		idx := binary.BigEndian.Uint64(k)
		if n > 0 && idx != prev+1 {
			return damaged("entries jump from index %d to %d", prev, idx)
		}
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(v, e); err != nil {
			return damaged("entry %d does not decode: %v", idx, err)
		}
		if e.GetIndex() != idx {
			return damaged("entry under key %d says index %d", idx, e.GetIndex())
		}
		if n > 0 {
			// The compaction point keeps only its index and term.
			if what, err := decodeEntryData(e); err != nil {
				return damaged("the %s of entry %d (term %d) does not decode: %v", what, idx, e.GetTerm(), err)
			}
		}
		if n > 0 && e.GetTerm() < prevTerm {
			return damaged("entry %d has term %d after term %d", idx, e.GetTerm(), prevTerm)
		}
		if n == 0 {
			first = idx
		}
		if idx == si {
			termAtSnap = e.GetTerm()
		}
		prev, prevTerm = idx, e.GetTerm()
		n++
	}
	if n == 0 {
		return damaged("entries bucket is empty (no compaction point)")
	}
	last := prev
	if si < first || si > last {
		return damaged("snapshot index %d outside the log [%d, %d] (first index %d, last index %d)", si, first, last, first+1, last)
	}
	if termAtSnap != st {
		return damaged("snapshot %d has term %d but the log has term %d there", si, st, termAtSnap)
	}
	if snapCS := snap.GetMetadata().GetConfState(); !proto.Equal(raftpb.EnsureConfState(cs), raftpb.EnsureConfState(proto.Clone(snapCS).(*raftpb.ConfState))) {
		return damaged("conf_state %v differs from the snapshot's %v", cs, snapCS)
	}
	if hs.GetCommit() > last {
		return damaged("hard state commit %d beyond last index %d", hs.GetCommit(), last)
	}
	if hs.GetCommit() < first {
		return damaged("hard state commit %d below the compaction point %d", hs.GetCommit(), first)
	}
	if hs.GetCommit() < si {
		return damaged("hard state commit %d below the snapshot index %d", hs.GetCommit(), si)
	}
	return nil
}

// readV1 reads a checked format-1 file into a log image and its snapshot
// (nil when it has none).
func readV1(tx *bolt.Tx) (logImage, *raftpb.Snapshot, error) {
	var img logImage
	eb, sb := tx.Bucket(bucketEntriesV1), tx.Bucket(bucketStateV1)
	// The first key is the compaction point (index and term only).
	seenFirst := false
	c := eb.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(v, e); err != nil {
			return img, nil, fmt.Errorf("entry %d does not decode: %v", binary.BigEndian.Uint64(k), err)
		}
		if !seenFirst {
			seenFirst = true
			img.offset, img.offsetTerm = e.GetIndex(), e.GetTerm()
			continue
		}
		img.ents = append(img.ents, e)
	}
	if v := sb.Get([]byte(keyHardStateV1)); v != nil {
		hs := &raftpb.HardState{}
		if err := proto.Unmarshal(v, hs); err != nil {
			return img, nil, fmt.Errorf("hard_state does not decode: %v", err)
		}
		img.hs = hs
	}
	var snap *raftpb.Snapshot
	if v := sb.Get([]byte(keySnapshotV1)); v != nil {
		snap = &raftpb.Snapshot{}
		if err := proto.Unmarshal(v, snap); err != nil {
			return img, nil, fmt.Errorf("snapshot does not decode: %v", err)
		}
		img.snapIndex, img.snapTerm = snap.GetMetadata().GetIndex(), snap.GetMetadata().GetTerm()
		if img.snapIndex == 0 {
			snap = nil
		}
	}
	return img, snap, nil
}

// decodeEntryData decodes what the apply path decodes from e: the command of
// a normal entry, the membership change and its member description of a
// conf change entry. It returns what failed to decode.
func decodeEntryData(e *raftpb.Entry) (what string, err error) {
	var cctx []byte
	switch e.GetType() {
	case raftpb.EntryNormal:
		if len(e.GetData()) == 0 {
			return "", nil
		}
		return "command", proto.Unmarshal(e.GetData(), new(waldenv1.Command))
	case raftpb.EntryConfChange:
		cc := new(raftpb.ConfChange)
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			return "membership change", err
		}
		cctx = cc.GetContext()
	case raftpb.EntryConfChangeV2:
		cc := new(raftpb.ConfChangeV2)
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			return "membership change", err
		}
		cctx = cc.GetContext()
	default:
		return "entry type", fmt.Errorf("unknown entry type %d", e.GetType())
	}
	if len(cctx) == 0 {
		return "", nil
	}
	return "membership change's member description", proto.Unmarshal(cctx, new(waldenv1.ConfChangeContext))
}

// decodeOptional decodes key into m when present.
func decodeOptional(b *bolt.Bucket, key string, m proto.Message) error {
	v := b.Get([]byte(key))
	if v == nil {
		return nil
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return fmt.Errorf("%s does not decode: %v", key, err)
	}
	return nil
}
