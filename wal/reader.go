package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reasons a scan skips bytes or stops. They are the keys of
// ScanStats.SkippedByReason and the values of ScanStats.EndReason.
const (
	ReasonTrimmedRecord   = "trimmed record"    // the valid record at the trim offset (trimming is inclusive)
	ReasonPadding         = "padding record"    // a padding record running to the end of the device
	ReasonBlockTail       = "block tail"        // no record header right after a record: the rest of its block
	ReasonShortHeader     = "short header read" // fewer than 24 bytes readable
	ReasonRecordMagic     = "bad record magic"  // neither data nor padding magic
	ReasonHeaderCRC       = "record header crc" // header CRC mismatch
	ReasonBodyLength      = "bad body length"   // body length <= 0 or larger than the ring
	ReasonBodyOffset      = "bad body offset"   // body offset is not record start + 24 (stale data)
	ReasonShortBody       = "short body read"   // the body runs past the readable bytes
	ReasonBodyCRC         = "record body crc"   // body CRC mismatch
	ReasonMalformedBody   = "malformed body"    // CRCs match but the batch body does not parse
	ReasonRingBound       = "ring bound"        // the scan covered a whole ring from the trim offset
	ReasonWindow          = "v0 window"         // version 0: past the sliding window after the first invalid record
	reasonNone            = ""
	maxSkips              = 256
	maxV0ExtraAfterLastOK = 1 << 22
)

// defaultReadChunk is how many bytes a Reader reads at a time.
const defaultReadChunk int64 = 1 << 20

// readerOptions are what tests change about a Reader: how many bytes it
// reads at a time (smaller chunks exercise records across chunk
// boundaries).
type readerOptions struct {
	chunk int64
}

// Record is one recovered data record.
type Record struct {
	// Offset is the logical WAL offset of the record start (what Append
	// returned and what Trim takes).
	Offset int64
	// Size is the record's size on disk, header included.
	Size int
	// Batch is the decoded body. The payload of a record returned by
	// Reader.Next is a view, not a copy (see Next for how long it stays
	// valid); Recover and RecoverFile copy it.
	Batch Batch
	// Body is the record's body as written: the encoded stream record batch
	// (magic 0x22, ids, offsets, payload length and payload), whose payload
	// is Batch.Payload. It is a view with the same lifetime as the payload,
	// for readers that copy a record on without encoding it again (AutoMQ's
	// objects hold exactly this encoding).
	Body []byte
}

// Skip is one run of bytes the scan stepped over.
type Skip struct {
	// Offset is the logical offset where the skipped run starts.
	Offset int64
	// Length is the number of logical bytes skipped.
	Length int64
	// Reason is one of the Reason constants.
	Reason string
}

// ScanStats says what a scan skipped and where and why the log ended.
type ScanStats struct {
	// Records is the number of records returned.
	Records int
	// SkippedBytes is the total of all skipped runs, padding and the trimmed
	// record included.
	SkippedBytes int64
	// SkippedByReason splits SkippedBytes by reason.
	SkippedByReason map[string]int64
	// Skips lists the first 256 skipped runs in log order.
	Skips []Skip
	// EndOffset is the logical offset at which the log ended.
	EndOffset int64
	// EndReason says why the log ended there (the failure at an aligned
	// offset, ReasonRingBound or ReasonWindow).
	EndReason string
}

// Reader walks a WAL read-only. Create it with Open or NewReader, call Next
// until io.EOF, then read Stats. It is not safe for concurrent use.
type Reader struct {
	name      string
	r         io.ReaderAt
	file      *os.File
	size      int64
	header    Header
	slot      int
	slotErrs  [HeaderSlots]error
	capacity  int64
	recordCap int64
	crcTab    *headerCRCTables

	// scan state
	next, start, skipAt, bound int64
	afterRecord                bool // next was reached by stepping over a record
	done                       bool
	stats                      ScanStats

	// version 0 window state (RecoverIteratorV0)
	v0FirstInvalidCycle, v0FirstInvalidOffset, v0LastValid int64

	// read buffer: buf holds the device bytes [bufPos, bufPos+bufLen),
	// read chunk bytes at a time
	chunk  int64
	buf    []byte
	bufPos int64
	bufLen int
	big    []byte

	// mapped is Open's read-only mapping of [0, capacity), or nil; ahead
	// tells the prefetch goroutine where the scan is.
	mapped       []byte
	msrc         mappedSource
	ahead        chan int64
	prefetchDone chan struct{}
}

