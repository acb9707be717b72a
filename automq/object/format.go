package object

import (
	"encoding/binary"
	"fmt"
	"math"

	"walden/wal"
)

// Layout constants of AutoMQ 1.4's objects (s3stream ObjectWriter,
// DataBlockIndex, StreamRecordBatchCodec). Integers are big-endian.
const (
	// DefaultBlockSize is the block size threshold AutoMQ 1.4 brokers use
	// by default (s3.object.block.size).
	DefaultBlockSize = 524288

	// BlockHeaderSize is the size of a data block's header: magic, flag,
	// int32 record count, int32 data length.
	BlockHeaderSize = 10
	// RecordHeaderSize is the size of an encoded record before its
	// payload: magic, stream id, epoch, base offset, count, payload length.
	RecordHeaderSize = 33
	// IndexEntrySize is the size of one index entry.
	IndexEntrySize = 36
	// FooterSize is the size of the footer: int64 index position, int32
	// index size, 28 zero bytes, int64 magic.
	FooterSize = 48

	// BlockMagic is the first byte of a data block.
	BlockMagic byte = 0x5A
	// BlockFlag is the second byte of every data block AutoMQ 1.4 writes
	// (no compression).
	BlockFlag byte = 0x02
	// RecordMagic is the first byte of an encoded record.
	RecordMagic byte = 0x22
	// FooterMagic is the last 8 bytes of an object.
	FooterMagic uint64 = 0x88E241B785F4CFF7

	// MaxPayload is the largest payload a record can carry: a block's size,
	// header included, must fit an int32.
	MaxPayload = math.MaxInt32 - BlockHeaderSize - RecordHeaderSize
)

var be = binary.BigEndian

// Record is one stream record batch (AutoMQ's StreamRecordBatch): Count
// offsets of one stream starting at BaseOffset, written under the stream's
// Epoch, with an opaque Payload. Its encoding is the body of an AutoMQ WAL
// record: see AppendEncoded.
type Record struct {
	// StreamID identifies the stream.
	StreamID int64
	// Epoch is the stream epoch the record was written under.
	Epoch int64
	// BaseOffset is the first stream offset of the record.
	BaseOffset int64
	// Count is the number of offsets the record covers (AutoMQ names it
	// lastOffsetDelta): the record covers [BaseOffset, BaseOffset+Count).
	Count int32
	// Payload is the opaque content, written as it is.
	Payload []byte
}

// EndOffset is one past the record's last offset.
func (r Record) EndOffset() int64 { return r.BaseOffset + int64(r.Count) }

// EncodedSize is the size of the record's encoding.
func (r Record) EncodedSize() int { return RecordHeaderSize + len(r.Payload) }

// AppendEncoded appends the record's encoding to dst: magic 0x22, stream
// id, epoch, base offset, count, payload length, payload.
func (r Record) AppendEncoded(dst []byte) []byte {
	var h [RecordHeaderSize]byte
	r.putHeader(h[:])
	dst = append(dst, h[:]...)
	return append(dst, r.Payload...)
}

// putHeader writes the 33 bytes before the payload into p.
func (r *Record) putHeader(p []byte) {
	p[0] = RecordMagic
	be.PutUint64(p[1:], uint64(r.StreamID))
	be.PutUint64(p[9:], uint64(r.Epoch))
	be.PutUint64(p[17:], uint64(r.BaseOffset))
	be.PutUint32(p[25:], uint32(r.Count))
	be.PutUint32(p[29:], uint32(len(r.Payload)))
}

// check reports why the record cannot be written, or nil.
func (r *Record) check() error {
	return checkFields(r.StreamID, r.Epoch, r.BaseOffset, r.Count, int64(len(r.Payload)))
}

func checkFields(stream, epoch, base int64, count int32, payloadLen int64) error {
	switch {
	case stream < 0:
		return fmt.Errorf("stream id %d is negative: %w", stream, ErrInvalidRecord)
	case epoch < 0:
		return fmt.Errorf("stream %d: epoch %d is negative: %w", stream, epoch, ErrInvalidRecord)
	case base < 0:
		return fmt.Errorf("stream %d: base offset %d is negative: %w", stream, base, ErrInvalidRecord)
	case count <= 0:
		return fmt.Errorf("stream %d offset %d: count %d, expected at least 1: %w", stream, base, count, ErrInvalidRecord)
	case base > math.MaxInt64-int64(count):
		return fmt.Errorf("stream %d offset %d: count %d runs past 2^63: %w", stream, base, count, ErrInvalidRecord)
	case payloadLen > MaxPayload:
		return fmt.Errorf("stream %d offset %d: payload of %d bytes, at most %d fit a block: %w", stream, base, payloadLen, MaxPayload, ErrInvalidRecord)
	}
	return nil
}

// DecodeRecord parses one encoded record that fills body exactly (a WAL
// record body, for example). The payload aliases body. It returns
// ErrInvalidRecord when body is not one well-formed record.
func DecodeRecord(body []byte) (Record, error) {
	if len(body) < RecordHeaderSize {
		return Record{}, fmt.Errorf("encoded record of %d bytes, expected at least %d: %w", len(body), RecordHeaderSize, ErrInvalidRecord)
	}
	if body[0] != RecordMagic {
		return Record{}, fmt.Errorf("encoded record magic %#02x, expected %#02x: %w", body[0], RecordMagic, ErrInvalidRecord)
	}
	r := decodeHeader(body)
	if n := int64(int32(be.Uint32(body[29:]))); n != int64(len(body)-RecordHeaderSize) {
		return Record{}, fmt.Errorf("stream %d offset %d: payload length field %d, the record holds %d bytes: %w", r.StreamID, r.BaseOffset, n, len(body)-RecordHeaderSize, ErrInvalidRecord)
	}
	r.Payload = body[RecordHeaderSize:]
	if err := r.check(); err != nil {
		return Record{}, err
	}
	return r, nil
}

