package wal

import (
	"fmt"
	"io"
	"math"
	"os"
)

// ResetOptions say which WAL Reset may reset and from where.
type ResetOptions struct {
	// NodeID is the node the WAL must belong to: a header that names
	// another node is refused with ErrWrongNode and left as it is.
	NodeID uint32
	// TrimOffset is the header's trim offset when the caller read the WAL
	// (Reader.Header().TrimOffset at the start of its recovery): the reset
	// moves the log start past everything written after it, and only from
	// it. A header that has moved on since (the broker came back, trimmed
	// or reset the WAL itself) is left as it is.
	TrimOffset int64
}

// ResetOutcome says what Reset found.
type ResetOutcome string

const (
	// ResetDone means Reset wrote the new header and made it durable.
	ResetDone ResetOutcome = "reset"
	// ResetAlready means the header already had the trim offset a reset
	// from ResetOptions.TrimOffset writes: the WAL was reset before
	// (an earlier attempt of the same failover); nothing was written.
	ResetAlready ResetOutcome = "already_reset"
	// ResetMovedOn means the header's trim offset is past
	// ResetOptions.TrimOffset but is not the reset's: someone else moved
	// the log on after the caller read it (the broker restarted, recovered
	// and trimmed or reset its own WAL). Nothing was written: what the
	// log holds now is not what the caller read.
	ResetMovedOn ResetOutcome = "moved_on"
)

// ResetResult is what Reset found and did.
type ResetResult struct {
	// Outcome is ResetDone, ResetAlready or ResetMovedOn.
	Outcome ResetOutcome
	// Before is the header in force when Reset opened the WAL, and
	// BeforeSlot its slot.
	Before     Header
	BeforeSlot int
	// After is the header in force when Reset returned (the one it wrote,
	// or Before when it wrote nothing), and AfterSlot its slot.
	After     Header
	AfterSlot int
}

// ResetTrimOffset is the trim offset a reset from trim writes in a WAL of
// capacity bytes: alignUp(trim + capacity) - 1, past every offset a writer
// that respected the trim offset can have used (AutoMQ's
// BlockWALService.reset), so that the log is empty.
func ResetTrimOffset(trim, capacity int64) int64 { return alignUp(trim+capacity) - 1 }

// Reset empties the WAL at path (a regular file or a block device) the way
// AutoMQ ends a failover: the header's trim offset becomes
// ResetTrimOffset(opts.TrimOffset, capacity), so that no recovery finds a
// record and the broker that owned the WAL starts past everything in it.
//
// It writes one header, in the WAL's own format version: the magic, the
// capacity, the sliding window length, the shutdown type, the node id and
// epoch are kept; the header goes to the slot that did not win (as AutoMQ's
// writer alternates them), with a last_write_timestamp one more than the
// winner's, so that it wins; the 56 bytes are written and fsynced before
// Reset returns. The slot in force is never overwritten: a crash during the
// write leaves the WAL as it was, and the reset can be run again.
//
// Reset is idempotent: run again with the same options it finds its own
// header and writes nothing (ResetAlready). It writes nothing either when
// the header's trim offset moved past opts.TrimOffset to anything else
// (ResetMovedOn). It refuses, writing nothing, a file that is not a WAL or
// whose size disagrees with its header, a header naming another node
// (ErrWrongNode), and a header whose trim offset is before opts.TrimOffset
// (ErrTrimMismatch: not the log the caller read).
func Reset(path string, opts ResetOptions) (ResetResult, error) {
	if opts.TrimOffset < -1 {
		return ResetResult{}, fileError(path, "reset", fmt.Errorf("%w: expected trim offset %d (must be -1 or more)", ErrTrimMismatch, opts.TrimOffset))
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return ResetResult{}, fmt.Errorf("wal: reset: %w", err)
	}
	res, err := reset(f, path, opts)
	if cerr := f.Close(); cerr != nil && err == nil {
		err = fileError(path, "close", cerr)
	}
	return res, err
}