// Open opens the WAL at path read-only (a regular file whose size must equal
// the header's capacity, or a block device at least that large) and reads
// its header.
func Open(path string) (*Reader, error) {
	// What the path is, before it is opened: opening a FIFO would block.
	before, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	if err := checkKind(path, before.Mode()); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fileError(path, "stat", err)
	}
	if !os.SameFile(before, fi) {
		f.Close()
		return nil, fileError(path, "open", errors.New("the file changed while it was opened"))
	}
	var size int64
	exact := true
	switch {
	case fi.Mode().IsRegular():
		size = fi.Size()
	case fi.Mode()&os.ModeDevice != 0:
		exact = false
		size, err = f.Seek(0, io.SeekEnd)
		if err != nil {
			f.Close()
			return nil, fileError(path, "size of device", err)
		}
	default:
		f.Close()
		return nil, fileError(path, "open", fmt.Errorf("%w: not a regular file or block device", ErrNotWAL))
	}
	rd, err := newReader(f, size, path, exact, readerOptions{})
	if err != nil {
		f.Close()
		return nil, err
	}
	rd.file = f
	rd.mapFile()
	return rd, nil
}

// prefetchAhead is how far ahead of the scan a mapped Reader asks the
// kernel to read, in chunks.
const prefetchAhead = 8

// releaseBehind is how far behind the scan a mapped Reader gives its pages
// back (MADV_DONTNEED), in chunks. The pages stay in the page cache (the
// mapping is of a file): a payload still held is mapped again from it on
// its next access, with the same bytes. Without it every page scanned
// counted in the process's memory until Close — the whole WAL's size, on a
// coordinator recovering a 1 GiB WAL.
const releaseBehind = 4

// mapFile maps the WAL read-only so the scan checksums the page cache in
// place instead of copying it, and starts a goroutine that populates the
// mapping a few MiB ahead of the scan so disk reads overlap checksumming.
// Without a mapping the Reader uses ReadAt.
func (rd *Reader) mapFile() {
	m, err := unix.Mmap(int(rd.file.Fd()), 0, int(rd.capacity), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return
	}
	rd.mapped = m
	rd.ahead = make(chan int64, 1)
	rd.msrc = mappedSource{m: m, ahead: rd.ahead, chunk: rd.chunk}
	rd.prefetchDone = make(chan struct{})
	chunk := rd.chunk
	go func() {
		defer close(rd.prefetchDone)
		advice := unix.MADV_POPULATE_READ
		lastLo, lastHi := int64(-1), int64(-1)
		released := int64(-1) // pages below this position, from the scan's start, are given back
		release := func(from, to int64) {
			if to > from {
				_ = unix.Madvise(m[from:to], unix.MADV_DONTNEED)
			}
		}
		for pos := range rd.ahead {
			lo := pos / chunk * chunk
			hi := min(rd.capacity, lo+prefetchAhead*chunk)
			switch keep := lo - releaseBehind*chunk; {
			case released < 0:
				released = lo
			case lo < released: // the scan wrapped around the ring to its start
				release(released, rd.capacity)
				released = 0
			case keep > released:
				release(released, keep)
				released = keep
			}
			for c := lo; c < hi; c += chunk {
				if c >= lastLo && c < lastHi {
					continue // already populated
				}
				if err := unix.Madvise(m[c:min(hi, c+chunk)], advice); errors.Is(err, unix.EINVAL) {
					advice = unix.MADV_WILLNEED // kernels before 5.14
				}
			}
			lastLo, lastHi = lo, hi
		}
	}()
}