// decodeHeader reads the fixed fields of an encoded record (not the
// payload); p holds at least RecordHeaderSize bytes.
func decodeHeader(p []byte) Record {
	return Record{
		StreamID:   int64(be.Uint64(p[1:])),
		Epoch:      int64(be.Uint64(p[9:])),
		BaseOffset: int64(be.Uint64(p[17:])),
		Count:      int32(be.Uint32(p[25:])),
	}
}

// RecordFromWAL converts a batch read from an AutoMQ block WAL. The payload
// is shared, not copied. AutoMQ's ids are signed: a stream id, epoch or
// offset at or above 2^63, or a count above 2^31-1, is refused with
// ErrInvalidRecord.
func RecordFromWAL(b wal.Batch) (Record, error) {
	if b.StreamID > math.MaxInt64 || b.Epoch > math.MaxInt64 || b.BaseOffset > math.MaxInt64 || b.Count > math.MaxInt32 {
		return Record{}, fmt.Errorf("WAL batch stream %d epoch %d offset %d count %d does not fit AutoMQ's signed fields: %w", b.StreamID, b.Epoch, b.BaseOffset, b.Count, ErrInvalidRecord)
	}
	r := Record{StreamID: int64(b.StreamID), Epoch: int64(b.Epoch), BaseOffset: int64(b.BaseOffset), Count: int32(b.Count), Payload: b.Payload}
	if err := r.check(); err != nil {
		return Record{}, err
	}
	return r, nil
}

// BlockIndex is one index entry: where a data block is and which offsets of
// which stream it holds (AutoMQ's DataBlockIndex).
type BlockIndex struct {
	// StreamID is the stream of every record in the block.
	StreamID int64 `json:"stream_id"`
	// StartOffset is the base offset of the block's first record.
	StartOffset int64 `json:"start_offset"`
	// EndOffsetDelta is the block's end offset minus StartOffset.
	EndOffsetDelta int32 `json:"end_offset_delta"`
	// RecordCount is the number of records in the block.
	RecordCount int32 `json:"record_count"`
	// Position is the block's byte offset in the object.
	Position int64 `json:"position"`
	// Size is the block's size in bytes, its 10-byte header included.
	Size int32 `json:"size"`
}

// EndOffset is one past the last offset of the block's records.
func (b BlockIndex) EndOffset() int64 { return b.StartOffset + int64(b.EndOffsetDelta) }

// End is the byte offset just past the block.
func (b BlockIndex) End() int64 { return b.Position + int64(b.Size) }

func (b *BlockIndex) put(p []byte) {
	be.PutUint64(p[0:], uint64(b.StreamID))
	be.PutUint64(p[8:], uint64(b.StartOffset))
	be.PutUint32(p[16:], uint32(b.EndOffsetDelta))
	be.PutUint32(p[20:], uint32(b.RecordCount))
	be.PutUint64(p[24:], uint64(b.Position))
	be.PutUint32(p[32:], uint32(b.Size))
}

func getBlockIndex(p []byte) BlockIndex {
	return BlockIndex{
		StreamID:       int64(be.Uint64(p[0:])),
		StartOffset:    int64(be.Uint64(p[8:])),
		EndOffsetDelta: int32(be.Uint32(p[16:])),
		RecordCount:    int32(be.Uint32(p[20:])),
		Position:       int64(be.Uint64(p[24:])),
		Size:           int32(be.Uint32(p[32:])),
	}
}

// StreamRange is the part of one stream an object holds (AutoMQ's
// ObjectStreamRange as ObjectWriter.getStreamRanges reports it).
type StreamRange struct {
	// StreamID identifies the stream.
	StreamID int64 `json:"stream_id"`
	// Epoch is the epoch of the stream's first record in the object.
	Epoch int64 `json:"epoch"`
	// StartOffset is the base offset of the stream's first record.
	StartOffset int64 `json:"start_offset"`
	// EndOffset is one past the stream's last offset in the object.
	EndOffset int64 `json:"end_offset"`
}

// Layout says where everything is in a written (or planned) object.
type Layout struct {
	// Size is the object's size in bytes.
	Size int64 `json:"size"`
	// IndexPosition is the index's byte offset, the total size of the data
	// blocks.
	IndexPosition int64 `json:"index_position"`
	// IndexSize is the index's size in bytes, 36 per block.
	IndexSize int64 `json:"index_size"`
	// Index has one entry per data block, in object order.
	Index []BlockIndex `json:"index"`
	// Ranges has one entry per stream, in object order.
	Ranges []StreamRange `json:"stream_ranges"`
}

// putFooter writes the footer of an object whose index is at pos and
// holds size bytes.
func putFooter(p []byte, pos int64, size int32) {
	clear(p[:FooterSize])
	be.PutUint64(p[0:], uint64(pos))
	be.PutUint32(p[8:], uint32(size))
	be.PutUint64(p[40:], FooterMagic)
}
