package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of WriterOptions, taken from AutoMQ's BlockWALService builder.
const (
	// DefaultBlockSoftLimit is the size at which a block is sealed unless it
	// holds a single larger record (AutoMQ blockSoftLimit, 256 KiB).
	DefaultBlockSoftLimit = 256 << 10
	// DefaultWindowMaxLength is the sliding window length written into a new
	// header (AutoMQ slidingWindowInitialSize, 1 MiB).
	DefaultWindowMaxLength = 1 << 20
	// DefaultMaxSyncs is how many fdatasync calls may be in flight.
	DefaultMaxSyncs = 4
)

// WriterOptions tune a Writer. The zero value takes the defaults.
type WriterOptions struct {
	// BlockSoftLimit seals a block once adding a record would exceed it
	// (a block always takes its first record). Default 256 KiB.
	BlockSoftLimit int
	// WindowMaxLength is the most bytes written by one group commit and the
	// sliding_window_max_length recorded in the header; a record larger
	// than it raises it first. Default 1 MiB, capped at the ring size.
	WindowMaxLength int64
	// Clock supplies header timestamps (default: wall clock in
	// nanoseconds). The Writer makes them strictly increasing whatever the
	// clock returns, so the newest slot always wins.
	Clock func() uint64
	// MaxSyncs is how many fdatasync calls may run at once, each covering
	// every group written before it started. Default 4.
	MaxSyncs int
	// Logger receives the writer's events. Default: discard.
	Logger *slog.Logger
}

// CreateOptions describe a new WAL.
type CreateOptions struct {
	// Capacity is the size in bytes of the WAL, header slots included; a
	// multiple of 4096 and at least 12 KiB. Required.
	Capacity int64
	// NodeID is the broker that owns the WAL.
	NodeID uint32
	// NodeEpoch is the broker's current epoch.
	NodeEpoch uint64
	WriterOptions

	// allocate allocates a new file's blocks (fallocate(2)); tests make it
	// fail as a full file system, or one without fallocate, would.
	allocate func(fd int, mode uint32, off, size int64) error
}

// OpenOptions describe how to reopen an existing WAL for appending.
type OpenOptions struct {
	// NodeEpoch, when non-zero, replaces the node epoch in the header.
	NodeEpoch uint64
	WriterOptions
}

// Validate reports the first invalid option, naming it.
func (o WriterOptions) Validate() error {
	if o.BlockSoftLimit < 0 {
		return fmt.Errorf("wal: block_soft_limit: must not be negative, got %d", o.BlockSoftLimit)
	}
	if o.WindowMaxLength < 0 {
		return fmt.Errorf("wal: window_max_length: must not be negative, got %d", o.WindowMaxLength)
	}
	if o.MaxSyncs < 0 {
		return fmt.Errorf("wal: max_syncs: must not be negative, got %d", o.MaxSyncs)
	}
	return nil
}

// Validate reports the first invalid option, naming it.
func (o CreateOptions) Validate() error {
	if o.Capacity < MinCapacity || o.Capacity%BlockSize != 0 {
		return fmt.Errorf("wal: capacity: %w: %d (must be a multiple of %d and at least %d)", ErrBadCapacity, o.Capacity, BlockSize, MinCapacity)
	}
	return o.WriterOptions.Validate()
}

