package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
)

// The raft log on disk is a directory of segment files, <data_dir>/raftlog/
// <seq>.seg, each a run of frames. A frame is what one write adds: the
// records of one Ready (entries, HardState, a snapshot's position) or of one
// snapshot or compaction, written with one write and made durable with one
// fdatasync. Segments are allocated at their full size when created, so an
// append changes no file size and the fdatasync flushes data only.
//
// Frame layout (integers big-endian), 8-byte aligned in the file:
//
//	magic u32 | payload length u32 | frame sequence u64 | payload CRC-32C u32 | header CRC-32C u32
//	payload: records, each type u8 | length uvarint | bytes; zero padding to 8 bytes
//
// Frame sequence numbers run on without a gap across segments. The first
// frame of a segment starts with a segment record; the first segment on
// disk starts with a checkpoint (the log's base and, in the same frame, every
// entry and the HardState), so that segments before it can be deleted.
const (
	logDirName       = "raftlog"
	segmentSuffix    = ".seg"
	segmentTmpSuffix = ".seg.tmp"

	defaultSegmentSize int64 = 64 << 20

	frameMagic      uint32 = 0x574c4f47 // "WLOG"
	frameHeaderSize        = 24
	frameAlign             = 8
	// sectorSize is the unit a disk writes whole or not at all: a frame
	// whose write was cut by a crash has a sector-aligned run of zeros.
	sectorSize = 512
	// maxFramePayload bounds a frame (and so what a damaged length field can
	// make the reader allocate).
	maxFramePayload = 1 << 30

	// segmentFormat is the layout version in every segment record.
	segmentFormat = 1
)

// Record types inside a frame's payload.
const (
	// recSegment opens a segment: format, segment sequence, raft id.
	recSegment byte = 1
	// recCheckpoint restarts the log: offset, offset term, snapshot index,
	// snapshot term. The entries and HardState of the same frame follow.
	recCheckpoint byte = 2
	// recEntry is a marshaled raftpb.Entry.
	recEntry byte = 3
	// recHardState is a marshaled raftpb.HardState.
	recHardState byte = 4
	// recSnapshot installs a snapshot received from the leader (index,
	// term): the log is cut at it (see logImage.applySnapshot).
	recSnapshot byte = 5
	// recSnapshotTaken records a snapshot of the local state machine
	// (index, term); the log is unchanged.
	recSnapshotTaken byte = 6
	// recCompact discards the entries up to an index (index, term).
	recCompact byte = 7
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func segmentName(seq uint64) string { return fmt.Sprintf("%016x%s", seq, segmentSuffix) }

// parseSegmentName returns the sequence number of a segment file name.
func parseSegmentName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, segmentSuffix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	seq, err := strconv.ParseUint(hex, 16, 64)
	return seq, err == nil && seq > 0
}

func alignFrame(n int64) int64 { return (n + frameAlign - 1) &^ (frameAlign - 1) }

// frameBuf builds one frame: the header is filled in by seal.
type frameBuf struct{ b []byte }

func (f *frameBuf) reset() {
	if cap(f.b) < frameHeaderSize {
		f.b = make([]byte, frameHeaderSize, 64<<10)
	}
	f.b = f.b[:frameHeaderSize]
	clear(f.b)
}

// records reports whether anything was added since reset.
func (f *frameBuf) records() bool { return len(f.b) > frameHeaderSize }

// addUint64s adds a record of fixed-size integers.
func (f *frameBuf) addUint64s(typ byte, vals ...uint64) {
	f.b = append(f.b, typ)
	f.b = binary.AppendUvarint(f.b, uint64(8*len(vals)))
	for _, v := range vals {
		f.b = binary.BigEndian.AppendUint64(f.b, v)
	}
}

// addProto adds a record holding m marshaled.
func (f *frameBuf) addProto(typ byte, m proto.Message) error {
	size := proto.Size(m)
	f.b = append(f.b, typ)
	f.b = binary.AppendUvarint(f.b, uint64(size))
	var err error
	f.b, err = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(f.b, m)
	if err != nil {
		return fmt.Errorf("raftlog: encode log record %d: %w", typ, err)
	}
	return nil
}

