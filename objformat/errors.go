package objformat

import "errors"

// Errors returned by the package, wrapped with the detail; test for them
// with errors.Is.
var (
	// ErrOutOfOrder means a batch does not start at its stream's previous
	// end offset (a gap, an overlap or a batch added twice).
	ErrOutOfOrder = errors.New("batch does not start at the stream's end offset")
	// ErrEpochMismatch means a batch carries a stream epoch different from
	// the epoch of the stream's first batch in the same object.
	ErrEpochMismatch = errors.New("batch epoch differs from the stream's epoch in this object")
	// ErrInvalidBatch means a batch has no offsets (count 0), or its offsets
	// or payload do not fit the format.
	ErrInvalidBatch = errors.New("invalid batch")
	// ErrEmpty means Build or WriteTo was called on a Builder without
	// batches.
	ErrEmpty = errors.New("object has no batches")
	// ErrCorrupt means a checksum, magic, length or offset in the object
	// does not match: the object (or the part read) is damaged or truncated.
	ErrCorrupt = errors.New("corrupt object")
	// ErrVersion means the object was written in a format version this
	// package does not read.
	ErrVersion = errors.New("unsupported object format version")
)