// NewReader reads the WAL held by r, a device of size bytes (the header's
// capacity must not exceed size). name appears in errors.
func NewReader(r io.ReaderAt, size int64, name string) (*Reader, error) {
	return newReader(r, size, name, false, readerOptions{})
}

func newReader(r io.ReaderAt, size int64, name string, exact bool, opts readerOptions) (*Reader, error) {
	if opts.chunk <= 0 {
		opts.chunk = defaultReadChunk
	}
	rd := &Reader{name: name, r: r, size: size, chunk: opts.chunk}
	if err := rd.readHeader(); err != nil {
		return nil, err
	}
	h := rd.header
	if h.Capacity%BlockSize != 0 || h.Capacity < MinCapacity || h.Capacity > 1<<62 {
		return nil, fileError(name, "header", fmt.Errorf("%w: %d (must be a multiple of %d and at least %d)", ErrBadCapacity, h.Capacity, BlockSize, MinCapacity))
	}
	if h.TrimOffset > 1<<62 {
		return nil, fileError(name, "header", fmt.Errorf("%w: trim offset %d out of range", ErrBadHeader, h.TrimOffset))
	}
	capacity := int64(h.Capacity)
	if exact && capacity != size {
		return nil, fileError(name, "header", fmt.Errorf("%w: header capacity %d, file size %d", ErrCapacityMismatch, capacity, size))
	}
	if capacity > size {
		return nil, fileError(name, "header", fmt.Errorf("%w: header capacity %d, device size %d", ErrCapacityMismatch, capacity, size))
	}
	rd.capacity = capacity
	rd.crcTab = headerCRC()
	rd.recordCap = capacity - HeaderRegionSize
	rd.start = max(h.TrimOffset, 0)
	rd.skipAt = h.TrimOffset
	rd.next = rd.start
	rd.bound = rd.start + rd.recordCap
	rd.v0FirstInvalidCycle, rd.v0FirstInvalidOffset, rd.v0LastValid = -1, -1, -1
	rd.stats.SkippedByReason = map[string]int64{}
	rd.stats.EndOffset = -1
	return rd, nil
}

// readHeader picks the valid slot with the strictly larger timestamp (slot 0
// on a tie), as AutoMQ's tryReadWALHeader does.
func (rd *Reader) readHeader() error {
	best := -1
	var p [HeaderSize]byte
	for i := 0; i < HeaderSlots; i++ {
		n, err := rd.r.ReadAt(p[:], int64(i)*BlockSize)
		if n < HeaderSize {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			rd.slotErrs[i] = err
			continue
		}
		h, err := decodeHeader(p[:])
		if err != nil {
			rd.slotErrs[i] = err
			continue
		}
		if best < 0 || h.LastWriteTimestamp > rd.header.LastWriteTimestamp {
			best = i
			rd.header = h
		}
	}
	if best >= 0 {
		rd.slot = best
		return nil
	}
	for i, err := range rd.slotErrs {
		if !errors.Is(err, ErrHeaderCRC) && !errors.Is(err, ErrBadMagic) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return fileError(rd.name, fmt.Sprintf("read header slot %d", i), err)
		}
	}
	if errors.Is(rd.slotErrs[0], ErrHeaderCRC) || errors.Is(rd.slotErrs[1], ErrHeaderCRC) {
		return fileError(rd.name, "header", fmt.Errorf("%w (slot 0: %v; slot 1: %v)", ErrHeaderCRC, rd.slotErrs[0], rd.slotErrs[1]))
	}
	return fileError(rd.name, "header", fmt.Errorf("%w (slot 0: %v; slot 1: %v)", ErrNotWAL, rd.slotErrs[0], rd.slotErrs[1]))
}

// Header returns the header of the winning slot.
func (rd *Reader) Header() Header { return rd.header }