func (o WriterOptions) withDefaults(recordCap int64) WriterOptions {
	if o.BlockSoftLimit == 0 {
		o.BlockSoftLimit = DefaultBlockSoftLimit
	}
	if o.WindowMaxLength == 0 {
		o.WindowMaxLength = DefaultWindowMaxLength
	}
	o.WindowMaxLength = min(o.WindowMaxLength, recordCap)
	if o.MaxSyncs == 0 {
		o.MaxSyncs = DefaultMaxSyncs
	}
	if o.Clock == nil {
		o.Clock = func() uint64 { return uint64(time.Now().UnixNano()) }
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Writer appends stream record batches to a WAL with group commit. Append
// is safe for concurrent use: appenders enqueue, one goroutine forms blocks
// from everything queued and writes them, and an fdatasync (up to MaxSyncs
// in flight) wakes the appenders of every group written before it started.
// An appender that finds the writer idle does the same for its own records
// inline, without a goroutine handoff.
type Writer struct {
	name      string
	f         *os.File
	fd        int
	capacity  int64
	recordCap int64
	opts      WriterOptions
	log       *slog.Logger

	headerMu sync.Mutex // serialises header writes; guards hdr, slot, lastTS
	hdr      Header
	slot     int // slot the next header write goes to
	lastTS   uint64

	flushedTrim atomic.Int64 // trim offset durable in a header slot
	durable     atomic.Int64 // every block before this logical offset is durable

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*request
	closed  bool
	failure error
	exited  chan struct{}

	writeMu sync.Mutex // held while forming and writing blocks; guards next, buf, segments

	slots chan struct{}  // one token per fdatasync in flight
	syncs sync.WaitGroup // running sync goroutines

	syncMu     sync.Mutex // guards pending, writtenSeq
	pending    []*group   // written groups waiting for a sync, in order
	writtenSeq uint64     // seq of the last written group

	// guarded by writeMu
	next     int64 // start of the next block
	buf      []byte
	segments []segment
}

// group is the requests of one commit, written and waiting for a sync.
type group struct {
	reqs []*request
	end  int64 // w.next after the group: durable once the group is
	seq  uint64
}

type request struct {
	batch  Batch
	crc    uint32
	size   int
	offset int64
	err    error
	done   chan struct{}
}

// segment is a physically contiguous run of the group buffer.
type segment struct {
	pos        int64
	begin, end int
}

// Create makes a new WAL at path: a regular file that must not exist yet
// (created and allocated to opts.Capacity bytes), or an existing block device
// at least that large. It writes header slot 0 with trim offset -1, then
// slot 1 with trim offset capacity-1, as AutoMQ's start and reset do, so the
// first record goes to logical offset capacity. On a block device that
// already holds a valid header, the new log starts past every offset the old
// one used, so old records can never be read as new.
func Create(path string, opts CreateOptions) (*Writer, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("%w (creating %s)", err, path)
	}
	fi, err := os.Stat(path)
	if err == nil {
		if err := checkKind(path, fi.Mode()); err != nil {
			return nil, err
		}
	}
	switch {
	case err == nil && fi.Mode()&os.ModeDevice != 0:
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("wal: %w", err)
		}
		size, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			f.Close()
			return nil, fileError(path, "size of device", err)
		}
		if size < opts.Capacity {
			f.Close()
			return nil, fileError(path, "create", fmt.Errorf("%w: capacity %d, device size %d", ErrCapacityMismatch, opts.Capacity, size))
		}
		w, err := create(f, path, opts)
		if err != nil {
			f.Close()
		}
		return w, err
	case err == nil:
		return nil, fileError(path, "create", ErrExists)
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("wal: %w", err)
	}
	// Check the free space first: a WAL that does not fit would fail later,
	// mid-write, with acknowledged-looking data nowhere.
	if free, err := freeBytes(filepath.Dir(path)); err == nil && free < opts.Capacity {
		return nil, fileError(path, "create", fmt.Errorf("%w: capacity %d bytes, %d bytes free on the file system of %s",
			ErrNoSpace, opts.Capacity, free, filepath.Dir(path)))
	}
	// The WAL holds the broker's records: its owner's only.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	fail := func(op string, err error) (*Writer, error) {
		f.Close()
		os.Remove(path)
		return nil, fileError(path, op, err)
	}
	// Allocate every block now. Only a file system that cannot allocate
	// (no fallocate) gets a sparse file instead; running out of space or
	// quota is an error, and the file goes.
	allocate := opts.allocate
	if allocate == nil {
		allocate = unix.Fallocate
	}
	if err := allocate(int(f.Fd()), 0, 0, opts.Capacity); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
			return fail("allocate", fmt.Errorf("%w: %w", ErrNoSpace, err))
		}
		if err := f.Truncate(opts.Capacity); err != nil {
			return fail("allocate", err)
		}
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fail("sync directory", err)
	}
	w, err := create(f, path, opts)
	if err != nil {
		f.Close()
		os.Remove(path)
	}
	return w, err
}

