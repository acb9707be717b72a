package wal

import (
	"errors"
	"fmt"
	"os"

	"walden/filecheck"
)

// Errors returned by the package. They are wrapped with the file name and the
// detail; test for them with errors.Is.
var (
	// ErrNotWAL means neither header slot holds a known magic: the file is
	// not a block WAL (or was never initialised).
	ErrNotWAL = errors.New("not a WAL: no header slot has a known magic")
	// ErrNotWALFile means the path is neither a regular file nor a block
	// device (a FIFO, a character device such as /dev/zero, a directory):
	// it is refused before it is opened.
	ErrNotWALFile = errors.New("not a regular file or block device")
	// ErrHeaderCRC means a header slot has a known magic but its CRC does not
	// match; returned when no slot is valid and at least one failed its CRC.
	ErrHeaderCRC = errors.New("header CRC mismatch in both slots")
	// ErrBadMagic is the per-slot reason for a slot without a known magic.
	ErrBadMagic = errors.New("unknown header magic")
	// ErrCapacityMismatch means the header's capacity disagrees with the file
	// or device size, or with the capacity asked for.
	ErrCapacityMismatch = errors.New("capacity disagrees with the file size")
	// ErrBadCapacity means a capacity is too small or not 4 KiB-aligned.
	ErrBadCapacity = errors.New("invalid capacity")
	// ErrBadHeader means the winning header slot has a valid CRC but a field
	// out of range (a trim offset beyond 2^62).
	ErrBadHeader = errors.New("invalid header field")
	// ErrBadBody means a record whose CRCs match holds a malformed stream
	// record batch body (its offsets wrap past 2^64, its lengths disagree);
	// it is skipped like a body CRC failure. Append refuses such a batch.
	ErrBadBody = errors.New("malformed record body")
	// ErrNoSpace means a new WAL file does not fit on its file system:
	// its capacity is more than the free space, or allocating it failed
	// (ENOSPC, a quota). Nothing is left behind.
	ErrNoSpace = errors.New("not enough free space for the WAL")
	// ErrFull means the record does not fit in the ring without overwriting
	// untrimmed records; trim and retry.
	ErrFull = errors.New("WAL is full: trim before appending")
	// ErrTooLarge means a record can never fit in the ring.
	ErrTooLarge = errors.New("record larger than the WAL")
	// ErrClosed means the Writer has been closed.
	ErrClosed = errors.New("WAL writer closed")
	// ErrBadTrim means a trim offset is beyond the durable end of the log.
	ErrBadTrim = errors.New("trim offset beyond the durable end of the log")
	// ErrExists means Create found an existing regular file at the path.
	ErrExists = errors.New("file exists")
	// ErrFailed means an earlier write or fdatasync failed; the Writer
	// acknowledges nothing after that and must be reopened.
	ErrFailed = errors.New("WAL writer failed")
	// ErrWrongNode means Reset found a header naming another node than
	// the one it was told the WAL belongs to; nothing was written.
	ErrWrongNode = errors.New("the WAL belongs to another node")
	// ErrTrimMismatch means Reset found a header whose trim offset is
	// before the one the caller read the WAL from: not the log it read;
	// nothing was written.
	ErrTrimMismatch = errors.New("the WAL's trim offset is not the one it was read from")
)

// fileError wraps err with the package prefix and the file name.
func fileError(name, op string, err error) error {
	return fmt.Errorf("wal: %s: %s: %w", name, op, err)
}

// checkKind refuses a path that is neither a regular file nor a block
// device (a FIFO would block a reader, /dev/zero never ends, a directory
// or a socket holds no WAL).
func checkKind(path string, m os.FileMode) error {
	if m.IsRegular() || (m&os.ModeDevice != 0 && m&os.ModeCharDevice == 0) {
		return nil
	}
	return fileError(path, "open", fmt.Errorf("%w (%s): a WAL is a regular file or a block device", ErrNotWALFile, filecheck.Kind(m)))
}