// Mapped reports whether the Reader reads through a read-only mapping of
// the WAL (Open maps regular files and devices when the system allows it):
// then the payloads and bodies Next returns stay valid until Close, not
// only until the next call.
func (rd *Reader) Mapped() bool { return rd.mapped != nil }

// Hold prepares bodies returned by Next that the caller keeps and will
// read again, as a whole, after the scan has moved on. A mapped Reader gives
// the pages behind its scan back (releaseBehind), so each page of a kept body
// would be mapped again by a page fault of its own on its next access; Hold
// maps the bodies' pages again in one system call per contiguous range
// (MADV_POPULATE_READ; nothing on kernels before 5.14). A body that is not
// a view of the mapping is left alone. It changes no byte.
func (rd *Reader) Hold(bodies [][]byte) {
	m := rd.mapped
	if m == nil || len(bodies) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	page := int64(os.Getpagesize())
	type span struct{ lo, hi int64 }
	var spans []span
	for _, b := range bodies {
		if len(b) == 0 {
			continue
		}
		at := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if at < base || at-base >= uintptr(len(m)) {
			continue
		}
		lo := int64(at-base) / page * page
		hi := min(int64(at-base)+int64(len(b)), int64(len(m)))
		spans = append(spans, span{lo, hi})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	for i := 0; i < len(spans); {
		cur := spans[i]
		for i++; i < len(spans) && spans[i].lo <= cur.hi; i++ {
			cur.hi = max(cur.hi, spans[i].hi)
		}
		if err := unix.Madvise(m[cur.lo:cur.hi], unix.MADV_POPULATE_READ); errors.Is(err, unix.EINVAL) {
			return // a kernel before 5.14: the pages fault in as they are read
		}
	}
}

// Slot returns the index (0 or 1) of the winning header slot.
func (rd *Reader) Slot() int { return rd.slot }

// SlotError returns why slot i was not usable, or nil if it was valid.
func (rd *Reader) SlotError(i int) error { return rd.slotErrs[i] }

// Stats returns what the scan has skipped so far and, once Next has
// returned io.EOF, where the log ended.
func (rd *Reader) Stats() ScanStats { return rd.stats }

// Close releases what Open took: the file, its mapping and the prefetch
// goroutine. It never writes. Payloads returned by Next are invalid after it.
func (rd *Reader) Close() error {
	if rd.file == nil {
		return nil
	}
	if rd.mapped != nil {
		close(rd.ahead)
		<-rd.prefetchDone
		_ = unix.Munmap(rd.mapped)
		rd.mapped = nil
	}
	err := rd.file.Close()
	rd.file = nil
	return err
}

// Next returns the next valid data record, io.EOF at the end of the log, or
// an I/O error. The record's header CRC, body offset and body CRC have all
// been checked before it is returned. The payload is not a copy: on a
// Reader made by Open it is a view of the read-only mapping, valid until
// Close; on one made by NewReader it is valid until the next call. Copy what
// must outlive that (Recover and RecoverFile do).
func (rd *Reader) Next() (rec Record, err error) {
	if rd.done {
		return Record{}, io.EOF
	}
	if rd.mapped != nil {
		// A file that shrinks under the mapping faults: report it as an
		// I/O error instead of crashing.
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				rec, err = Record{}, fileError(rd.name, "read", fmt.Errorf("fault reading the mapped WAL: %v", r))
			}
		}()
	}
	err = rd.scan(&rec)
	return rec, err
}