// freeBytes is the space an unprivileged process may still allocate on the
// file system of dir.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// create initialises the header slots on an open device or file.
func create(f *os.File, name string, opts CreateOptions) (*Writer, error) {
	recordCap := opts.Capacity - HeaderRegionSize
	w := newWriter(f, name, opts.Capacity, opts.WriterOptions.withDefaults(recordCap))
	trim := int64(-1)
	// A device may hold an older WAL: start past every offset it used.
	if rd, err := newReader(f, opts.Capacity, name, false, readerOptions{}); err == nil && rd.header.Capacity == uint64(opts.Capacity) {
		trim = alignUp(max(rd.header.TrimOffset, 0)+opts.Capacity) - 1
		w.lastTS = rd.header.LastWriteTimestamp
	}
	w.hdr = Header{
		Magic:                  MagicV1,
		Capacity:               uint64(opts.Capacity),
		TrimOffset:             trim,
		SlidingWindowMaxLength: uint64(w.opts.WindowMaxLength),
		ShutdownType:           ShutdownUngraceful,
		NodeID:                 opts.NodeID,
		NodeEpoch:              opts.NodeEpoch,
	}
	if err := w.writeHeader(); err != nil {
		return nil, err
	}
	if err := w.reset(); err != nil {
		return nil, err
	}
	w.start()
	w.log.Info("wal created", "path", name, "capacity", opts.Capacity, "node_id", opts.NodeID, "node_epoch", opts.NodeEpoch)
	return w, nil
}

// OpenWriter reopens an existing WAL for appending. Like AutoMQ's reset it
// discards every record: the next record goes to the block boundary at or
// after trim offset + capacity, past anything the old log wrote, and the
// header's trim offset moves just before it. Recover the records first.
func OpenWriter(path string, opts OpenOptions) (*Writer, error) {
	if err := opts.WriterOptions.Validate(); err != nil {
		return nil, fmt.Errorf("%w (opening %s)", err, path)
	}
	if fi, err := os.Stat(path); err == nil {
		if err := checkKind(path, fi.Mode()); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	w, err := openWriter(f, path, opts)
	if err != nil {
		f.Close()
	}
	return w, err
}

func openWriter(f *os.File, path string, opts OpenOptions) (*Writer, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fileError(path, "stat", err)
	}
	exact := fi.Mode().IsRegular()
	size := fi.Size()
	if !exact {
		if size, err = f.Seek(0, io.SeekEnd); err != nil {
			return nil, fileError(path, "size of device", err)
		}
	}
	rd, err := newReader(f, size, path, exact, readerOptions{})
	if err != nil {
		return nil, err
	}
	capacity := int64(rd.header.Capacity)
	w := newWriter(f, path, capacity, opts.WriterOptions.withDefaults(capacity-HeaderRegionSize))
	w.hdr = rd.header
	w.hdr.Magic = MagicV1
	w.hdr.ShutdownType = ShutdownUngraceful
	w.hdr.SlidingWindowMaxLength = max(w.hdr.SlidingWindowMaxLength, uint64(w.opts.WindowMaxLength))
	if opts.NodeEpoch != 0 {
		w.hdr.NodeEpoch = opts.NodeEpoch
	}
	// Write the slot that did not win first, so the current header stays
	// intact until its successor is durable.
	w.slot = 1 - rd.slot
	var p [HeaderSize]byte
	for i := 0; i < HeaderSlots; i++ {
		if n, _ := f.ReadAt(p[:], int64(i)*BlockSize); n == HeaderSize {
			if h, err := decodeHeader(p[:]); err == nil {
				w.lastTS = max(w.lastTS, h.LastWriteTimestamp)
			}
		}
	}
	if err := w.reset(); err != nil {
		return nil, err
	}
	w.start()
	w.log.Info("wal reopened", "path", path, "capacity", capacity, "node_id", w.hdr.NodeID, "node_epoch", w.hdr.NodeEpoch, "next_offset", w.next)
	return w, nil
}

