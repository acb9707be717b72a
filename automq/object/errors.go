package object

import "errors"

// Errors the Writer and Planner return when they refuse a call. A refused
// call changes nothing: the object is as it was before the call. Test for
// them with errors.Is.
var (
	// ErrInvalidBlockSize means the block size threshold is not positive.
	ErrInvalidBlockSize = errors.New("block size must be positive")
	// ErrStreamOrder means a call's stream id is lower (signed) than the
	// previous call's: AutoMQ writes streams in ascending order.
	ErrStreamOrder = errors.New("stream id is lower than the previous call's")
	// ErrOffsetBackwards means a record starts below the end offset of the
	// stream's previous record in the object.
	ErrOffsetBackwards = errors.New("record starts below the stream's end offset")
	// ErrOffsetGap means a record starts above the end offset of the
	// stream's previous record in the object: the object's stream range
	// would claim offsets it does not hold.
	ErrOffsetGap = errors.New("record leaves a gap after the stream's end offset")
	// ErrStreamMismatch means a record carries a stream id other than the
	// call's.
	ErrStreamMismatch = errors.New("record belongs to another stream than the call")
	// ErrInvalidRecord means a record cannot be written: a negative stream
	// id, epoch or base offset, a count that is not positive, offsets past
	// 2^63, a payload too large for its length field, or (for an encoded
	// record) bytes that are not a stream record batch.
	ErrInvalidRecord = errors.New("invalid stream record batch")
	// ErrBlockTooLarge means a data block would not fit the index's 32-bit
	// size or end-offset delta.
	ErrBlockTooLarge = errors.New("data block does not fit the index's 32-bit fields")
	// ErrObjectTooLarge means the index would not fit the footer's 32-bit
	// index size.
	ErrObjectTooLarge = errors.New("index does not fit the footer's 32-bit size")
	// ErrClosed means the Writer was already closed.
	ErrClosed = errors.New("object writer is closed")
	// ErrSizeOutOfRange means ReadIndex was given an object size above
	// MaxObjectSize, S3's largest object: a caller's mistake, not damage.
	ErrSizeOutOfRange = errors.New("object size above S3's 5 TiB limit")
)

// Errors of the key rule and the attributes.
var (
	// ErrInvalidObjectID means an object id is negative.
	ErrInvalidObjectID = errors.New("object id must not be negative")
	// ErrInvalidClusterID means a cluster id is empty or holds a '/'.
	ErrInvalidClusterID = errors.New("cluster id must be non-empty and hold no '/'")
	// ErrInvalidKey means a string is not an object key of the expected
	// namespace.
	ErrInvalidKey = errors.New("not an AutoMQ object key")
	// ErrAttributesUnset means attributes are -1, AutoMQ's "unset".
	ErrAttributesUnset = errors.New("object attributes are unset (-1)")
	// ErrInvalidAttributes means attributes hold an unknown object type, a
	// bucket index outside 0-32767, or bits AutoMQ 1.4 does not define.
	ErrInvalidAttributes = errors.New("invalid object attributes")
)

// ErrCorrupt means an object does not check out: every error of the reader
// about the object's bytes matches it, and also one of the more precise
// errors below. Test for them with errors.Is.
var ErrCorrupt = errors.New("damaged AutoMQ object")

// corruption is a reader error that also matches ErrCorrupt.
type corruption string

func (c corruption) Error() string        { return string(c) }
func (c corruption) Is(target error) bool { return target == ErrCorrupt }

// Errors of the reader, each also matching ErrCorrupt.
var (
	// ErrTruncated means the object is shorter than the size it was read
	// with, or shorter than a footer.
	ErrTruncated error = corruption("object is shorter than its size")
	// ErrFooterMagic means the last 8 bytes are not the footer magic
	// 0x88E241B785F4CFF7, or the footer's reserved bytes are not zero.
	ErrFooterMagic error = corruption("bad footer")
	// ErrIndexBounds means the footer's index position or size does not
	// fit the object, or the index size is not a multiple of 36.
	ErrIndexBounds error = corruption("index position or size out of bounds")
	// ErrIndexOrder means the index entries are not sorted by (stream id,
	// start offset), leave gaps or overlaps in a stream's offsets, hold
	// invalid values, or do not cover the data blocks back to back from
	// byte 0 to the index.
	ErrIndexOrder error = corruption("index entries out of order or not covering the blocks")
	// ErrBlockMagic means a data block does not start with magic 0x5A and
	// flag 0x02.
	ErrBlockMagic error = corruption("bad data block magic")
	// ErrBlockMismatch means a data block's header (record count, data
	// length) disagrees with its index entry.
	ErrBlockMismatch error = corruption("data block header disagrees with the index")
	// ErrRecordMagic means a record does not start with magic 0x22.
	ErrRecordMagic error = corruption("bad record magic")
	// ErrRecordLength means a record's header or payload runs past the end
	// of its block.
	ErrRecordLength error = corruption("record runs past its block")
	// ErrOffsetMismatch means a block's records disagree with its index
	// entry: another stream, offsets not contiguous, or a first or end
	// offset other than the entry's, or a record with invalid values.
	ErrOffsetMismatch error = corruption("records disagree with the index entry")
	// ErrTrailingBytes means a block holds bytes after its last record.
	ErrTrailingBytes error = corruption("bytes after the block's last record")
)
