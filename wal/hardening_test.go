package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHardeningWrappingOffsets: a record whose CRCs match but whose batch
// offsets run past 2^64 is never returned (it is skipped as a malformed
// body, the records around it are read), and Append refuses such a batch,
// writing nothing.
func TestHardeningWrappingOffsets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal")
	const capacity = 64 << 10
	w, err := Create(path, CreateOptions{Capacity: capacity, NodeID: 1, NodeEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	offs, err := w.AppendAll(ctx, []Batch{
		{StreamID: 1, Epoch: 1, BaseOffset: 0, Count: 3, Payload: []byte("first")},
		{StreamID: 1, Epoch: 1, BaseOffset: 3, Count: 5, Payload: []byte("to be forged")},
		{StreamID: 2, Epoch: 1, BaseOffset: 0, Count: 1, Payload: []byte("third")},
	})
	if err != nil {
		t.Fatal(err)
	}
	next := w.NextOffset()
	_, err = w.Append(ctx, Batch{StreamID: 1, Epoch: 1, BaseOffset: math.MaxUint64 - 1, Count: 5, Payload: []byte("wraps")})
	if !errors.Is(err, ErrBadBody) || w.NextOffset() != next {
		t.Fatalf("append of a wrapping batch: %v (next offset %d, was %d)", err, w.NextOffset(), next)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	// Forge the second record: base offset 2^64-2, count 5, both CRCs
	// recomputed, so only the offsets are wrong.
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	at := physical(offs[1], capacity)
	hdr := img[at : at+RecordHeaderSize]
	bodyLen := binary.BigEndian.Uint32(hdr[4:])
	body := img[at+RecordHeaderSize : at+RecordHeaderSize+int64(bodyLen)]
	binary.BigEndian.PutUint64(body[17:], math.MaxUint64-1)
	binary.BigEndian.PutUint32(hdr[16:], Checksum(body))
	binary.BigEndian.PutUint32(hdr[20:], Checksum(hdr[:20]))

	rec, err := Recover(bytes.NewReader(img), int64(len(img)), "forged")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rec.Records {
		if r.Batch.BaseOffset == math.MaxUint64-1 {
			t.Fatalf("the forged batch was returned: %+v", r.Batch)
		}
	}
	if rec.Stats.SkippedByReason[ReasonMalformedBody] == 0 {
		t.Fatalf("the forged record was not reported: %+v", rec.Stats)
	}
	if len(rec.Records) == 0 || string(rec.Records[0].Batch.Payload) != "first" {
		t.Fatalf("records %+v", rec.Records)
	}
}

// TestHardeningCreateWithoutSpace: a WAL larger than the free space is
// refused before anything is created; an allocation that fails (ENOSPC)
// is an error and leaves no file.
func TestHardeningCreateWithoutSpace(t *testing.T) {
	dir := t.TempDir()
	free, err := freeBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	tooBig := (free/BlockSize + 1<<20) * BlockSize // 4 GiB more than is free
	path := filepath.Join(dir, "big.wal")
	_, err = Create(path, CreateOptions{Capacity: tooBig, NodeID: 1, NodeEpoch: 1})
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Create(%d bytes, %d free) = %v, want ErrNoSpace", tooBig, free, err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file was left: %v", err)
	}

	full := func(int, uint32, int64, int64) error { return unix.ENOSPC }
	_, err = Create(path, CreateOptions{Capacity: 1 << 20, NodeID: 1, NodeEpoch: 1, allocate: full})
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Create with ENOSPC = %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file was left after ENOSPC: %v", err)
	}
	// A file system without fallocate still gets its (sparse) WAL.
	unsupported := func(int, uint32, int64, int64) error { return unix.EOPNOTSUPP }
	w, err := Create(path, CreateOptions{Capacity: 1 << 20, NodeID: 1, NodeEpoch: 1, allocate: unsupported})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// TestHardeningWALFileKinds is finding 6 of the hardening table for the
// WAL: a WAL is a regular file or a block device; a FIFO (which blocked
// the reader on open), /dev/zero (which never ends), a directory are
// refused at once, naming what they are, for reading and for writing.
func TestHardeningWALFileKinds(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "wal.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, kind string }{{fifo, "a FIFO"}, {"/dev/zero", "a character device"}, {dir, "a directory"}} {
		for name, open := range map[string]func() error{
			"Open":       func() error { _, err := Open(tc.path); return err },
			"OpenWriter": func() error { _, err := OpenWriter(tc.path, OpenOptions{}); return err },
			"Create": func() error {
				_, err := Create(tc.path, CreateOptions{Capacity: 1 << 20})
				return err
			},
		} {
			done := make(chan error, 1)
			go func() { done <- open() }()
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotWALFile) || !strings.Contains(err.Error(), tc.kind) || !strings.Contains(err.Error(), tc.path) {
					t.Errorf("%s(%s): %v, want ErrNotWALFile naming %s", name, tc.path, err, tc.kind)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s(%s): still running after 5s", name, tc.path)
			}
		}
	}
	// A new WAL is its owner's only.
	p := filepath.Join(dir, "b1.wal")
	w, err := Create(p, CreateOptions{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("a new WAL: %v %v, want mode 0600", st.Mode(), err)
	}
}