func newWriter(f *os.File, name string, capacity int64, opts WriterOptions) *Writer {
	w := &Writer{
		name:      name,
		f:         f,
		fd:        int(f.Fd()),
		capacity:  capacity,
		recordCap: capacity - HeaderRegionSize,
		opts:      opts,
		log:       opts.Logger,
		exited:    make(chan struct{}),
		slots:     make(chan struct{}, opts.MaxSyncs),
	}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// reset moves the log start past every offset the previous log could have
// used (AutoMQ BlockWALService.reset) and makes that durable.
func (w *Writer) reset() error {
	w.headerMu.Lock()
	defer w.headerMu.Unlock()
	start := alignUp(w.hdr.TrimOffset + w.capacity)
	w.hdr.TrimOffset = start - 1
	if err := w.writeHeaderLocked(); err != nil {
		return err
	}
	w.next = start
	w.durable.Store(start)
	w.flushedTrim.Store(start - 1)
	return nil
}

func (w *Writer) start() { go w.loop() }

func (w *Writer) writeHeader() error {
	w.headerMu.Lock()
	defer w.headerMu.Unlock()
	return w.writeHeaderLocked()
}

// writeHeaderLocked writes w.hdr to the next slot and makes it durable.
func (w *Writer) writeHeaderLocked() error {
	ts := w.opts.Clock()
	if ts <= w.lastTS {
		ts = w.lastTS + 1
	}
	w.hdr.LastWriteTimestamp = ts
	var p [HeaderSize]byte
	encodeHeader(p[:], &w.hdr)
	pos := int64(w.slot) * BlockSize
	if _, err := w.f.WriteAt(p[:], pos); err != nil {
		return fileError(w.name, fmt.Sprintf("write header slot %d", w.slot), err)
	}
	if err := unix.Fdatasync(w.fd); err != nil {
		return fileError(w.name, "fdatasync header", err)
	}
	w.lastTS = ts
	w.slot = 1 - w.slot
	return nil
}

// Header returns the header as last written.
func (w *Writer) Header() Header {
	w.headerMu.Lock()
	defer w.headerMu.Unlock()
	return w.hdr
}

// NextOffset returns the logical offset before which every block is durable
// (the start of the next block).
func (w *Writer) NextOffset() int64 { return w.durable.Load() }

// Append writes b and returns the logical offset of its record once the
// block holding it is durable. It fails with ErrFull when the record does
// not fit before the trim offset, ErrTooLarge when it never can, ErrClosed
// after Close and ErrFailed after an I/O error. If ctx ends first, Append
// returns ctx.Err() and the record may or may not be durable. b.Payload must
// not change until Append returns.
func (w *Writer) Append(ctx context.Context, b Batch) (int64, error) {
	offsets, err := w.AppendAll(ctx, []Batch{b})
	if err != nil {
		return 0, err
	}
	return offsets[0], nil
}

// AppendAll writes the batches back to back in one group commit (as far as
// the window allows) and returns their offsets once all are durable. On
// error it returns the first error; offsets of records that were written
// are still filled in.
func (w *Writer) AppendAll(ctx context.Context, batches []Batch) ([]int64, error) {
	reqs := make([]*request, len(batches))
	for i := range batches {
		b := &batches[i]
		if b.offsetsWrap() {
			return nil, fileError(w.name, "append", fmt.Errorf("%w: stream %d offsets %d + %d wrap past 2^64", ErrBadBody, b.StreamID, b.BaseOffset, b.Count))
		}
		size := int64(b.recordSize())
		if size > w.recordCap || size > math.MaxInt32 {
			return nil, fileError(w.name, "append", fmt.Errorf("%w: record of %d bytes, ring of %d", ErrTooLarge, size, w.recordCap))
		}
		reqs[i] = &request{batch: *b, crc: bodyChecksum(b), size: int(size), offset: -1, done: make(chan struct{})}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w.mu.Lock()
	switch {
	case w.closed:
		w.mu.Unlock()
		return nil, fileError(w.name, "append", ErrClosed)
	case w.failure != nil:
		err := w.failure
		w.mu.Unlock()
		return nil, fileError(w.name, "append", fmt.Errorf("%w: %w", ErrFailed, err))
	}
	inline := false
	if len(w.queue) == 0 && w.writeMu.TryLock() {
		select {
		case w.slots <- struct{}{}:
			inline = true
			w.syncs.Add(1)
		default:
			w.writeMu.Unlock()
		}
	}
	if inline {
		w.mu.Unlock()
		w.appendInline(reqs)
	} else {
		w.queue = append(w.queue, reqs...)
		w.cond.Signal()
		w.mu.Unlock()
	}
	offsets := make([]int64, len(reqs))
	var first error
	for i, r := range reqs {
		select {
		case <-r.done:
		case <-ctx.Done():
			return offsets, ctx.Err()
		}
		offsets[i] = r.offset
		if r.err != nil && first == nil {
			first = r.err
		}
	}
	return offsets, first
}

// Trim marks every record up to and including the one at offset as no
// longer needed, and makes that durable in a header slot before it returns.
// offset must be below NextOffset; a trim at or below the current trim
// offset changes nothing.
func (w *Writer) Trim(offset int64) error {
	if offset >= w.durable.Load() {
		return fileError(w.name, "trim", fmt.Errorf("%w: offset %d, durable end %d", ErrBadTrim, offset, w.durable.Load()))
	}
	w.headerMu.Lock()
	defer w.headerMu.Unlock()
	if offset <= w.hdr.TrimOffset {
		return nil
	}
	prev := w.hdr.TrimOffset
	w.hdr.TrimOffset = offset
	if err := w.writeHeaderLocked(); err != nil {
		w.hdr.TrimOffset = prev
		return err
	}
	w.flushedTrim.Store(offset)
	return nil
}

// Close waits for every queued Append, writes a header with the graceful
// shutdown type and closes the file. After a failed write or sync it leaves
// the header ungraceful and returns ErrFailed.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return fileError(w.name, "close", ErrClosed)
	}
	w.closed = true
	w.cond.Broadcast()
	w.mu.Unlock()
	<-w.exited

	w.mu.Lock()
	failure := w.failure
	w.mu.Unlock()
	failed := failure != nil
	var err error
	if failed {
		err = fileError(w.name, "close", fmt.Errorf("%w: %w", ErrFailed, failure))
	} else {
		w.headerMu.Lock()
		w.hdr.ShutdownType = ShutdownGraceful
		err = w.writeHeaderLocked()
		w.headerMu.Unlock()
	}
	if cerr := w.f.Close(); cerr != nil && err == nil {
		err = fileError(w.name, "close", cerr)
	}
	w.log.Info("wal closed", "path", w.name, "graceful", !failed && err == nil)
	return err
}

