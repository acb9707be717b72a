package fsm

import (
	"fmt"
	"math"

	waldenv1 "walden/proto/walden/v1"
)

// Levels of the state machine's input checks. What the state machine checks
// grows from one walden to the next, but an entry must be applied as it was
// when it was committed: a member that replays its log after a restart, or
// applies an older member's entry during a rolling upgrade, must reach the
// state the others reached. So every entry carries the level of the checks
// it is applied with (Command.checks, set by PrepareProposal), and a check
// applies only from the level that introduced it; an entry of a walden
// before the levels carries 0 and is applied with the checks of its time.
//
// The proposer checks what it proposes with the same functions first (the
// API answers InvalidArgument naming the field), so an entry of a new level
// that a check refuses is a proposer's bug, refused alike by every member of
// that level.
const (
	// ChecksBounded (1) bounds what an entry may put in the state: a
	// committed range's offsets stay below 2^63, its section lies inside
	// the object between the header and the index, and its record count
	// fits its bytes (CheckObject); a producer's batch lies inside its
	// range without wrapping; a maintenance ttl is at most
	// MaxMaintenanceTTLMs.
	ChecksBounded uint32 = 1
	// ChecksNeverGranted (2) records, at a registration, its raft index
	// and whether the broker's earlier epochs were recovered
	// (Broker.registered_index, prior_recovered), and lets a decision
	// find that the failed epoch acknowledged nothing
	// (Job.acknowledged_nothing): an entry of an older walden replays
	// without them, as it was applied.
	ChecksNeverGranted uint32 = 2
	// Checks is the level this walden proposes with.
	Checks = ChecksNeverGranted
)

// Bounds of the catalog. A committed object is in walden's object format
// (package objformat, docs/object-format.md): a range's section is a run
// of record batches, each a 16-byte header (base_offset u64, count u32,
// payload_length u32) followed by its payload, whose count (a u32, at
// least 1) is the number of offsets it covers. So a section of L bytes
// holds at most L/16 batches and (L/16)·(2^32−1) offsets, and none at all
// below 16 bytes; the state machine refuses a range that claims more
// offsets than its bytes can hold (one commit once claimed 2^64 offsets
// in 10 bytes and made the stream unreadable and every later upload of
// its broker fail).
const (
	// MinBatchBytes is the smallest encoded record batch: its header.
	MinBatchBytes = 16
	// MaxBatchOffsets is the most offsets one record batch covers.
	MaxBatchOffsets = math.MaxUint32
	// OffsetLimit bounds every stream offset: offsets stay below 2^63
	// (an int64 for every reader, and far from wrapping).
	OffsetLimit uint64 = 1 << 63
	// ObjectHeaderBytes is the object header before the first section.
	ObjectHeaderBytes = 16
	// ObjectTrailerBytes and ObjectIndexEntryBytes make the index and the
	// footer after the last section: 4 + 56 per stream, then 32.
	ObjectTrailerBytes    = 4 + 32
	ObjectIndexEntryBytes = 56
	// MaxMaintenanceTTLMs bounds a maintenance ttl (`waldenctl
	// maintenance on --ttl`): 7 days, in milliseconds.
	MaxMaintenanceTTLMs int64 = 7 * 24 * 3600 * 1000
)

// MaxRangeOffsets is the most offsets a section of length bytes can hold.
func MaxRangeOffsets(length uint64) uint64 {
	batches := length / MinBatchBytes
	if batches > math.MaxUint64/MaxBatchOffsets {
		return math.MaxUint64
	}
	return batches * MaxBatchOffsets
}

