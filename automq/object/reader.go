package object

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
)

// MaxObjectSize is the largest object size ReadIndex accepts: S3's largest
// object, 5 TiB. It bounds what a wrong size can make the reader allocate
// (the tail read of a 5 TiB object is 180 MiB).
const MaxObjectSize = 5 << 40

// TailReadSize is how many bytes at the end of an object of the given size
// AutoMQ's ObjectReader reads first, hoping they hold the index and the
// footer: 8192 bytes plus 36 per whole MiB of the object, at most the
// object.
func TailReadSize(size int64) int64 {
	if size <= 0 {
		return 0
	}
	return min(size, 8192+(size/(1<<20))*IndexEntrySize)
}

// Object is an object whose footer and index were read and checked by
// ReadIndex. Its blocks are read on demand with ReadBlock. An Object is
// safe for concurrent use if its io.ReaderAt is.
type Object struct {
	r             io.ReaderAt
	size          int64
	indexPosition int64
	index         []BlockIndex
}

// ReadIndex reads the footer and index of an object of the given size (as
// the store reports it) the way AutoMQ's ObjectReader does: it reads the
// last TailReadSize(size) bytes, checks the footer magic in the last 8,
// takes the index position and size from the footer and, when that tail
// does not reach back to the index, reads again from the index position to
// the end of the object.
//
// Every field is checked before anything is returned: the footer magic and
// its zero reserved bytes; the index lying between the data blocks and the
// footer (index position + index size + 48 = size) with a size that is a
// multiple of 36; and the entries, which must be sorted by (stream id,
// start offset), leave no gap or overlap within a stream, and describe
// blocks that lie back to back from byte 0 to the index. A failure matches
// ErrCorrupt and a more precise error (ErrTruncated, ErrFooterMagic,
// ErrIndexBounds, ErrIndexOrder); an error of r is returned wrapped, and a
// size above MaxObjectSize is ErrSizeOutOfRange.
func ReadIndex(r io.ReaderAt, size int64) (*Object, error) {
	if size < FooterSize {
		return nil, fmt.Errorf("automq object: %d bytes, shorter than the %d-byte footer: %w", size, FooterSize, ErrTruncated)
	}
	if size > MaxObjectSize {
		return nil, fmt.Errorf("automq object: size %d: %w", size, ErrSizeOutOfRange)
	}
	tail := make([]byte, TailReadSize(size))
	if err := readFull(r, tail, size-int64(len(tail))); err != nil {
		return nil, fmt.Errorf("automq object: read the last %d bytes: %w", len(tail), err)
	}
	footer := tail[len(tail)-FooterSize:]
	pos, isz, err := parseFooter(footer, size)
	if err != nil {
		return nil, err
	}
	var index []byte
	if pos+int64(len(tail)) < size {
		// The tail does not reach the index: read again from the index
		// position to the end of the object, as AutoMQ does.
		again := make([]byte, size-pos)
		if err := readFull(r, again, pos); err != nil {
			return nil, fmt.Errorf("automq object: read the index at byte %d: %w", pos, err)
		}
		if !bytes.Equal(again[len(again)-FooterSize:], footer) {
			return nil, fmt.Errorf("automq object: the footer read again at byte %d differs from the first read (the object changed while it was read): %w", size-FooterSize, ErrFooterMagic)
		}
		index = again[:isz]
	} else {
		at := int64(len(tail)) - (size - pos)
		index = tail[at : at+isz]
	}
	entries, err := parseIndex(index, pos)
	if err != nil {
		return nil, err
	}
	return &Object{r: r, size: size, indexPosition: pos, index: entries}, nil
}