// Abandon stops the writer the way a crash would: queued appends are
// completed, but no shutdown header is written (the header stays
// ungraceful) and the file is closed. It exists for tests and for
// `walden wal gen --torn-tail`.
func (w *Writer) Abandon() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return fileError(w.name, "abandon", ErrClosed)
	}
	w.closed = true
	w.cond.Broadcast()
	w.mu.Unlock()
	<-w.exited
	if err := w.f.Close(); err != nil {
		return fileError(w.name, "close", err)
	}
	return nil
}

// loop is the only goroutine that writes records. It waits for a free
// sync slot (requests queue up meanwhile), takes every queued request, packs
// them into blocks, writes them, and hands one fdatasync covering them to a
// sync goroutine; up to MaxSyncs such calls run at once, and each completes
// every group written before it started.
func (w *Writer) loop() {
	defer close(w.exited)
	defer w.syncs.Wait()
	var batch []*request
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && !w.closed {
			w.cond.Wait()
		}
		if len(w.queue) == 0 && w.closed {
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		w.slots <- struct{}{}
		w.mu.Lock()
		batch, w.queue = w.queue, batch[:0]
		failure := w.failure
		w.mu.Unlock()

		if failure != nil {
			for _, r := range batch {
				r.err = fileError(w.name, "append", fmt.Errorf("%w: %w", ErrFailed, failure))
				close(r.done)
			}
			<-w.slots
			continue
		}
		w.writeMu.Lock()
		wrote, seq := w.commitAll(batch)
		w.writeMu.Unlock()
		clear(batch[:cap(batch)])
		batch = batch[:0]
		if !wrote {
			<-w.slots
			continue
		}
		w.syncs.Add(1)
		go w.sync(seq)
	}
}

