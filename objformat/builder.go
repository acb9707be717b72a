package objformat

import (
	"bytes"
	"fmt"
	"io"
	"sort"

	"walden/wal"
)

// Builder collects the batches of one object. Batches of a stream must be
// added in offset order, each starting at the previous batch's end offset;
// streams may be interleaved. The Builder keeps references to the payloads
// (it does not copy them) until the object is written.
//
// A Builder is not safe for concurrent use.
type Builder struct {
	streams map[uint64]*streamBuf
}

type streamBuf struct {
	epoch   uint64
	start   uint64
	end     uint64
	bytes   uint64
	batches []wal.Batch
}

// NewBuilder returns an empty Builder.
func NewBuilder() *Builder {
	return &Builder{streams: make(map[uint64]*streamBuf)}
}

// Add appends a batch to its stream's section. It returns ErrOutOfOrder when
// the stream already has batches and b does not start at their end offset,
// ErrEpochMismatch when b's epoch differs from the stream's first batch, and
// ErrInvalidBatch for a batch without offsets or with an oversized payload.
// A refused batch leaves the Builder unchanged.
func (b *Builder) Add(batch wal.Batch) error {
	if batch.Count == 0 {
		return fmt.Errorf("objformat: stream %d offset %d: count 0: %w", batch.StreamID, batch.BaseOffset, ErrInvalidBatch)
	}
	if len(batch.Payload) > MaxPayload {
		return fmt.Errorf("objformat: stream %d offset %d: payload of %d bytes: %w", batch.StreamID, batch.BaseOffset, len(batch.Payload), ErrInvalidBatch)
	}
	if batch.EndOffset() < batch.BaseOffset {
		return fmt.Errorf("objformat: stream %d offset %d: offsets overflow: %w", batch.StreamID, batch.BaseOffset, ErrInvalidBatch)
	}
	s, ok := b.streams[batch.StreamID]
	if !ok {
		s = &streamBuf{epoch: batch.Epoch, start: batch.BaseOffset, end: batch.BaseOffset}
		b.streams[batch.StreamID] = s
	} else {
		if batch.BaseOffset != s.end {
			return fmt.Errorf("objformat: stream %d: batch at offset %d, stream ends at %d: %w", batch.StreamID, batch.BaseOffset, s.end, ErrOutOfOrder)
		}
		if batch.Epoch != s.epoch {
			return fmt.Errorf("objformat: stream %d offset %d: epoch %d, stream epoch %d: %w", batch.StreamID, batch.BaseOffset, batch.Epoch, s.epoch, ErrEpochMismatch)
		}
	}
	s.batches = append(s.batches, batch)
	s.end = batch.EndOffset()
	s.bytes += uint64(BatchHeaderSize + len(batch.Payload))
	return nil
}

// Len returns the number of batches added.
func (b *Builder) Len() int {
	n := 0
	for _, s := range b.streams {
		n += len(s.batches)
	}
	return n
}

// EndOffset returns the end offset of a stream's batches so far, and
// whether the stream has any.
func (b *Builder) EndOffset(streamID uint64) (uint64, bool) {
	s, ok := b.streams[streamID]
	if !ok {
		return 0, false
	}
	return s.end, true
}

func (b *Builder) streamIDs() []uint64 {
	ids := make([]uint64, 0, len(b.streams))
	for id := range b.streams {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// Index returns the index the object will have: one entry per stream in
// ascending stream id, with positions, lengths and section checksums. It
// computes the checksums over the payloads, so it costs one pass over the
// data.
func (b *Builder) Index() (*Index, error) {
	if len(b.streams) == 0 {
		return nil, fmt.Errorf("objformat: %w", ErrEmpty)
	}
	ix := &Index{Version: Version}
	pos := uint64(HeaderSize)
	var hdr [BatchHeaderSize]byte
	for _, id := range b.streamIDs() {
		s := b.streams[id]
		var crc uint32
		for _, bt := range s.batches {
			encodeBatchHeader(hdr[:], bt)
			crc = crcUpdate(crc, hdr[:])
			crc = crcUpdate(crc, bt.Payload)
		}
		ix.Entries = append(ix.Entries, IndexEntry{
			StreamID:    id,
			StreamEpoch: s.epoch,
			StartOffset: s.start,
			EndOffset:   s.end,
			Position:    pos,
			Length:      s.bytes,
			BatchCount:  uint32(len(s.batches)),
			CRC32C:      crc,
		})
		pos += s.bytes
	}
	ix.Size = int64(pos) + IndexHeaderSize + int64(len(ix.Entries))*IndexEntrySize + FooterSize
	return ix, nil
}

// Size returns the object's total size in bytes, without computing
// checksums.
func (b *Builder) Size() int64 {
	size := int64(HeaderSize + IndexHeaderSize + FooterSize)
	for _, s := range b.streams {
		size += int64(s.bytes) + IndexEntrySize
	}
	return size
}

func encodeBatchHeader(b []byte, bt wal.Batch) {
	be.PutUint64(b[0:], bt.BaseOffset)
	be.PutUint32(b[8:], bt.Count)
	be.PutUint32(b[12:], uint32(len(bt.Payload)))
}

// WriteTo writes the object to w and returns the number of bytes written,
// which equals Size on success. It implements io.WriterTo.
func (b *Builder) WriteTo(w io.Writer) (int64, error) {
	_, n, err := b.writeTo(w)
	return n, err
}

func (b *Builder) writeTo(w io.Writer) (*Index, int64, error) {
	ix, err := b.Index()
	if err != nil {
		return nil, 0, err
	}
	cw := &countWriter{w: w}
	var hdr [HeaderSize]byte
	encodeHeader(hdr[:])
	cw.write(hdr[:])
	var bh [BatchHeaderSize]byte
	for _, e := range ix.Entries {
		for _, bt := range b.streams[e.StreamID].batches {
			encodeBatchHeader(bh[:], bt)
			cw.write(bh[:])
			cw.write(bt.Payload)
		}
	}
	indexPos := uint64(cw.n)
	index := make([]byte, IndexHeaderSize+len(ix.Entries)*IndexEntrySize)
	be.PutUint32(index[0:], uint32(len(ix.Entries)))
	for i, e := range ix.Entries {
		encodeIndexEntry(index[IndexHeaderSize+i*IndexEntrySize:], e)
	}
	cw.write(index)
	var footer [FooterSize]byte
	encodeFooter(footer[:], indexPos, uint64(len(index)), CRC32C(index))
	cw.write(footer[:])
	if cw.err != nil {
		return nil, cw.n, fmt.Errorf("objformat: write object: %w", cw.err)
	}
	return ix, cw.n, nil
}

// Build returns the encoded object and its index.
func (b *Builder) Build() ([]byte, *Index, error) {
	var buf bytes.Buffer
	buf.Grow(int(b.Size()))
	ix, _, err := b.writeTo(&buf)
	if err != nil {
		return nil, nil, err
	}
	return buf.Bytes(), ix, nil
}

type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) write(p []byte) {
	if c.err != nil || len(p) == 0 {
		return
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
}
