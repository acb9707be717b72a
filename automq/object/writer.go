package object

import (
	"fmt"
	"io"
)

// Writer writes one object to an io.Writer, as AutoMQ's ObjectWriter lays it
// out from the same calls. Each call gives the records of one stream (see
// Write for the rules); the blocks of a call are written before the call
// returns, so the Writer holds no data, only the index and the stream
// ranges (about 40 bytes per block). Close writes the index and footer.
//
// The Writer writes straight to w: one Write per block header, one per
// encoded record (per decoded record, one for its 33-byte header and one
// for its payload unless empty), and one for the index and footer
// together. Wrap w in a bufio.Writer if small writes are costly for it.
//
// Once w returns an error the Writer is broken: every later call returns
// that error. A Writer is not safe for concurrent use.
type Writer struct {
	w      io.Writer
	l      layout
	err    error
	closed bool
	hdr    [RecordHeaderSize]byte
}

// NewWriter returns a Writer of one object to w with AutoMQ's block size
// threshold blockSize (s3.object.block.size, DefaultBlockSize by default).
func NewWriter(w io.Writer, blockSize int) (*Writer, error) {
	l, err := newLayout(blockSize)
	if err != nil {
		return nil, err
	}
	return &Writer{w: w, l: l}, nil
}

// Write writes one AutoMQ write call: the records of stream streamID, in
// offset order. It follows AutoMQ's rules and refuses what breaks them,
// changing nothing:
//
//   - calls go by ascending stream id (signed); a lower id than the
//     previous call's is ErrStreamOrder. A call without records is ignored,
//     as AutoMQ ignores it;
//   - every record belongs to streamID (ErrStreamMismatch) and has a
//     non-negative stream id, epoch and base offset, a positive count and a
//     payload that fits a block (ErrInvalidRecord);
//   - each record starts where the stream's previous record in the object
//     ended, in this call or an earlier call for the same stream
//     (ErrOffsetBackwards, ErrOffsetGap). AutoMQ only refuses a call that
//     starts below the previous end; walden also refuses gaps, because the
//     stream range of the object would claim offsets it does not hold.
//
// Blocks are cut as AutoMQ cuts them: a running total of payload bytes
// (headers do not count) closes the block once it reaches the block size,
// and goes back to 0; the end of a call closes its open block but leaves the
// total as it is.
//
// The payloads are copied to the io.Writer as they are.
func (w *Writer) Write(streamID int64, records []Record) error {
	if err := w.usable(); err != nil {
		return err
	}
	spans, pending, err := w.l.plan(streamID, len(records), decodedMeta(records))
	if err != nil {
		return err
	}
	w.l.commit(spans, pending)
	for _, s := range spans {
		if err := w.blockHeader(&s.entry); err != nil {
			return err
		}
		for i := s.first; i < s.first+s.n; i++ {
			r := &records[i]
			r.putHeader(w.hdr[:])
			if err := w.write(w.hdr[:]); err != nil {
				return err
			}
			if len(r.Payload) > 0 {
				if err := w.write(r.Payload); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// WriteEncoded is Write for records that are already encoded as AutoMQ's
// stream record batches (magic 0x22, stream id, epoch, base offset, count,
// payload length, payload): the body of an AutoMQ WAL data record is
// exactly that. Each record must fill its slice exactly; its bytes are
// copied to the object without re-encoding. The rules are Write's; an
// encoded record that does not parse is ErrInvalidRecord.
func (w *Writer) WriteEncoded(streamID int64, records [][]byte) error {
	if err := w.usable(); err != nil {
		return err
	}
	spans, pending, err := w.l.plan(streamID, len(records), encodedMeta(records))
	if err != nil {
		return err
	}
	w.l.commit(spans, pending)
	for _, s := range spans {
		if err := w.blockHeader(&s.entry); err != nil {
			return err
		}
		for _, p := range records[s.first : s.first+s.n] {
			if err := w.write(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// Size is the size the object would have if it were closed now.
func (w *Writer) Size() int64 { return w.l.size() }

// Close writes the index and the footer and returns the object's layout:
// its size, the index position and size, the index entries and the stream
// ranges (AutoMQ's getStreamRanges: per stream, the epoch of its first
// record and its start and end offsets). A Writer that received no records
// writes only the 48-byte footer. Close does not close the io.Writer.
func (w *Writer) Close() (Layout, error) {
	if err := w.usable(); err != nil {
		return Layout{}, err
	}
	w.closed = true
	buf := make([]byte, len(w.l.index)*IndexEntrySize+FooterSize)
	for i := range w.l.index {
		w.l.index[i].put(buf[i*IndexEntrySize:])
	}
	n := len(w.l.index) * IndexEntrySize
	putFooter(buf[n:], w.l.dataSize, int32(n))
	if err := w.write(buf); err != nil {
		return Layout{}, err
	}
	return w.l.result(), nil
}

func (w *Writer) usable() error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return ErrClosed
	}
	return nil
}

func (w *Writer) blockHeader(e *BlockIndex) error {
	var h [BlockHeaderSize]byte
	h[0] = BlockMagic
	h[1] = BlockFlag
	be.PutUint32(h[2:], uint32(e.RecordCount))
	be.PutUint32(h[6:], uint32(e.Size-BlockHeaderSize))
	return w.write(h[:])
}

func (w *Writer) write(p []byte) error {
	n, err := w.w.Write(p)
	if err == nil && n != len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		w.err = fmt.Errorf("automq object: write: %w", err)
		return w.err
	}
	return nil
}