// FieldError names the field of a command that breaks a rule of the state
// machine, so that the API can answer InvalidArgument naming it.
type FieldError struct {
	// Field is the field's path in the request: "object.ranges[0].length".
	Field string
	// Reason says what is wrong, for people.
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// CheckObject checks the ranges of an object about to be committed, as
// the catalog keeps them: each names a stream (neither 0 nor 2^64−1, each
// once) at a stream epoch other than 0, its offsets ascend and stay below
// 2^63, and its section is not empty, lies inside the object after the
// header, before the index and after the previous section, and is long
// enough for its offsets. The API checks every CommitObject with it before
// proposing; the state machine again for entries of level ChecksBounded.
func CheckObject(o *waldenv1.Object) *FieldError {
	seen := map[uint64]bool{}
	prevEnd := uint64(ObjectHeaderBytes)
	n := uint64(len(o.GetRanges()))
	var sectionsEnd uint64 // where the index starts, at the latest
	if trailer := ObjectTrailerBytes + ObjectIndexEntryBytes*n; o.GetSize() > trailer {
		sectionsEnd = o.GetSize() - trailer
	}
	for i, r := range o.GetRanges() {
		field := fmt.Sprintf("object.ranges[%d]", i)
		fail := func(name, format string, args ...any) *FieldError {
			return &FieldError{Field: field + "." + name, Reason: fmt.Sprintf(format, args...)}
		}
		switch r.GetStreamId() {
		case 0:
			return fail("stream_id", "must not be 0")
		case math.MaxUint64:
			return fail("stream_id", "must be less than 2^64-1")
		}
		if seen[r.GetStreamId()] {
			return fail("stream_id", "stream %d appears twice", r.GetStreamId())
		}
		seen[r.GetStreamId()] = true
		if r.GetStreamEpoch() == 0 {
			return fail("stream_epoch", "must not be 0")
		}
		start, end := r.GetStartOffset(), r.GetEndOffset()
		if end <= start {
			return fail("end_offset", "%d is not beyond start_offset %d", end, start)
		}
		if end > OffsetLimit-1 {
			return fail("end_offset", "%d is not below 2^63 (%d): stream offsets stay below 2^63", end, OffsetLimit)
		}
		pos, length := r.GetPosition(), r.GetLength()
		if length == 0 {
			return fail("length", "must not be 0: a range holds the stream's records")
		}
		if pos > o.GetSize() || length > o.GetSize()-pos {
			return fail("length", "position %d + length %d is beyond the object's size %d", pos, length, o.GetSize())
		}
		if pos < prevEnd {
			if i == 0 {
				return fail("position", "%d is inside the object's header (%d bytes): the first section starts at %d or later", pos, ObjectHeaderBytes, ObjectHeaderBytes)
			}
			return fail("position", "%d is inside the previous range (which ends at %d): ranges are in ascending positions and do not overlap", pos, prevEnd)
		}
		if pos+length > sectionsEnd {
			streams := "streams"
			if n == 1 {
				streams = "stream"
			}
			return fail("length", "position %d + length %d reaches into the object's index and footer, its last %d bytes (of %d) with %d %s: sections end by byte %d",
				pos, length, o.GetSize()-sectionsEnd, o.GetSize(), n, streams, sectionsEnd)
		}
		if count, most := end-start, MaxRangeOffsets(length); count > most {
			if most == 0 {
				return fail("end_offset", "%d offsets [%d, %d) do not fit in length %d: a record batch takes at least %d bytes in a walden object (its header), so %d bytes hold none",
					count, start, end, length, MinBatchBytes, length)
			}
			return fail("end_offset", "%d offsets [%d, %d) do not fit in length %d: a record batch takes at least %d bytes in a walden object (its header) and covers at most %d offsets, so %d bytes hold at most %d",
				count, start, end, length, MinBatchBytes, uint64(MaxBatchOffsets), length, most)
		}
		prevEnd = pos + length
	}
	return nil
}

// producerInside reports whether a producer's batch [offset,
// offset+count) lies inside the range [start, end) without wrapping
// (level ChecksBounded), or, for older entries, as it was checked before
// (the sum could wrap).
func producerInside(checks uint32, offset uint64, count uint32, start, end uint64) bool {
	if checks < ChecksBounded {
		return offset >= start && offset+uint64(count) <= end
	}
	return offset >= start && offset < end && uint64(count) <= end-offset
}
