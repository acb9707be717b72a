package object

import (
	"fmt"
	"math"
)

// Limits of the 32-bit fields: a block's size (index entry, block header)
// and the index's size (footer). A layout holds them (tests lower its own).
const (
	maxBlockSize int64 = math.MaxInt32
	maxBlocks          = math.MaxInt32 / IndexEntrySize
)

// layout is the state AutoMQ's ObjectWriter keeps between write calls, and
// everything needed to write the index and footer: the Writer and the
// Planner share it, so that a plan is the object a Writer writes.
type layout struct {
	blockSize int64
	// maxBlockSize and maxBlocks are the limits of the 32-bit fields.
	maxBlockSize int64
	maxBlocks    int
	// pending is the running total of payload bytes since the last block
	// was closed by the threshold. AutoMQ does not reset it when a call
	// ends (the call's open block is closed anyway), so the next stream's
	// first block closes early.
	pending int64
	// started is set by the first call that had records; lastStream and
	// lastEnd are that call's and every later call's stream and end offset.
	started    bool
	lastStream int64
	lastEnd    int64
	// dataSize is the total size of the blocks so far: the next block's
	// position and, at the end, the index position.
	dataSize int64
	index    []BlockIndex
	ranges   []StreamRange
	// spans is scratch for one call's blocks.
	spans []span
}

// span is one data block of a call: records [first, first+n) of the call.
type span struct {
	first, n int
	entry    BlockIndex
	epoch    int64
}

// recordMeta is what the layout needs of a record.
type recordMeta struct {
	stream, epoch, base int64
	count               int32
	payloadLen          int64
}

func newLayout(blockSize int) (layout, error) {
	if blockSize <= 0 {
		return layout{}, fmt.Errorf("automq object: block size %d: %w", blockSize, ErrInvalidBlockSize)
	}
	return layout{blockSize: int64(blockSize), maxBlockSize: maxBlockSize, maxBlocks: maxBlocks}, nil
}

// plan checks one write call of n records of stream streamID and cuts them
// into blocks, without changing the layout. It returns the blocks (in
// l.spans) and the running payload total after them. meta returns record
// i's fields, or why the record is not a record.
func (l *layout) plan(streamID int64, n int, meta func(i int) (recordMeta, error)) ([]span, int64, error) {
	spans := l.spans[:0]
	pending := l.pending
	if n == 0 {
		// AutoMQ ignores a call without records, ordering included.
		return spans, pending, nil
	}
	if streamID < 0 {
		return nil, 0, fmt.Errorf("automq object: stream id %d is negative: %w", streamID, ErrInvalidRecord)
	}
	var expected int64 // the offset the next record must start at
	haveExpected := false
	if l.started {
		if streamID < l.lastStream {
			return nil, 0, fmt.Errorf("automq object: stream %d written after stream %d, streams must ascend: %w", streamID, l.lastStream, ErrStreamOrder)
		}
		if streamID == l.lastStream {
			expected, haveExpected = l.lastEnd, true
		}
	}
	var cur span
	open := false
	blocks := len(l.index)
	for i := range n {
		m, err := meta(i)
		if err != nil {
			return nil, 0, fmt.Errorf("automq object: stream %d record %d: %w", streamID, i, err)
		}
		if m.stream != streamID {
			return nil, 0, fmt.Errorf("automq object: record %d of the call for stream %d belongs to stream %d: %w", i, streamID, m.stream, ErrStreamMismatch)
		}
		if err := checkFields(m.stream, m.epoch, m.base, m.count, m.payloadLen); err != nil {
			return nil, 0, fmt.Errorf("automq object: record %d: %w", i, err)
		}
		if haveExpected && m.base < expected {
			return nil, 0, fmt.Errorf("automq object: stream %d: record at offset %d, the stream ends at %d: %w", streamID, m.base, expected, ErrOffsetBackwards)
		}
		if haveExpected && m.base > expected {
			return nil, 0, fmt.Errorf("automq object: stream %d: record at offset %d, the stream ends at %d: %w", streamID, m.base, expected, ErrOffsetGap)
		}
		end := m.base + int64(m.count)
		expected, haveExpected = end, true
		if !open {
			cur = span{first: i, epoch: m.epoch, entry: BlockIndex{StreamID: streamID, StartOffset: m.base}}
			open = true
			blocks++
			if blocks > l.maxBlocks {
				return nil, 0, fmt.Errorf("automq object: more than %d blocks: %w", l.maxBlocks, ErrObjectTooLarge)
			}
		}
		cur.n++
		size := int64(cur.entry.Size) + RecordHeaderSize + m.payloadLen
		if cur.n == 1 {
			size += BlockHeaderSize
		}
		if size > l.maxBlockSize {
			return nil, 0, fmt.Errorf("automq object: stream %d: the block from offset %d would hold %d bytes, more than %d: %w", streamID, cur.entry.StartOffset, size, l.maxBlockSize, ErrBlockTooLarge)
		}
		if end-cur.entry.StartOffset > math.MaxInt32 {
			return nil, 0, fmt.Errorf("automq object: stream %d: the block from offset %d would end at %d, more than 2^31-1 offsets: %w", streamID, cur.entry.StartOffset, end, ErrBlockTooLarge)
		}
		cur.entry.Size = int32(size)
		cur.entry.RecordCount = int32(cur.n)
		cur.entry.EndOffsetDelta = int32(end - cur.entry.StartOffset)
		pending += m.payloadLen
		if pending >= l.blockSize {
			spans = append(spans, cur)
			open = false
			pending = 0
		}
	}
	if open {
		// A block never spans two calls; the running total carries on.
		spans = append(spans, cur)
	}
	l.spans = spans
	return spans, pending, nil
}

