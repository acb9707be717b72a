package fsm_test

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"walden/fsm"
	"walden/objformat"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/wal"
)

// withChecks makes the harness apply every command at the checks level
// this walden proposes with.
func withChecks(h *harness) *harness {
	h.form = func(c *waldenv1.Command) { fsm.PrepareProposal(c) }
	return h
}

// section is a range of stream 1 at epoch 1 whose section is length bytes
// at position 16, in an object just large enough to hold it.
func section(id string, start, end, length uint64) *waldenv1.Object {
	return &waldenv1.Object{ObjectId: id, Key: "objects/" + id, Size: 16 + length + 4 + 56 + 32,
		Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 1, StartOffset: start, EndOffset: end, Position: 16, Length: length}}}
}

// TestCommitObjectBounded is finding 1 of the hardening table: one
// CommitObject of the owning broker claimed offsets [311, 2^64-1) in 10
// bytes; the stream then claimed 2^64 records, every later upload of the
// broker failed OFFSET_MISMATCH, and the acknowledged records 311-314 were
// in no object. From level ChecksBounded on the state machine refuses it,
// naming the field, and changes nothing.
func TestCommitObjectBounded(t *testing.T) {
	h := withChecks(newHarness(t))
	e := h.register("b2")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e, StreamId: 1})
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e, StreamId: 2})
	h.ok(&waldenv1.CommitObjectRequest{BrokerId: "b2", BrokerEpoch: e, Object: section("o1", 0, 311, 16*4)})

	commit := func(o *waldenv1.Object) *waldenv1.CommitObjectRequest {
		return &waldenv1.CommitObjectRequest{BrokerId: "b2", BrokerEpoch: e, Object: o}
	}
	issue := &waldenv1.Object{ObjectId: "k5", Key: "k5", Size: 100, Ranges: []*waldenv1.ObjectRange{
		{StreamId: 1, StreamEpoch: 1, StartOffset: 311, EndOffset: math.MaxUint64, Position: 0, Length: 10}}}
	twoStreams := section("o2", 311, 400, 32)
	twoStreams.Size += 16 + 56
	twoStreams.Ranges = append(twoStreams.Ranges, &waldenv1.ObjectRange{StreamId: 2, StreamEpoch: 1, StartOffset: 0, EndOffset: 9, Position: 48, Length: 16})
	wrapped := commit(section("o2", 311, 400, 64))
	wrapped.Producers = []*waldenv1.StreamProducers{{StreamId: 1, Producers: []*waldenv1.ProducerState{
		{ProducerId: 7, Sequence: 1, Offset: math.MaxUint64 - 1, Count: 3}}}}
	for _, c := range []struct {
		name, msg string
		op        any
	}{
		{"the issue's commit: [311, 2^64-1) in 10 bytes at position 0", "object.ranges[0].end_offset: 18446744073709551615 is not below 2^63",
			commit(issue)},
		{"an end offset of 2^63", "is not below 2^63", commit(section("o2", 311, 1<<63, 64))},
		{"more offsets than 10 bytes hold", "object.ranges[0].end_offset: 1 offsets [311, 312) do not fit in length 10: a record batch takes at least 16 bytes in a walden object (its header), so 10 bytes hold none",
			commit(section("o2", 311, 312, 10))},
		{"more offsets than 32 bytes hold", "do not fit in length 32: a record batch takes at least 16 bytes in a walden object (its header) and covers at most 4294967295 offsets, so 32 bytes hold at most 8589934590",
			commit(section("o2", 311, 311+2*math.MaxUint32+1, 32))},
		{"a section inside the header", "object.ranges[0].position: 0 is inside the object's header (16 bytes)",
			commit(&waldenv1.Object{ObjectId: "o2", Key: "k", Size: 200, Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 1, StartOffset: 311, EndOffset: 312, Position: 0, Length: 16}}})},
		{"a section into the index", "object.ranges[0].length: position 16 + length 64 reaches into the object's index and footer",
			commit(&waldenv1.Object{ObjectId: "o2", Key: "k", Size: 100, Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 1, StartOffset: 311, EndOffset: 312, Position: 16, Length: 64}}})},
		{"a section beyond the object", "position 16 + length 1000 is beyond the object's size",
			commit(&waldenv1.Object{ObjectId: "o2", Key: "k", Size: 100, Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 1, StartOffset: 311, EndOffset: 312, Position: 16, Length: 1000}}})},
		{"overlapping sections", "object.ranges[1].position: 48 is inside the previous range",
			commit(func() *waldenv1.Object {
				o := section("o2", 311, 400, 64)
				o.Size += 72
				o.Ranges = append(o.Ranges, twoStreams.Ranges[1])
				return o
			}())},
		{"the second stream's offsets beyond its bytes", "object.ranges[1].end_offset",
			commit(func() *waldenv1.Object {
				o := section("o2", 311, 400, 32)
				o.Size += 72
				o.Ranges = append(o.Ranges, &waldenv1.ObjectRange{StreamId: 2, StreamEpoch: 1, StartOffset: 0, EndOffset: math.MaxUint32 + 1, Position: 48, Length: 16})
				return o
			}())},
		{"a producer batch whose end wraps past 2^64", "offsets [18446744073709551614, 1) outside the stream's range", wrapped},
		{"a maintenance ttl of 2^63-1 ms", "ttl_ms: 9223372036854775807 ms is not between 0 (no ttl) and 168h",
			&waldenv1.SetMaintenance{BrokerId: "b2", On: true, TtlMs: math.MaxInt64}},
		{"a negative maintenance ttl", "ttl_ms: -1 ms", &waldenv1.SetMaintenance{BrokerId: "b2", On: true, TtlMs: -1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			err := h.refuse(c.op, refusal.ErrInvalidArgument)
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("refusal %q does not say %q", err, c.msg)
			}
		})
	}
	h.t = t
	// What fits is committed.
	h.ok(commit(twoStreams))
	if st := h.stream(1); st.GetEndOffset() != 400 {
		t.Fatalf("stream 1 = %v", st)
	}
}

