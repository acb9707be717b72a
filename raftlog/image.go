package raftlog

import (
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// logImage is the raft log as a member holds it in memory: what replaying
// the segment files yields at start, and what every write changes once it is
// on disk. Its operations are the only ways the log changes, shared by the
// writes and the replay, so both follow one set of rules.
//
// Invariants between writes: offset <= snapIndex <= last(), the entries are
// contiguous from offset+1, and the term at snapIndex is snapTerm.
type logImage struct {
	// offset is the compaction point (FirstIndex-1); offsetTerm its term.
	offset, offsetTerm uint64
	// ents holds the entries offset+1 .. last(). Its elements are never
	// changed once stored, and a stored prefix is never written over in
	// place (a truncation copies), so readers may keep sub-slices of it.
	ents []*raftpb.Entry
	// hs is nil until a HardState was saved.
	hs *raftpb.HardState
	// snapIndex and snapTerm name the snapshot in raft.db that, with the
	// entries, rebuilds the state (0, 0: none).
	snapIndex, snapTerm uint64
}

func (l *logImage) last() uint64 { return l.offset + uint64(len(l.ents)) }

// term is raft.Storage's Term on the image.
func (l *logImage) term(i uint64) (uint64, error) {
	switch {
	case i < l.offset:
		return 0, raft.ErrCompacted
	case i > l.last():
		return 0, raft.ErrUnavailable
	case i == l.offset:
		return l.offsetTerm, nil
	}
	return l.ents[i-l.offset-1].GetTerm(), nil
}

// slice returns the entries [lo, hi), lo > offset and hi <= last()+1, with
// the capacity cut to the length, so that an append by the caller never
// writes into the image.
func (l *logImage) slice(lo, hi uint64) []*raftpb.Entry {
	a, b := lo-l.offset-1, hi-l.offset-1
	return l.ents[a:b:b]
}

// savePlan is a Save checked against the image: what to write and how the
// image changes once it is written.
type savePlan struct {
	snap      *raftpb.Snapshot // nil: none
	keepAfter bool             // the snapshot keeps the entries after its index
	ents      []*raftpb.Entry  // entries to write (nil: none)
	hs        *raftpb.HardState
}

// planSave checks a Save of one Ready against the image, as the Storage
// contract states it, and returns what to write. It changes nothing.
func (l *logImage) planSave(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) (savePlan, error) {
	var p savePlan
	offset, last, snapIndex := l.offset, l.last(), l.snapIndex
	if !raft.IsEmptySnap(snap) {
		idx, term := snap.GetMetadata().GetIndex(), snap.GetMetadata().GetTerm()
		if l.snapIndex != 0 && l.snapIndex >= idx {
			return p, fmt.Errorf("raftlog: save snapshot %d over snapshot %d: %w", idx, l.snapIndex, raft.ErrSnapOutOfDate)
		}
		if idx > offset && idx <= last {
			t, _ := l.term(idx)
			p.keepAfter = t == term
		}
		p.snap = snap
		if !p.keepAfter {
			last = idx
		}
		offset, snapIndex = idx, idx
	}
	if len(ents) > 0 {
		for i := 1; i < len(ents); i++ {
			if ents[i].GetIndex() != ents[i-1].GetIndex()+1 {
				return p, fmt.Errorf("raftlog: save entries: index %d follows %d: %w", ents[i].GetIndex(), ents[i-1].GetIndex(), ErrInvalidSave)
			}
		}
		first := ents[0].GetIndex()
		if lastNew := first + uint64(len(ents)) - 1; lastNew > offset {
			toWrite := ents
			if first <= offset {
				// Entries below FirstIndex are ignored.
				toWrite = ents[offset+1-first:]
				first = offset + 1
			}
			if first > last+1 {
				return p, fmt.Errorf("raftlog: save entries from %d: last index is %d: %w", first, last, ErrInvalidSave)
			}
			if first <= snapIndex {
				return p, fmt.Errorf("raftlog: save entries from %d: would overwrite entries covered by snapshot %d: %w", first, snapIndex, ErrInvalidSave)
			}
			p.ents = toWrite
		}
	}
	if !raft.IsEmptyHardState(hs) {
		p.hs = hs
	}
	return p, nil
}

// applySnapshot installs a snapshot received from the leader at (idx, term):
// the entries after it stay when the image holds idx with that term,
// otherwise the log restarts after it.
func (l *logImage) applySnapshot(idx, term uint64) {
	keep := false
	if idx > l.offset && idx <= l.last() {
		t, _ := l.term(idx)
		keep = t == term
	}
	if keep {
		l.ents = append([]*raftpb.Entry(nil), l.ents[idx-l.offset:]...)
	} else {
		l.ents = nil
	}
	l.offset, l.offsetTerm = idx, term
	l.snapIndex, l.snapTerm = idx, term
}

// appendEntries stores contiguous entries whose first index is in
// (offset, last()+1], replacing any stored suffix from there.
func (l *logImage) appendEntries(ents []*raftpb.Entry) {
	if len(ents) == 0 {
		return
	}
	keep := ents[0].GetIndex() - l.offset - 1
	if keep < uint64(len(l.ents)) {
		// A conflicting suffix goes: copy the prefix, so that slices
		// handed to readers are never written over.
		l.ents = append(make([]*raftpb.Entry, 0, keep+uint64(len(ents))), l.ents[:keep]...)
	}
	l.ents = append(l.ents, ents...)
}

// compact discards the entries up to and including c (offset < c <= last()).
func (l *logImage) compact(c uint64) {
	term, _ := l.term(c)
	l.ents = append([]*raftpb.Entry(nil), l.ents[c-l.offset:]...)
	l.offset, l.offsetTerm = c, term
}

// check verifies the invariants that make the image a log raft can restart
// from; the replay calls it once the log is read. It names what is wrong.
func (l *logImage) check() error {
	prevTerm := l.offsetTerm
	for k, e := range l.ents {
		want := l.offset + 1 + uint64(k)
		if e.GetIndex() != want {
			return fmt.Errorf("entry at position %d has index %d, expected %d", k, e.GetIndex(), want)
		}
		if e.GetTerm() < prevTerm {
			return fmt.Errorf("entry %d has term %d after term %d", want, e.GetTerm(), prevTerm)
		}
		prevTerm = e.GetTerm()
	}
	last := l.last()
	if l.snapIndex < l.offset || l.snapIndex > last {
		return fmt.Errorf("snapshot index %d outside the log [%d, %d] (first index %d, last index %d)", l.snapIndex, l.offset, last, l.offset+1, last)
	}
	if t, _ := l.term(l.snapIndex); t != l.snapTerm {
		return fmt.Errorf("snapshot %d has term %d but the log has term %d there", l.snapIndex, l.snapTerm, t)
	}
	commit := l.hs.GetCommit()
	switch {
	case commit > last:
		return fmt.Errorf("hard state commit %d beyond last index %d", commit, last)
	case commit < l.offset:
		// raft restarts with the compaction point as committed and refuses
		// a HardState below it.
		return fmt.Errorf("hard state commit %d below the compaction point %d", commit, l.offset)
	case commit < l.snapIndex:
		// The node restarts raft with the snapshot index as applied, and
		// raft refuses an applied index beyond the commit index.
		return fmt.Errorf("hard state commit %d below the snapshot index %d", commit, l.snapIndex)
	}
	return nil
}