// sealedLen is the frame's length on disk once sealed.
func (f *frameBuf) sealedLen() int64 { return alignFrame(int64(len(f.b))) }

// seal pads the payload and writes the header for frame number seq; the
// frame is then f.b.
func (f *frameBuf) seal(seq uint64) []byte {
	payloadLen := len(f.b) - frameHeaderSize
	for len(f.b)%frameAlign != 0 {
		f.b = append(f.b, 0)
	}
	h := f.b[:frameHeaderSize]
	binary.BigEndian.PutUint32(h[0:], frameMagic)
	binary.BigEndian.PutUint32(h[4:], uint32(payloadLen))
	binary.BigEndian.PutUint64(h[8:], seq)
	binary.BigEndian.PutUint32(h[16:], crc32.Checksum(f.b[frameHeaderSize:frameHeaderSize+payloadLen], castagnoli))
	binary.BigEndian.PutUint32(h[20:], crc32.Checksum(h[:20], castagnoli))
	return f.b
}

// frameHeader is a decoded frame header.
type frameHeader struct {
	length uint32
	seq    uint64
	crc    uint32
}

// parseFrameHeader decodes h; ok is false unless the magic and the header's
// own checksum are right.
func parseFrameHeader(h []byte) (frameHeader, bool) {
	if binary.BigEndian.Uint32(h[0:]) != frameMagic || binary.BigEndian.Uint32(h[20:]) != crc32.Checksum(h[:20], castagnoli) {
		return frameHeader{}, false
	}
	return frameHeader{length: binary.BigEndian.Uint32(h[4:]), seq: binary.BigEndian.Uint64(h[8:]), crc: binary.BigEndian.Uint32(h[16:])}, true
}

// logRecord is one record of a frame's payload; data refers to the payload.
type logRecord struct {
	typ  byte
	data []byte
}

// parseRecords splits a frame's payload into records.
func parseRecords(payload []byte, out []logRecord) ([]logRecord, error) {
	out = out[:0]
	for pos := 0; pos < len(payload); {
		typ := payload[pos]
		n, k := binary.Uvarint(payload[pos+1:])
		if k <= 0 || n > uint64(len(payload)-pos-1-k) {
			return out, fmt.Errorf("record at payload byte %d has a bad length", pos)
		}
		start := pos + 1 + k
		out = append(out, logRecord{typ: typ, data: payload[start : start+int(n)]})
		pos = start + int(n)
	}
	return out, nil
}

// uint64s decodes a record of n fixed-size integers.
func (r logRecord) uint64s(n int) ([]uint64, error) {
	if len(r.data) != 8*n {
		return nil, fmt.Errorf("record of type %d is %d bytes, expected %d", r.typ, len(r.data), 8*n)
	}
	vals := make([]uint64, n)
	for i := range vals {
		vals[i] = binary.BigEndian.Uint64(r.data[8*i:])
	}
	return vals, nil
}

// segmentReader reads a segment file through a window, so that the many
// small frames of a segment take few reads.
type segmentReader struct {
	f      storageFile
	size   int64
	buf    []byte
	bufOff int64
}

const segmentReadWindow = 1 << 20

// at returns the n bytes at off (off+n <= size), valid until the next call.
func (r *segmentReader) at(off int64, n int) ([]byte, error) {
	if off >= r.bufOff && off+int64(n) <= r.bufOff+int64(len(r.buf)) {
		return r.buf[off-r.bufOff : off-r.bufOff+int64(n)], nil
	}
	want := max(n, segmentReadWindow)
	want = int(min(int64(want), r.size-off))
	if cap(r.buf) < want {
		r.buf = make([]byte, want)
	}
	r.buf = r.buf[:want]
	got, err := r.f.ReadAt(r.buf, off)
	if got < want {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		r.buf = r.buf[:0]
		return nil, err
	}
	r.bufOff = off
	return r.buf[:n], nil
}