// scan fills rec with the next valid record (returning nil), or returns
// io.EOF or an I/O error.
func (rd *Reader) scan(rec *Record) error {
	for {
		if rd.header.Version() == 0 {
			if stop, reason := rd.v0Stop(); stop {
				*rec = Record{}
				return rd.finish(reason)
			}
		}
		if rd.next >= rd.bound {
			*rec = Record{}
			return rd.finish(ReasonRingBound)
		}
		at := rd.next
		jump, reason, err := rd.readRecord(at, rec)
		if err != nil {
			*rec = Record{}
			return err
		}
		afterRecord := rd.afterRecord
		rd.afterRecord = reason == reasonNone || reason == ReasonPadding
		if reason == reasonNone {
			rd.next = at + int64(rec.Size)
			if rd.header.Version() == 0 {
				rd.v0Valid(at)
			}
			if at == rd.skipAt {
				rd.skip(at, int64(rec.Size), ReasonTrimmedRecord)
				continue
			}
			rd.stats.Records++
			return nil
		}
		if reason == ReasonPadding {
			rd.skip(at, jump-at, ReasonPadding)
			rd.next = jump
			continue
		}
		if rd.header.Version() == 0 {
			// RecoverIteratorV0: remember the first invalid aligned offset
			// and keep scanning within the sliding window after it.
			if rd.v0FirstInvalidOffset == -1 && isAligned(at) && at != rd.skipAt {
				rd.v0FirstInvalidCycle = at / rd.recordCap
				rd.v0FirstInvalidOffset = at
			}
		} else if isAligned(at) {
			// Version 1: an invalid record on a block boundary ends the log.
			*rec = Record{}
			return rd.finish(reason)
		}
		switch {
		case at == rd.skipAt:
			// The scan starts at the trim offset, which need not hold a
			// record (a fresh WAL's is capacity-1): the jump to the next
			// block is the normal start, not damage.
			reason = ReasonTrimmedRecord
		case afterRecord && !isAligned(at) && isHeaderFailure(reason):
			// The normal end of a block: whatever follows its last record.
			reason = ReasonBlockTail
		}
		rd.skip(at, jump-at, reason)
		rd.next = jump
	}
}

func isHeaderFailure(reason string) bool {
	switch reason {
	case ReasonShortHeader, ReasonRecordMagic, ReasonHeaderCRC, ReasonBodyLength, ReasonBodyOffset:
		return true
	}
	return false
}

func (rd *Reader) finish(reason string) error {
	rd.done = true
	rd.stats.EndOffset = rd.next
	rd.stats.EndReason = reason
	return io.EOF
}

func (rd *Reader) skip(at, n int64, reason string) {
	rd.stats.SkippedBytes += n
	rd.stats.SkippedByReason[reason] += n
	if len(rd.stats.Skips) < maxSkips {
		rd.stats.Skips = append(rd.stats.Skips, Skip{Offset: at, Length: n, Reason: reason})
	}
}

// v0Valid updates the version 0 window state after a valid record at at.
func (rd *Reader) v0Valid(at int64) {
	rd.v0LastValid = at
	if rd.v0FirstInvalidCycle != -1 && rd.v0FirstInvalidCycle != at/rd.recordCap {
		// A valid record in a later cycle: the earlier "invalid" one was not
		// the end of the log.
		rd.v0FirstInvalidCycle, rd.v0FirstInvalidOffset = -1, -1
	}
}

// v0Stop is RecoverIteratorV0.shouldContinue inverted (non-strict mode).
func (rd *Reader) v0Stop() (bool, string) {
	window := int64(min(rd.header.SlidingWindowMaxLength, uint64(rd.recordCap)))
	if rd.v0FirstInvalidOffset == -1 || rd.next < rd.v0FirstInvalidOffset+window {
		return false, ""
	}
	if rd.next < rd.v0LastValid+min(window, maxV0ExtraAfterLastOK) {
		return false, ""
	}
	return true, ReasonWindow
}

// readRecord reads the record at logical offset at into rec: in place from
// the mapping when there is one, else through the read buffer.
func (rd *Reader) readRecord(at int64, rec *Record) (jump int64, reason string, err error) {
	if rd.mapped == nil {
		return parseRecord(rd, at, rd.capacity, rd.recordCap, rd.crcTab, rec)
	}
	return parseRecord(&rd.msrc, at, rd.capacity, rd.recordCap, rd.crcTab, rec)
}

// source yields the device bytes a record parse needs.
type source interface {
	// read returns n bytes at physical position pos, or nil if they are not
	// all readable inside the WAL's capacity.
	read(pos int64, n int) ([]byte, error)
}