// commitAll writes every request of batch (w.writeMu held). It returns
// whether anything was written and the seq of the last written group.
func (w *Writer) commitAll(batch []*request) (bool, uint64) {
	wrote := false
	for len(batch) > 0 {
		n, ok := w.commit(batch)
		batch = batch[n:]
		wrote = wrote || ok
	}
	w.syncMu.Lock()
	seq := w.writtenSeq
	w.syncMu.Unlock()
	return wrote, seq
}

// appendInline is the uncontended path of AppendAll: the caller holds
// w.writeMu and a sync slot, and writes and syncs its own records without
// waking the loop goroutine. Records others append meanwhile go through the
// loop and may share this sync.
func (w *Writer) appendInline(reqs []*request) {
	wrote, seq := w.commitAll(reqs)
	w.writeMu.Unlock()
	if !wrote {
		<-w.slots
		w.syncs.Done()
		return
	}
	w.sync(seq)
}

// sync makes every group up to seq durable and completes its requests.
func (w *Writer) sync(seq uint64) {
	defer w.syncs.Done()
	defer func() { <-w.slots }()
	err := unix.Fdatasync(w.fd)
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	w.mu.Lock()
	failure := w.failure
	w.mu.Unlock()
	if err != nil {
		err = fileError(w.name, "fdatasync", err)
	} else if failure != nil {
		// After a failed write or sync, a later sync that succeeds proves
		// nothing about the pages of the failed one.
		err = failure
	}
	if err != nil {
		var reqs []*request
		for _, g := range w.pending {
			reqs = append(reqs, g.reqs...)
		}
		w.pending = nil
		w.fail(err, reqs)
		return
	}
	k := 0
	for ; k < len(w.pending) && w.pending[k].seq <= seq; k++ {
		g := w.pending[k]
		w.durable.Store(g.end)
		for _, r := range g.reqs {
			close(r.done)
		}
	}
	w.pending = append(w.pending[:0], w.pending[k:]...)
}

// commit writes as many requests from the front of batch as fit in one
// window and queues them as a group for the next sync. It returns how many
// requests it consumed (at least one) and whether it wrote any.
func (w *Writer) commit(batch []*request) (int, bool) {
	trim := w.flushedTrim.Load()
	w.buf = w.buf[:0]
	w.segments = w.segments[:0]
	groupStart := w.next
	window := w.opts.WindowMaxLength

	var (
		used     int
		blockBeg = int64(-1) // logical start of the open block, -1 if none
		blockLen int64
		blockMax int64
		written  []*request
	)
	// A sealed block's tail up to the next boundary is left as it is on
	// disk: padding it could overwrite the record at the trim offset, which
	// recovery still reads.
	sealBlock := func() {
		if blockBeg < 0 {
			return
		}
		w.next = blockBeg + alignUp(blockLen)
		blockBeg = -1
	}
	for used < len(batch) {
		r := batch[used]
		size := int64(r.size)
		if blockBeg >= 0 && (blockLen+size > int64(w.opts.BlockSoftLimit) || blockLen+size > blockMax) {
			sealBlock()
		}
		if blockBeg < 0 {
			start := w.next
			remDev := w.recordCap - start%w.recordCap
			ringRem := w.recordCap - start + trim
			need := size
			if remDev < size {
				need = remDev + size
			}
			if ringRem < need {
				r.err = fileError(w.name, "append", fmt.Errorf("%w: record of %d bytes at offset %d, trim offset %d, ring of %d", ErrFull, size, start, trim, w.recordCap))
				close(r.done)
				used++
				continue
			}
			// Keep one group commit within the window, except that a group
			// always takes its first record.
			if len(written) > 0 && w.next+need-groupStart > window {
				break
			}
			if w.next+need-groupStart > window {
				if err := w.growWindow(alignUp(need)); err != nil {
					w.fail(err, batch[used:used+1])
					return used + 1, false
				}
				window = w.opts.WindowMaxLength
			}
			if remDev < size {
				// The block does not fit before the end of the device: a
				// padding record runs to the end and writing wraps.
				w.appendPadding(start, remDev)
				w.next = start + remDev
				start = w.next
				remDev = w.recordCap
			}
			blockBeg, blockLen = start, 0
			blockMax = min(remDev, w.recordCap-start+trim)
			w.openSegment(physical(start, w.capacity))
		} else if w.next+alignUp(blockLen+size)-groupStart > window && len(written) > 0 {
			break
		}
		r.offset = blockBeg + blockLen
		w.appendRecord(r)
		blockLen += size
		written = append(written, r)
		used++
	}
	sealBlock()
	if len(written) == 0 {
		return used, false
	}
	if err := w.write(); err != nil {
		w.next = groupStart
		w.fail(err, written)
		return used, false
	}
	w.syncMu.Lock()
	w.writtenSeq++
	w.pending = append(w.pending, &group{reqs: written, end: w.next, seq: w.writtenSeq})
	w.syncMu.Unlock()
	return used, true
}