// parseFooter checks the footer of an object of the given size and returns
// the index position and size.
func parseFooter(f []byte, size int64) (int64, int64, error) {
	if m := be.Uint64(f[40:]); m != FooterMagic {
		return 0, 0, fmt.Errorf("automq object: footer magic %#016x, expected %#016x: %w", m, FooterMagic, ErrFooterMagic)
	}
	for i, c := range f[12:40] {
		if c != 0 {
			return 0, 0, fmt.Errorf("automq object: footer reserved byte %d is %#02x, expected 0: %w", 12+i, c, ErrFooterMagic)
		}
	}
	pos := int64(be.Uint64(f[0:]))
	isz := int64(int32(be.Uint32(f[8:])))
	switch {
	case pos < 0 || pos > size-FooterSize:
		return 0, 0, fmt.Errorf("automq object: index position %d, expected 0 to %d in an object of %d bytes: %w", pos, size-FooterSize, size, ErrIndexBounds)
	case isz < 0 || isz%IndexEntrySize != 0:
		return 0, 0, fmt.Errorf("automq object: index size %d, expected a non-negative multiple of %d: %w", isz, IndexEntrySize, ErrIndexBounds)
	case pos+isz+FooterSize != size:
		return 0, 0, fmt.Errorf("automq object: index at byte %d of %d bytes ends at %d, expected the footer at %d: %w", pos, isz, pos+isz, size-FooterSize, ErrIndexBounds)
	}
	return pos, isz, nil
}

// parseIndex decodes and checks the index of an object whose data blocks
// end at dataEnd.
func parseIndex(p []byte, dataEnd int64) ([]BlockIndex, error) {
	entries := make([]BlockIndex, len(p)/IndexEntrySize)
	var next int64 // the position the next block must start at
	for i := range entries {
		e := getBlockIndex(p[i*IndexEntrySize:])
		bad := func(format string, args ...any) error {
			return fmt.Errorf("automq object: index entry %d (stream %d, offset %d, block at byte %d): "+format+": %w",
				append(append([]any{i, e.StreamID, e.StartOffset, e.Position}, args...), ErrIndexOrder)...)
		}
		switch {
		case e.StreamID < 0:
			return nil, bad("negative stream id")
		case e.StartOffset < 0:
			return nil, bad("negative start offset")
		case e.RecordCount <= 0:
			return nil, bad("record count %d, expected at least 1", e.RecordCount)
		case e.EndOffsetDelta < e.RecordCount:
			return nil, bad("end offset delta %d below its %d records' count", e.EndOffsetDelta, e.RecordCount)
		case e.StartOffset > math.MaxInt64-int64(e.EndOffsetDelta):
			return nil, bad("end offset past 2^63")
		case int64(e.Size) < BlockHeaderSize+RecordHeaderSize*int64(e.RecordCount):
			return nil, bad("block of %d bytes cannot hold %d records", e.Size, e.RecordCount)
		case e.Position != next:
			return nil, bad("expected the block at byte %d, right after the previous one", next)
		case e.End() > dataEnd:
			return nil, bad("block of %d bytes runs past the index at byte %d", e.Size, dataEnd)
		}
		if i > 0 {
			prev := entries[i-1]
			switch {
			case e.StreamID < prev.StreamID:
				return nil, bad("after stream %d: entries must be sorted by stream id", prev.StreamID)
			case e.StreamID == prev.StreamID && e.StartOffset < prev.EndOffset():
				return nil, bad("overlaps the previous block of the stream, which ends at offset %d", prev.EndOffset())
			case e.StreamID == prev.StreamID && e.StartOffset > prev.EndOffset():
				return nil, bad("leaves a gap after the previous block of the stream, which ends at offset %d", prev.EndOffset())
			}
		}
		next = e.End()
		entries[i] = e
	}
	if next != dataEnd {
		return nil, fmt.Errorf("automq object: the %d blocks end at byte %d, the index starts at byte %d: %w", len(entries), next, dataEnd, ErrIndexOrder)
	}
	return entries, nil
}

// Size is the object's size.
func (o *Object) Size() int64 { return o.size }

// IndexPosition is the byte offset of the index, the total size of the data
// blocks.
func (o *Object) IndexPosition() int64 { return o.indexPosition }

// IndexSize is the index's size in bytes.
func (o *Object) IndexSize() int64 { return int64(len(o.index)) * IndexEntrySize }

// Index returns a copy of the index entries, one per data block, in object
// order.
func (o *Object) Index() []BlockIndex { return append([]BlockIndex(nil), o.index...) }