// commit applies a call planned by plan.
func (l *layout) commit(spans []span, pending int64) {
	if len(spans) == 0 {
		return
	}
	l.pending = pending
	streamID := spans[0].entry.StreamID
	for _, s := range spans {
		e := s.entry
		e.Position = l.dataSize
		l.dataSize += int64(e.Size)
		l.index = append(l.index, e)
	}
	last := spans[len(spans)-1].entry
	end := last.EndOffset()
	if k := len(l.ranges) - 1; k >= 0 && l.ranges[k].StreamID == streamID {
		l.ranges[k].EndOffset = end
	} else {
		l.ranges = append(l.ranges, StreamRange{StreamID: streamID, Epoch: spans[0].epoch, StartOffset: spans[0].entry.StartOffset, EndOffset: end})
	}
	l.started, l.lastStream, l.lastEnd = true, streamID, end
}

// size is the object's size if it were closed now.
func (l *layout) size() int64 {
	return l.dataSize + int64(len(l.index))*IndexEntrySize + FooterSize
}

// sizeWith is the object's size if the planned call were committed and the
// object closed.
func (l *layout) sizeWith(spans []span) int64 {
	n := l.size()
	for _, s := range spans {
		n += int64(s.entry.Size) + IndexEntrySize
	}
	return n
}

// result returns a copy of the layout's index and ranges.
func (l *layout) result() Layout {
	return Layout{
		Size:          l.size(),
		IndexPosition: l.dataSize,
		IndexSize:     int64(len(l.index)) * IndexEntrySize,
		Index:         append([]BlockIndex(nil), l.index...),
		Ranges:        append([]StreamRange(nil), l.ranges...),
	}
}

func decodedMeta(records []Record) func(int) (recordMeta, error) {
	return func(i int) (recordMeta, error) {
		r := &records[i]
		return recordMeta{stream: r.StreamID, epoch: r.Epoch, base: r.BaseOffset, count: r.Count, payloadLen: int64(len(r.Payload))}, nil
	}
}

func encodedMeta(records [][]byte) func(int) (recordMeta, error) {
	return func(i int) (recordMeta, error) {
		p := records[i]
		if len(p) < RecordHeaderSize {
			return recordMeta{}, fmt.Errorf("encoded record of %d bytes, expected at least %d: %w", len(p), RecordHeaderSize, ErrInvalidRecord)
		}
		if p[0] != RecordMagic {
			return recordMeta{}, fmt.Errorf("encoded record magic %#02x, expected %#02x: %w", p[0], RecordMagic, ErrInvalidRecord)
		}
		h := decodeHeader(p)
		if n := int64(int32(be.Uint32(p[29:]))); n != int64(len(p)-RecordHeaderSize) {
			return recordMeta{}, fmt.Errorf("offset %d: payload length field %d, the record holds %d bytes: %w", h.BaseOffset, n, len(p)-RecordHeaderSize, ErrInvalidRecord)
		}
		return recordMeta{stream: h.StreamID, epoch: h.Epoch, base: h.BaseOffset, count: h.Count, payloadLen: int64(len(p) - RecordHeaderSize)}, nil
	}
}

// Planner computes an object's exact size, index and stream ranges from the
// same calls a Writer would get, without the bytes: a recovery uses it to
// cut its records into objects below a size bound before it uploads any.
// It applies every rule of the Writer, so a call the Planner accepts the
// Writer accepts too, and the Writer's Layout equals the Planner's. Only the
// payloads' lengths are read. A Planner is not safe for concurrent use.
type Planner struct {
	l layout
}

// NewPlanner returns an empty plan with AutoMQ's block size threshold
// blockSize (s3.object.block.size, DefaultBlockSize by default).
func NewPlanner(blockSize int) (*Planner, error) {
	l, err := newLayout(blockSize)
	if err != nil {
		return nil, err
	}
	return &Planner{l: l}, nil
}

// Write plans one AutoMQ write call: the records of one stream, as
// Writer.Write takes them. A refused call changes nothing.
func (p *Planner) Write(streamID int64, records []Record) error {
	spans, pending, err := p.l.plan(streamID, len(records), decodedMeta(records))
	if err != nil {
		return err
	}
	p.l.commit(spans, pending)
	return nil
}

// WriteEncoded plans one call of encoded records, as Writer.WriteEncoded
// takes them.
func (p *Planner) WriteEncoded(streamID int64, records [][]byte) error {
	spans, pending, err := p.l.plan(streamID, len(records), encodedMeta(records))
	if err != nil {
		return err
	}
	p.l.commit(spans, pending)
	return nil
}

// Size is the size the object would have if it were closed now (48 bytes
// when nothing was written).
func (p *Planner) Size() int64 { return p.l.size() }

// SizeWith is the size the object would have if Write(streamID, records)
// were called and the object closed; it changes nothing. It returns the
// error Write would return.
func (p *Planner) SizeWith(streamID int64, records []Record) (int64, error) {
	spans, _, err := p.l.plan(streamID, len(records), decodedMeta(records))
	if err != nil {
		return 0, err
	}
	return p.l.sizeWith(spans), nil
}

// SizeWithEncoded is SizeWith for encoded records.
func (p *Planner) SizeWithEncoded(streamID int64, records [][]byte) (int64, error) {
	spans, _, err := p.l.plan(streamID, len(records), encodedMeta(records))
	if err != nil {
		return 0, err
	}
	return p.l.sizeWith(spans), nil
}

// Layout returns the object's layout as a Writer given the same calls
// reports it on Close.
func (p *Planner) Layout() Layout { return p.l.result() }