// parseRecord parses the record at logical offset at. It fills rec and
// returns an empty reason for a valid record, or the failure reason and the offset to jump to, following
// BlockWALService.parseRecordHeader / parseRecordBody. err is set only for
// I/O errors other than end of file. Nothing is copied and nothing is
// allocated: rec's payload is a view of the bytes src returned.
func parseRecord[S source](src S, at, capacity, recordCap int64, crcTab *headerCRCTables, rec *Record) (jump int64, reason string, err error) {
	hp, err := src.read(physical(at, capacity), RecordHeaderSize)
	if err != nil {
		return 0, "", err
	}
	if hp == nil {
		return nextBlock(at), ReasonShortHeader, nil
	}
	// The fields of decodeRecordHeader, read into locals (a struct built and
	// copied per record costs store-forwarding stalls).
	hp = hp[:RecordHeaderSize]
	be := binary.BigEndian
	magic := be.Uint32(hp[0:])
	bodyLength := int32(be.Uint32(hp[4:]))
	if magic == RecordMagicPadding && bodyLength >= 0 {
		// A padding record is recognised by its magic alone.
		return at + RecordHeaderSize + int64(bodyLength), ReasonPadding, nil
	}
	if magic != RecordMagicData {
		return nextBlock(at), ReasonRecordMagic, nil
	}
	if crcTab.checksum20(hp) != be.Uint32(hp[20:]) {
		return nextBlock(at), ReasonHeaderCRC, nil
	}
	if bodyLength <= 0 || int64(bodyLength) > recordCap-RecordHeaderSize {
		return nextBlock(at), ReasonBodyLength, nil
	}
	if int64(be.Uint64(hp[8:])) != at+RecordHeaderSize {
		return nextBlock(at), ReasonBodyOffset, nil
	}
	bodyCRC := be.Uint32(hp[16:])
	end := at + RecordHeaderSize + int64(bodyLength)
	bp, err := src.read(physical(at+RecordHeaderSize, capacity), int(bodyLength))
	if err != nil {
		return 0, "", err
	}
	if bp == nil {
		return nextBlock(end), ReasonShortBody, nil
	}
	if Checksum(bp) != bodyCRC {
		return nextBlock(end), ReasonBodyCRC, nil
	}
	if !decodeBodyInto(bp, &rec.Batch) {
		return nextBlock(end), ReasonMalformedBody, nil
	}
	rec.Offset, rec.Size, rec.Body = at, RecordHeaderSize+int(bodyLength), bp
	return 0, "", nil
}

// mappedSource reads the mapping and tells the prefetch goroutine, once per
// chunk, where reading has got to.
type mappedSource struct {
	m         []byte
	ahead     chan int64
	chunk     int64
	lastChunk int64
}

func (s *mappedSource) read(pos int64, n int) ([]byte, error) {
	if pos+int64(n) > int64(len(s.m)) {
		return nil, nil
	}
	if c := pos/s.chunk + 1; c != s.lastChunk {
		s.lastChunk = c
		select { // replace a position the prefetcher has not taken yet
		case <-s.ahead:
		default:
		}
		s.ahead <- pos
	}
	return s.m[pos : pos+int64(n)], nil
}