// ReadBlock reads data block i (an index into Index) and returns its
// records, whose payloads share one buffer allocated for the block. It
// checks the block magic 0x5A and flag 0x02, the header's record count and
// data length against the index entry, and every record: magic 0x22, the
// entry's stream, a length that stays in the block, valid fields, offsets
// contiguous from the entry's start offset to its end offset, and no bytes
// after the last record. A failure matches ErrCorrupt and a more precise
// error; no records are returned with it.
func (o *Object) ReadBlock(i int) ([]Record, error) {
	if i < 0 || i >= len(o.index) {
		return nil, fmt.Errorf("automq object: block %d of %d: %w", i, len(o.index), errNoSuchBlock)
	}
	e := o.index[i]
	buf := make([]byte, e.Size)
	if err := readFull(o.r, buf, e.Position); err != nil {
		return nil, fmt.Errorf("automq object: read block %d (%d bytes at byte %d): %w", i, e.Size, e.Position, err)
	}
	return parseBlock(i, e, buf)
}

// errNoSuchBlock is a caller's mistake, not a damaged object.
var errNoSuchBlock = errors.New("no such block")

// ReadAll reads every block and returns all records in object order.
func (o *Object) ReadAll() ([]Record, error) {
	var out []Record
	for i := range o.index {
		recs, err := o.ReadBlock(i)
		if err != nil {
			return nil, err
		}
		out = append(out, recs...)
	}
	return out, nil
}

// parseBlock checks block i, described by e, and returns its records.
func parseBlock(i int, e BlockIndex, p []byte) ([]Record, error) {
	where := func(kind error, format string, args ...any) error {
		return fmt.Errorf("automq object: block %d (stream %d, at byte %d): "+format+": %w",
			append(append([]any{i, e.StreamID, e.Position}, args...), kind)...)
	}
	if p[0] != BlockMagic {
		return nil, where(ErrBlockMagic, "magic %#02x, expected %#02x", p[0], BlockMagic)
	}
	if p[1] != BlockFlag {
		return nil, where(ErrBlockMagic, "flag %#02x, expected %#02x (AutoMQ 1.4 writes no other)", p[1], BlockFlag)
	}
	if n := int32(be.Uint32(p[2:])); n != e.RecordCount {
		return nil, where(ErrBlockMismatch, "%d records in the block header, %d in the index", n, e.RecordCount)
	}
	if n := int32(be.Uint32(p[6:])); n != e.Size-BlockHeaderSize {
		return nil, where(ErrBlockMismatch, "data length %d in the block header, expected %d from the index's block size %d", n, e.Size-BlockHeaderSize, e.Size)
	}
	recs := make([]Record, e.RecordCount)
	off := BlockHeaderSize
	next := e.StartOffset
	for k := range recs {
		if len(p)-off < RecordHeaderSize {
			return nil, where(ErrRecordLength, "record %d at block byte %d: %d bytes left, a record header takes %d", k, off, len(p)-off, RecordHeaderSize)
		}
		if p[off] != RecordMagic {
			return nil, where(ErrRecordMagic, "record %d at block byte %d: magic %#02x, expected %#02x", k, off, p[off], RecordMagic)
		}
		r := decodeHeader(p[off:])
		n := int64(int32(be.Uint32(p[off+29:])))
		if n < 0 || n > int64(len(p)-off-RecordHeaderSize) {
			return nil, where(ErrRecordLength, "record %d at block byte %d: payload length %d, %d bytes left in the block", k, off, n, len(p)-off-RecordHeaderSize)
		}
		start := off + RecordHeaderSize
		r.Payload = p[start : start+int(n) : start+int(n)]
		if r.StreamID != e.StreamID {
			return nil, where(ErrOffsetMismatch, "record %d belongs to stream %d", k, r.StreamID)
		}
		if err := r.check(); err != nil {
			return nil, where(ErrOffsetMismatch, "record %d: %v", k, err)
		}
		if r.BaseOffset != next {
			return nil, where(ErrOffsetMismatch, "record %d starts at offset %d, expected %d", k, r.BaseOffset, next)
		}
		next = r.EndOffset()
		recs[k] = r
		off = start + int(n)
	}
	if off != len(p) {
		return nil, where(ErrTrailingBytes, "%d bytes after record %d", len(p)-off, len(recs)-1)
	}
	if next != e.EndOffset() {
		return nil, where(ErrOffsetMismatch, "records end at offset %d, the index says %d", next, e.EndOffset())
	}
	return recs, nil
}

// readFull reads len(p) bytes at off; fewer means the object is shorter
// than its size.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return fmt.Errorf("got %d of %d bytes at byte %d: %w", n, len(p), off, ErrTruncated)
	}
	return err
}