// segmentScan is what reading one segment found.
type segmentScan struct {
	// end is where the complete frames end: the next frame goes there.
	end int64
	// tornEnd > end marks [end, tornEnd) as an unfinished write (last
	// segment only) that is discarded.
	tornEnd int64
	// nextSeq is the sequence number the next frame must have.
	nextSeq uint64
}

// scanSegment reads the frames of one segment in order and hands each
// payload to visit. wantSeq is the sequence number of its first frame (0:
// any, for the first segment on disk). After the last complete frame the
// file must hold zeros; in the last segment it may instead hold an
// unfinished write (see tornWrite). Anything else is damage, reported with
// the file and the offset.
func scanSegment(r *segmentReader, wantSeq uint64, last bool, visit func(off int64, payload []byte) error) (segmentScan, error) {
	var off int64
	for off+frameHeaderSize <= r.size {
		hdr, err := r.at(off, frameHeaderSize)
		if err != nil {
			return segmentScan{}, fmt.Errorf("read at offset %d: %w", off, err)
		}
		h, ok := parseFrameHeader(hdr)
		if !ok || (wantSeq != 0 && h.seq != wantSeq) || h.length > maxFramePayload ||
			off+alignFrame(frameHeaderSize+int64(h.length)) > r.size {
			break
		}
		frameLen := alignFrame(frameHeaderSize + int64(h.length))
		frame, err := r.at(off, int(frameLen))
		if err != nil {
			return segmentScan{}, fmt.Errorf("read at offset %d: %w", off, err)
		}
		payload := frame[frameHeaderSize : frameHeaderSize+int(h.length)]
		if crc32.Checksum(payload, castagnoli) != h.crc || !allZero(frame[frameHeaderSize+int(h.length):]) {
			break
		}
		if err := visit(off, payload); err != nil {
			return segmentScan{}, fmt.Errorf("frame %d at offset %d: %w", h.seq, off, err)
		}
		wantSeq = h.seq + 1
		off += frameLen
	}
	scan := segmentScan{end: off, tornEnd: off, nextSeq: wantSeq}
	lastNonZero, err := lastNonZeroByte(r, off)
	if err != nil {
		return segmentScan{}, err
	}
	if lastNonZero < 0 {
		return scan, nil // a clean end
	}
	if !last {
		return segmentScan{}, fmt.Errorf("unreadable data at offset %d, after the last complete frame of a segment that is not the last", off)
	}
	// Frames are written one after the other, each synced before the
	// next: a complete frame after unreadable data proves that data was
	// once synced, so it is damage.
	if at, err := findValidFrame(r, off+frameAlign, lastNonZero); err != nil {
		return segmentScan{}, err
	} else if at >= 0 {
		return segmentScan{}, fmt.Errorf("unreadable data at offset %d is followed by a complete frame at offset %d", off, at)
	}
	if why, err := tornWrite(r, off, wantSeq); err != nil {
		return segmentScan{}, err
	} else if why != "" {
		return segmentScan{}, fmt.Errorf("damaged frame at offset %d: %s", off, why)
	}
	scan.tornEnd = lastNonZero + 1
	return scan, nil
}