// growWindow raises sliding_window_max_length to at least n and makes the
// header durable before a group that large is written.
func (w *Writer) growWindow(n int64) error {
	w.headerMu.Lock()
	defer w.headerMu.Unlock()
	n = min(n, w.recordCap)
	w.opts.WindowMaxLength = max(w.opts.WindowMaxLength, n)
	if uint64(n) <= w.hdr.SlidingWindowMaxLength {
		return nil
	}
	w.hdr.SlidingWindowMaxLength = uint64(n)
	return w.writeHeaderLocked()
}

func (w *Writer) openSegment(pos int64) {
	if k := len(w.segments); k > 0 {
		s := &w.segments[k-1]
		if s.pos+int64(s.end-s.begin) == pos {
			return
		}
	}
	w.segments = append(w.segments, segment{pos: pos, begin: len(w.buf), end: len(w.buf)})
}

func (w *Writer) grow(n int) []byte {
	l := len(w.buf)
	if cap(w.buf)-l < n {
		nb := make([]byte, l, max(2*cap(w.buf), l+n, 1<<20))
		copy(nb, w.buf)
		w.buf = nb
	}
	w.buf = w.buf[:l+n]
	w.segments[len(w.segments)-1].end = l + n
	return w.buf[l : l+n]
}

func (w *Writer) appendRecord(r *request) {
	p := w.grow(r.size)
	bodyLen := r.size - RecordHeaderSize
	encodeRecordHeader(p, RecordMagicData, r.offset, bodyLen, r.crc)
	encodeBodyHeader(p[RecordHeaderSize:], &r.batch)
	copy(p[RecordHeaderSize+BodyHeaderSize:], r.batch.Payload)
}

// appendPadding adds a padding record of length n at logical offset start:
// a header with a zero body CRC and a zero-filled body (WALUtil
// generatePaddingRecord).
func (w *Writer) appendPadding(start, n int64) {
	w.openSegment(physical(start, w.capacity))
	p := w.grow(int(n))
	clear(p)
	encodeRecordHeader(p, RecordMagicPadding, start, int(n-RecordHeaderSize), 0)
}

// write writes every segment of the group buffer (into the page cache; a
// sync makes it durable).
func (w *Writer) write() error {
	for _, s := range w.segments {
		if _, err := w.f.WriteAt(w.buf[s.begin:s.end], s.pos); err != nil {
			return fileError(w.name, "write", err)
		}
	}
	return nil
}

// fail makes the writer refuse every further append: after a failed write
// or fdatasync the state of the page cache is unknown.
func (w *Writer) fail(err error, reqs []*request) {
	w.log.Error("wal write failed; the writer acknowledges nothing from now on", "path", w.name, "err", err)
	w.mu.Lock()
	if w.failure == nil {
		w.failure = err
	}
	w.mu.Unlock()
	for _, r := range reqs {
		r.offset = -1
		r.err = fmt.Errorf("%w: %w", ErrFailed, err)
		close(r.done)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
