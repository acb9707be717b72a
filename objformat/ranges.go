package objformat

import waldenv1 "walden/proto/walden/v1"

// Range returns the catalog's ObjectRange for the section.
func (e IndexEntry) Range() *waldenv1.ObjectRange {
	return &waldenv1.ObjectRange{
		StreamId:    e.StreamID,
		StreamEpoch: e.StreamEpoch,
		StartOffset: e.StartOffset,
		EndOffset:   e.EndOffset,
		Position:    e.Position,
		Length:      e.Length,
	}
}

// Ranges returns the catalog's ObjectRanges of every section, in index
// order (ascending stream id).
func (ix *Index) Ranges() []*waldenv1.ObjectRange {
	rs := make([]*waldenv1.ObjectRange, len(ix.Entries))
	for i, e := range ix.Entries {
		rs[i] = e.Range()
	}
	return rs
}

// EntryOf returns the index entry that a catalog ObjectRange describes,
// with the section checksum and batch count taken from ix. It reports false
// when ix has no section of the range's stream or the section's position,
// length or offsets differ from the range.
func (ix *Index) EntryOf(r *waldenv1.ObjectRange) (IndexEntry, bool) {
	e, ok := ix.Entry(r.GetStreamId())
	if !ok || e.Position != r.GetPosition() || e.Length != r.GetLength() ||
		e.StartOffset != r.GetStartOffset() || e.EndOffset != r.GetEndOffset() || e.StreamEpoch != r.GetStreamEpoch() {
		return IndexEntry{}, false
	}
	return e, true
}