// tornWrite decides whether the unreadable frame at off is the remains of a
// write a crash cut short (why == "") or damage (why says what is wrong).
// A write cut short has sectors that never reached the disk, which read as
// zeros: a header of zeros, a header split across sectors with one part
// zero, or a complete header whose payload has a zero sector where the
// checksum fails. A header in one sector that is neither zero nor valid, a
// valid header that does not fit the file or is out of sequence, or a
// payload with no zero sector and a bad checksum is damage.
func tornWrite(r *segmentReader, off int64, wantSeq uint64) (why string, err error) {
	n := int(min(frameHeaderSize, r.size-off))
	hdr, err := r.at(off, n)
	if err != nil {
		return "", fmt.Errorf("read at offset %d: %w", off, err)
	}
	hdr = bytes.Clone(hdr)
	if allZero(hdr) {
		return "", nil
	}
	if n < frameHeaderSize {
		return "a partial frame header at the end of the file", nil
	}
	h, ok := parseFrameHeader(hdr)
	if !ok {
		if cut := sectorSize - off%sectorSize; cut < frameHeaderSize && (allZero(hdr[:cut]) || allZero(hdr[cut:])) {
			return "", nil
		}
		return "the frame header's checksum does not match", nil
	}
	if wantSeq != 0 && h.seq != wantSeq {
		return fmt.Sprintf("frame sequence %d where %d was expected", h.seq, wantSeq), nil
	}
	end := off + alignFrame(frameHeaderSize+int64(h.length))
	if h.length > maxFramePayload || end > r.size {
		return fmt.Sprintf("frame length %d runs past the end of the file", h.length), nil
	}
	for s := off + frameHeaderSize; s < end; {
		next := min(end, (s/sectorSize+1)*sectorSize)
		part, err := r.at(s, int(next-s))
		if err != nil {
			return "", fmt.Errorf("read at offset %d: %w", s, err)
		}
		if allZero(part) {
			return "", nil
		}
		s = next
	}
	return "the frame's checksum does not match", nil
}

// findValidFrame returns the offset of the first complete frame (magic,
// header and payload checksums) at an aligned offset in [from, upTo], or -1.
func findValidFrame(r *segmentReader, from, upTo int64) (int64, error) {
	var magic [4]byte
	binary.BigEndian.PutUint32(magic[:], frameMagic)
	for off := alignFrame(from); off <= upTo && off+frameHeaderSize <= r.size; off += frameAlign {
		b, err := r.at(off, 4)
		if err != nil {
			return -1, fmt.Errorf("read at offset %d: %w", off, err)
		}
		if !bytes.Equal(b, magic[:]) {
			continue
		}
		hdr, err := r.at(off, frameHeaderSize)
		if err != nil {
			return -1, fmt.Errorf("read at offset %d: %w", off, err)
		}
		h, ok := parseFrameHeader(hdr)
		if !ok || h.length > maxFramePayload || off+alignFrame(frameHeaderSize+int64(h.length)) > r.size {
			continue
		}
		payload, err := r.at(off+frameHeaderSize, int(h.length))
		if err != nil {
			return -1, fmt.Errorf("read at offset %d: %w", off, err)
		}
		if crc32.Checksum(payload, castagnoli) == h.crc {
			return off, nil
		}
	}
	return -1, nil
}