func reset(f *os.File, path string, opts ResetOptions) (ResetResult, error) {
	rd, err := headerOf(f, path)
	if err != nil {
		return ResetResult{}, err
	}
	h := rd.header
	res := ResetResult{Before: h, BeforeSlot: rd.slot, After: h, AfterSlot: rd.slot}
	if h.NodeID != opts.NodeID {
		return res, fileError(path, "reset", fmt.Errorf("%w: the header names node %d, expected node %d", ErrWrongNode, h.NodeID, opts.NodeID))
	}
	capacity := int64(h.Capacity)
	if opts.TrimOffset > math.MaxInt64-capacity-BlockSize {
		return res, fileError(path, "reset", fmt.Errorf("%w: trim offset %d out of range", ErrBadHeader, opts.TrimOffset))
	}
	target := ResetTrimOffset(opts.TrimOffset, capacity)
	switch {
	case h.TrimOffset == target:
		res.Outcome = ResetAlready
		return res, nil
	case h.TrimOffset < opts.TrimOffset:
		return res, fileError(path, "reset", fmt.Errorf("%w: the header's trim offset is %d, before the %d the WAL was read from", ErrTrimMismatch, h.TrimOffset, opts.TrimOffset))
	case h.TrimOffset != opts.TrimOffset:
		res.Outcome = ResetMovedOn
		return res, nil
	}
	// The new header must win under both orders AutoMQ and this package
	// compare timestamps in (AutoMQ reads them as signed 64-bit numbers).
	if h.LastWriteTimestamp >= math.MaxInt64 {
		return res, fileError(path, "reset", fmt.Errorf("%w: last_write_timestamp %d leaves no larger one", ErrBadHeader, h.LastWriteTimestamp))
	}
	next := h
	next.TrimOffset = target
	next.LastWriteTimestamp = h.LastWriteTimestamp + 1
	slot := 1 - rd.slot
	var p [HeaderSize]byte
	encodeHeader(p[:], &next)
	if _, err := f.WriteAt(p[:], int64(slot)*BlockSize); err != nil {
		return res, fileError(path, fmt.Sprintf("write header slot %d", slot), err)
	}
	if err := f.Sync(); err != nil {
		return res, fileError(path, "fsync header", err)
	}
	// Read it back: the slot written must be the one in force now.
	after, err := headerOf(f, path)
	if err != nil {
		return res, err
	}
	if after.slot != slot || after.header != next {
		return res, fileError(path, "reset", fmt.Errorf("%w: header slot %d does not read back as written", ErrBadHeader, slot))
	}
	res.Outcome, res.After, res.AfterSlot = ResetDone, next, slot
	return res, nil
}

// ReadHeader reads the header in force of the WAL at path, read-only and
// without scanning the records: the header and the slot it is in.
func ReadHeader(path string) (Header, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, 0, fmt.Errorf("wal: %w", err)
	}
	defer f.Close()
	rd, err := headerOf(f, path)
	if err != nil {
		return Header{}, 0, err
	}
	return rd.header, rd.slot, nil
}

// headerOf checks the WAL on the open file f (a regular file whose size is
// the header's capacity, or a block device at least that large) and returns
// a Reader positioned at its start, which holds the header in force.
func headerOf(f *os.File, path string) (*Reader, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fileError(path, "stat", err)
	}
	var size int64
	exact := true
	switch {
	case fi.Mode().IsRegular():
		size = fi.Size()
	case fi.Mode()&os.ModeDevice != 0:
		exact = false
		if size, err = f.Seek(0, io.SeekEnd); err != nil {
			return nil, fileError(path, "size of device", err)
		}
	default:
		return nil, fileError(path, "open", fmt.Errorf("%w: not a regular file or block device", ErrNotWAL))
	}
	rd, err := newReader(f, size, path, exact, readerOptions{})
	if err != nil {
		return nil, err
	}
	return rd, nil
}