// read returns n bytes at physical position pos, or nil if they are not all
// readable inside the WAL's capacity. The slice is valid until the next read.
func (rd *Reader) read(pos int64, n int) ([]byte, error) {
	if pos+int64(n) > rd.capacity {
		return nil, nil
	}
	if pos >= rd.bufPos && pos+int64(n) <= rd.bufPos+int64(rd.bufLen) {
		off := int(pos - rd.bufPos)
		return rd.buf[off : off+n], nil
	}
	if rd.buf == nil {
		rd.buf = make([]byte, min(rd.chunk, rd.capacity))
	}
	if n > len(rd.buf)/2 {
		if cap(rd.big) < n {
			rd.big = make([]byte, n)
		}
		p := rd.big[:n]
		m, err := rd.r.ReadAt(p, pos)
		if m < n {
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, fileError(rd.name, "read", err)
			}
			return nil, nil
		}
		return p, nil
	}
	start := pos / BlockSize * BlockSize
	want := int64(len(rd.buf))
	if start+want > rd.capacity {
		want = rd.capacity - start
	}
	m, err := rd.r.ReadAt(rd.buf[:want], start)
	if m < int(want) && err != nil && !errors.Is(err, io.EOF) {
		rd.bufLen = 0
		return nil, fileError(rd.name, "read", err)
	}
	rd.bufPos, rd.bufLen = start, m
	if pos+int64(n) > start+int64(m) {
		return nil, nil
	}
	off := int(pos - start)
	return rd.buf[off : off+n], nil
}

// Recovery is the result of scanning a whole WAL.
type Recovery struct {
	// Header is the winning header slot.
	Header Header
	// Slot is the index of the winning slot.
	Slot int
	// Records are the valid data records in log order; payloads are copies.
	Records []Record
	// Stats says what was skipped and where the log ended.
	Stats ScanStats
}

// Recover scans the WAL held by r (see NewReader) and returns every valid
// record with copied payloads.
func Recover(r io.ReaderAt, size int64, name string) (*Recovery, error) {
	rd, err := NewReader(r, size, name)
	if err != nil {
		return nil, err
	}
	return rd.collect()
}

// RecoverFile opens path read-only (see Open) and returns every valid record.
func RecoverFile(path string) (*Recovery, error) {
	rd, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return rd.collect()
}

func (rd *Reader) collect() (*Recovery, error) {
	rec := &Recovery{Header: rd.header, Slot: rd.slot}
	for {
		r, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		r.Body = append([]byte(nil), r.Body...)
		r.Batch.Payload = r.Body[BodyHeaderSize:]
		rec.Records = append(rec.Records, r)
	}
	rec.Stats = rd.Stats()
	return rec, nil
}

// Layout reports whether reason names bytes a scan steps over by the WAL's
// normal layout — a padding record, the trimmed record, the rest of a
// block after its last record — rather than damage.
func Layout(reason string) bool {
	return reason == ReasonPadding || reason == ReasonTrimmedRecord || reason == ReasonBlockTail
}

// DamagedBytes is the number of bytes the scan skipped because they were
// damaged (the skips that are not Layout), and the reasons with their
// counts, sorted ("record body crc 4096, bad body offset 24"); 0 and "" for a
// WAL without damage.
func (s ScanStats) DamagedBytes() (int64, string) {
	var n int64
	var reasons []string
	for r, b := range s.SkippedByReason {
		if Layout(r) {
			continue
		}
		n += b
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	notes := make([]string, len(reasons))
	for i, r := range reasons {
		notes[i] = fmt.Sprintf("%s %d", r, s.SkippedByReason[r])
	}
	return n, strings.Join(notes, ", ")
}

// EndText says where the scan found the end of the log and why, in a
// reader's terms: the end of a WAL is normal (nothing written after it,
// older data of an earlier lap round the ring, or a last write torn by the
// crash, which was never acknowledged); damage is counted separately
// (DamagedBytes).
func (s ScanStats) EndText() string {
	why := ""
	switch s.EndReason {
	case ReasonRecordMagic, ReasonShortHeader:
		why = "nothing written after it"
	case ReasonBodyOffset:
		why = "older data of an earlier lap round the ring after it"
	case ReasonHeaderCRC, ReasonBodyLength, ReasonShortBody, ReasonBodyCRC, ReasonMalformedBody:
		why = "its last write was torn by the crash, so never acknowledged"
	case ReasonRingBound:
		why = "a whole ring was read"
	case ReasonWindow:
		why = "past the version 0 recovery window"
	case "":
		return "the WAL ends"
	default:
		why = s.EndReason
	}
	return fmt.Sprintf("the WAL ends at offset %d (%s)", s.EndOffset, why)
}