// lastNonZeroByte returns the offset of the last byte at or after from that
// is not zero, or -1.
func lastNonZeroByte(r *segmentReader, from int64) (int64, error) {
	found := int64(-1)
	for off := from; off < r.size; {
		n := int(min(segmentReadWindow, r.size-off))
		b, err := r.at(off, n)
		if err != nil {
			return -1, fmt.Errorf("read at offset %d: %w", off, err)
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != 0 {
				found = off + int64(i)
				break
			}
		}
		off += int64(n)
	}
	return found, nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// segmentWriter appends frames to the last segment and opens new segments.
// One goroutine at a time uses it (the storage's writer lock).
type segmentWriter struct {
	fs      storageFS
	dir     string
	raftID  uint64
	segSize int64
	noSync  bool
	// point marks a step that a crash may interrupt (tests); never nil.
	point func(string)
	// recordLast records in raft.db that segment seq exists, once it is
	// durable, so that a lost newest segment is noticed at start.
	recordLast func(seq uint64) error

	firstSeq uint64 // oldest segment on disk
	tailSeq  uint64 // segment being appended to (0: none yet)
	tail     storageFile
	tailSize int64
	off      int64  // where the next frame goes in tail
	frameSeq uint64 // sequence number of the next frame
	buf      frameBuf
}

func (w *segmentWriter) path(seq uint64) string { return filepath.Join(w.dir, segmentName(seq)) }

// frame returns the frame buffer, emptied, for the next write.
func (w *segmentWriter) frame() *frameBuf {
	w.buf.reset()
	return &w.buf
}

// write appends the frame built in w.buf and makes it durable (one write,
// one fdatasync), opening a new segment first when it does not fit.
func (w *segmentWriter) write() error {
	if w.off+w.buf.sealedLen() > w.tailSize {
		if err := w.cut(nil, w.buf.sealedLen()); err != nil {
			return err
		}
	}
	frame := w.buf.seal(w.frameSeq)
	if _, err := w.tail.WriteAt(frame, w.off); err != nil {
		return fmt.Errorf("write %s at offset %d: %w", w.path(w.tailSeq), w.off, err)
	}
	w.point("log write")
	if !w.noSync {
		if err := w.tail.Datasync(); err != nil {
			return fmt.Errorf("sync %s: %w", w.path(w.tailSeq), err)
		}
	}
	w.point("log sync")
	w.off += int64(len(frame))
	w.frameSeq++
	return nil
}

// cut opens segment tailSeq+1 and makes it the tail. Its first frame holds
// the segment record and what fill adds (a checkpoint; nil: nothing); room
// is the size of the next frame, which must fit after it. The segment is
// built as a .tmp file, synced, renamed and the directory synced, then
// recorded in raft.db.
func (w *segmentWriter) cut(fill func(*frameBuf) error, room int64) error {
	seq := w.tailSeq + 1
	var fb frameBuf
	fb.reset()
	fb.addUint64s(recSegment, segmentFormat, seq, w.raftID)
	if fill != nil {
		if err := fill(&fb); err != nil {
			return err
		}
	}
	size := max(w.segSize, alignFrame(fb.sealedLen()+room+frameHeaderSize))
	frame := fb.seal(w.frameSeq)
	name, tmp := w.path(seq), w.path(seq)+".tmp"
	_ = w.fs.Remove(tmp) // a leftover of an interrupted cut
	f, err := w.fs.Create(tmp, size)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	w.point("segment create")
	fail := func(err error) error {
		_ = f.Close()
		return err
	}
	if _, err := f.WriteAt(frame, 0); err != nil {
		return fail(fmt.Errorf("write %s: %w", tmp, err))
	}
	w.point("segment write")
	if !w.noSync {
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("sync %s: %w", tmp, err))
		}
	}
	w.point("segment sync")
	if err := w.fs.Rename(tmp, name); err != nil {
		return fail(fmt.Errorf("rename %s: %w", tmp, err))
	}
	w.point("segment rename")
	if !w.noSync {
		if err := w.fs.SyncDir(w.dir); err != nil {
			return fail(fmt.Errorf("sync directory %s: %w", w.dir, err))
		}
	}
	w.point("log dir sync")
	if err := w.recordLast(seq); err != nil {
		return fail(err)
	}
	w.point("segment recorded")
	if w.tail != nil {
		_ = w.tail.Close()
	}
	if w.firstSeq == 0 {
		w.firstSeq = seq
	}
	w.tail, w.tailSeq, w.tailSize, w.off = f, seq, size, int64(len(frame))
	w.frameSeq++
	return nil
}

// checkpoint opens a new segment that starts with a checkpoint written by
// fill (the whole live log), then deletes every older segment: nothing in
// them is needed any more.
func (w *segmentWriter) checkpoint(fill func(*frameBuf) error) error {
	if err := w.cut(fill, 0); err != nil {
		return err
	}
	for seq := w.firstSeq; seq < w.tailSeq; seq++ {
		if err := w.fs.Remove(w.path(seq)); err != nil {
			return fmt.Errorf("remove %s: %w", w.path(seq), err)
		}
		w.point("segment remove")
	}
	if !w.noSync {
		if err := w.fs.SyncDir(w.dir); err != nil {
			return fmt.Errorf("sync directory %s: %w", w.dir, err)
		}
	}
	w.point("log dir sync")
	w.firstSeq = w.tailSeq
	return nil
}

func (w *segmentWriter) close() error {
	if w.tail == nil {
		return nil
	}
	err := w.tail.Close()
	w.tail = nil
	return err
}