// TestOldEntriesReplayAsTheyWere: an entry of a walden before the check
// levels (checks 0) is applied with the checks of its time, so that a
// member replaying its log reaches the state the others reached: the
// issue's commit, the wrapping producer batch and the long ttl are
// applied as they were, while the same entries of level ChecksBounded
// are refused.
func TestOldEntriesReplayAsTheyWere(t *testing.T) {
	old := newHarness(t)
	e := old.register("b2")
	old.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e, StreamId: 201})
	issue := &waldenv1.CommitObjectRequest{BrokerId: "b2", BrokerEpoch: e, Object: &waldenv1.Object{ObjectId: "k5", Key: "k5", Size: 100,
		Ranges: []*waldenv1.ObjectRange{{StreamId: 201, StreamEpoch: 1, StartOffset: 0, EndOffset: math.MaxUint64, Position: 0, Length: 10}}}}
	old.ok(issue)
	if st := old.stream(201); st.GetEndOffset() != math.MaxUint64 {
		t.Fatalf("replayed old entry: stream 201 = %v, want its end at 2^64-1 as before", st)
	}
	old.ok(&waldenv1.SetMaintenance{BrokerId: "b2", On: true, TtlMs: math.MaxInt64})

	cur := withChecks(newHarness(t))
	e = cur.register("b2")
	cur.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e, StreamId: 201})
	cur.refuse(issue, refusal.ErrInvalidArgument)
	cur.refuse(&waldenv1.SetMaintenance{BrokerId: "b2", On: true, TtlMs: math.MaxInt64}, refusal.ErrInvalidArgument)

	// PrepareProposal sets this version's level.
	c := &waldenv1.Command{Op: &waldenv1.Command_Noop{Noop: &waldenv1.Noop{}}}
	fsm.PrepareProposal(c)
	if c.GetChecks() != fsm.Checks || fsm.Checks < fsm.ChecksBounded {
		t.Fatalf("PrepareProposal set checks %d, want %d", c.GetChecks(), fsm.Checks)
	}
}

// TestObjectBoundsAreTheFormats: the catalog's bounds are those of walden's
// object format (package objformat): its batch header, its largest batch
// count, its header, index and footer sizes; an object the format builds
// at the bound passes CheckObject, one offset more is refused.
func TestObjectBoundsAreTheFormats(t *testing.T) {
	if fsm.MinBatchBytes != objformat.BatchHeaderSize || fsm.ObjectHeaderBytes != objformat.HeaderSize ||
		fsm.ObjectTrailerBytes != objformat.IndexHeaderSize+objformat.FooterSize || fsm.ObjectIndexEntryBytes != objformat.IndexEntrySize {
		t.Fatal("the catalog's bounds differ from the object format's sizes")
	}
	// Two batches of the largest count and no payload: the densest
	// section the format writes.
	b := objformat.NewBuilder()
	for i, base := range []uint64{5, 5 + fsm.MaxBatchOffsets} {
		if err := b.Add(wal.Batch{StreamID: 9, Epoch: 1, BaseOffset: base, Count: fsm.MaxBatchOffsets}); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	var buf bytes.Buffer
	if _, err := b.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	ix, err := objformat.ReadIndex(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	o := &waldenv1.Object{ObjectId: "dense", Key: "dense", Size: uint64(buf.Len()), Ranges: ix.Ranges()}
	if r := o.GetRanges()[0]; r.GetLength() != 2*fsm.MinBatchBytes || r.GetEndOffset()-r.GetStartOffset() != fsm.MaxRangeOffsets(r.GetLength()) {
		t.Fatalf("dense range %v: not at the bound %d", r, fsm.MaxRangeOffsets(r.GetLength()))
	}
	if fe := fsm.CheckObject(o); fe != nil {
		t.Fatalf("an object the format built is refused: %v", fe)
	}
	o.GetRanges()[0].EndOffset++
	if fe := fsm.CheckObject(o); fe == nil || fe.Field != "object.ranges[0].end_offset" {
		t.Fatalf("one offset beyond the bound: %v", fe)
	}
	if got := fsm.MaxRangeOffsets(math.MaxUint64); got != math.MaxUint64 {
		t.Fatalf("MaxRangeOffsets(2^64-1) = %d, want it saturated", got)
	}
}
