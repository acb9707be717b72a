package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// writeImage writes img to a new file and returns its path.
func writeImage(t *testing.T, img []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "wal")
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readImage(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkReset checks a WAL image before and after a Reset from the header
// before: only the 56 bytes of the slot that did not win changed, and they
// are the header AutoMQ's writer would write next, byte by byte: the same
// magic, capacity, window, shutdown type, node id and epoch, the trim
// offset alignUp(trim + capacity) - 1 and a timestamp one larger, with its
// CRC. Then the WAL reads back with no record under its own version's
// recovery rules.
func checkReset(t *testing.T, path string, before []byte, h Header, slot int, res ResetResult) {
	t.Helper()
	after := readImage(t, path)
	if res.Outcome != ResetDone || res.BeforeSlot != slot || res.AfterSlot != 1-slot {
		t.Fatalf("Reset = %+v, want done from slot %d to slot %d", res, slot, 1-slot)
	}
	lo := (1 - slot) * BlockSize
	for i := range after {
		if (i < lo || i >= lo+HeaderSize) && after[i] != before[i] {
			t.Fatalf("byte %d changed outside the header written (slot %d)", i, 1-slot)
		}
	}
	got := after[lo : lo+HeaderSize]
	old := before[slot*BlockSize : slot*BlockSize+HeaderSize]
	be := binary.BigEndian
	wantTrim := (h.TrimOffset+int64(h.Capacity)+BlockSize-1)/BlockSize*BlockSize - 1
	switch {
	case !bytes.Equal(got[0:12], old[0:12]):
		t.Errorf("magic and capacity % x, were % x", got[0:12], old[0:12])
	case int64(be.Uint64(got[12:])) != wantTrim:
		t.Errorf("trim offset %d, want %d", int64(be.Uint64(got[12:])), wantTrim)
	case be.Uint64(got[20:]) != be.Uint64(old[20:])+1:
		t.Errorf("last_write_timestamp %d, want %d", be.Uint64(got[20:]), be.Uint64(old[20:])+1)
	case !bytes.Equal(got[28:52], old[28:52]):
		t.Errorf("window, shutdown type, node id and epoch % x, were % x", got[28:52], old[28:52])
	case be.Uint32(got[52:]) != Checksum(got[:52]):
		t.Errorf("header CRC %08x, want %08x", be.Uint32(got[52:]), Checksum(got[:52]))
	}
	rec, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Slot != 1-slot || rec.Header.Version() != h.Version() || rec.Header.TrimOffset != wantTrim || len(rec.Records) != 0 {
		t.Fatalf("after the reset: slot %d, version %d, trim %d, %d records; want slot %d, version %d, trim %d, none",
			rec.Slot, rec.Header.Version(), rec.Header.TrimOffset, len(rec.Records), 1-slot, h.Version(), wantTrim)
	}
	if res.After != rec.Header {
		t.Fatalf("Reset says the header is %+v, the WAL reads %+v", res.After, rec.Header)
	}
}

// TestResetGolden resets the hand-built images of both format versions and
// checks every byte (checkReset), then that resetting again, or with
// another node, or from another trim offset, writes nothing.
func TestResetGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.file, func(t *testing.T) {
			img := loadHex(t, tc.file)
			path := writeImage(t, img)
			h, slot, err := ReadHeader(path)
			if err != nil || slot != tc.slot || h.Magic != tc.header.Magic || h.TrimOffset != tc.header.TrimOffset {
				t.Fatalf("ReadHeader = %+v, %d, %v", h, slot, err)
			}
			if rec, err := RecoverFile(path); err != nil || len(rec.Records) == 0 {
				t.Fatalf("before the reset: %v records, %v", rec, err)
			}

			if _, err := Reset(path, ResetOptions{NodeID: h.NodeID + 1, TrimOffset: h.TrimOffset}); !errors.Is(err, ErrWrongNode) {
				t.Fatalf("Reset of node %d = %v, want ErrWrongNode", h.NodeID+1, err)
			}
			if _, err := Reset(path, ResetOptions{NodeID: h.NodeID, TrimOffset: h.TrimOffset + 1}); !errors.Is(err, ErrTrimMismatch) {
				t.Fatalf("Reset from trim %d = %v, want ErrTrimMismatch", h.TrimOffset+1, err)
			}
			if !bytes.Equal(readImage(t, path), img) {
				t.Fatal("a refused reset changed the WAL")
			}

			res, err := Reset(path, ResetOptions{NodeID: h.NodeID, TrimOffset: h.TrimOffset})
			if err != nil {
				t.Fatal(err)
			}
			checkReset(t, path, img, h, slot, res)

			// Twice is harmless: the second finds its own header.
			done := readImage(t, path)
			again, err := Reset(path, ResetOptions{NodeID: h.NodeID, TrimOffset: h.TrimOffset})
			if err != nil || again.Outcome != ResetAlready || again.After != res.After {
				t.Fatalf("second Reset = %+v, %v; want already_reset", again, err)
			}
			// From an older trim offset than the header's: moved on.
			moved, err := Reset(path, ResetOptions{NodeID: h.NodeID, TrimOffset: -1})
			if err != nil || moved.Outcome != ResetMovedOn {
				t.Fatalf("Reset from an older trim offset = %+v, %v; want moved_on", moved, err)
			}
			if !bytes.Equal(readImage(t, path), done) {
				t.Fatal("a second reset changed the WAL")
			}
		})
	}
}

// TestResetWrittenLog resets logs the Writer wrote, with many records
// across wraps of the ring, in version 1 and turned into version 0 (the
// same bytes under the V0 magic, as AutoMQ 1.4.1 reads them): no record is
// found after it, the version stays, and a writer reopening it continues
// past it.
func TestResetWrittenLog(t *testing.T) {
	for _, version := range []int{1, 0} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "wal")
			const capacity = 64 << 10
			w, err := Create(path, CreateOptions{Capacity: capacity, NodeID: 7, NodeEpoch: 11})
			if err != nil {
				t.Fatal(err)
			}
			// Groups of 5 records share a block; each group trims the one
			// before, so the log goes round the 14-block ring 4 times and
			// ends with one group untrimmed.
			payload := bytes.Repeat([]byte{'x'}, 700)
			var prev int64 = -1
			for g := range 60 {
				batches := make([]Batch, 5)
				for i := range batches {
					batches[i] = Batch{StreamID: 1, Epoch: 1, BaseOffset: uint64(5*g + i), Count: 1, Payload: payload}
				}
				offs, err := w.AppendAll(context.Background(), batches)
				if err != nil {
					t.Fatal(err)
				}
				if prev >= 0 {
					if err := w.Trim(prev); err != nil {
						t.Fatal(err)
					}
				}
				prev = offs[len(offs)-1]
			}
			if err := w.Abandon(); err != nil { // a dead broker's WAL: no shutdown header
				t.Fatal(err)
			}
			if version == 0 {
				if err := asV0(path); err != nil {
					t.Fatal(err)
				}
			}
			rec, err := RecoverFile(path)
			if err != nil || rec.Header.Version() != version || len(rec.Records) != 5 || rec.Header.TrimOffset < int64(capacity)*3 {
				t.Fatalf("before the reset: version %d, %d records, %v", rec.Header.Version(), len(rec.Records), err)
			}
			img := readImage(t, path)
			res, err := Reset(path, ResetOptions{NodeID: 7, TrimOffset: rec.Header.TrimOffset})
			if err != nil {
				t.Fatal(err)
			}
			checkReset(t, path, img, rec.Header, rec.Slot, res)

			// The broker starting again continues past everything.
			w, err = OpenWriter(path, OpenOptions{NodeEpoch: 12})
			if err != nil {
				t.Fatal(err)
			}
			off, err := w.Append(context.Background(), Batch{StreamID: 1, Epoch: 2, BaseOffset: 300, Count: 1, Payload: []byte("after")})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if off <= res.After.TrimOffset {
				t.Fatalf("first record after the reset at %d, not past the reset's trim offset %d", off, res.After.TrimOffset)
			}
			rec, err = RecoverFile(path)
			if err != nil || len(rec.Records) != 1 || string(rec.Records[0].Batch.Payload) != "after" {
				t.Fatalf("after reopening: %+v, %v", rec, err)
			}
		})
	}
}

// asV0 rewrites both header slots of a WAL the Writer made with the
// version 0 magic (and their CRCs): a log without padding records is then
// what AutoMQ 1.4.1 would have written.
func asV0(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	for slot := range HeaderSlots {
		var p [HeaderSize]byte
		if _, err := f.ReadAt(p[:], int64(slot)*BlockSize); err != nil {
			return err
		}
		h, err := decodeHeader(p[:])
		if err != nil {
			return err
		}
		h.Magic = MagicV0
		encodeHeader(p[:], &h)
		if _, err := f.WriteAt(p[:], int64(slot)*BlockSize); err != nil {
			return err
		}
	}
	return f.Sync()
}

// TestResetTornWrite: a reset cut in the middle of its header write (a
// crash) leaves the header in force untouched, so the WAL reads as before;
// running the reset again completes it.
func TestResetTornWrite(t *testing.T) {
	img := loadHex(t, "v0-basic.hex")
	path := writeImage(t, img)
	h, slot, err := ReadHeader(path)
	if err != nil {
		t.Fatal(err)
	}
	next := h
	next.TrimOffset = ResetTrimOffset(h.TrimOffset, int64(h.Capacity))
	next.LastWriteTimestamp++
	var p [HeaderSize]byte
	encodeHeader(p[:], &next)
	torn := bytes.Clone(img)
	copy(torn[(1-slot)*BlockSize:], p[:30]) // the first 30 bytes reached the disk
	if err := os.WriteFile(path, torn, 0o644); err != nil {
		t.Fatal(err)
	}
	rec, err := RecoverFile(path)
	if err != nil || rec.Slot != slot || rec.Header.TrimOffset != h.TrimOffset || len(rec.Records) != 2 {
		t.Fatalf("after a torn reset: slot %d, trim %d, %d records, %v; want the WAL as before", rec.Slot, rec.Header.TrimOffset, len(rec.Records), err)
	}
	res, err := Reset(path, ResetOptions{NodeID: h.NodeID, TrimOffset: h.TrimOffset})
	if err != nil {
		t.Fatal(err)
	}
	checkReset(t, path, torn, h, slot, res)
}

// TestResetRefuses: a file that is not a WAL, or whose size disagrees with
// its header, or a negative expected trim offset other than -1, is refused
// and left as it is.
func TestResetRefuses(t *testing.T) {
	notWAL := writeImage(t, make([]byte, 3*BlockSize))
	if _, err := Reset(notWAL, ResetOptions{NodeID: 1, TrimOffset: -1}); !errors.Is(err, ErrNotWAL) {
		t.Fatalf("Reset of zeros = %v, want ErrNotWAL", err)
	}
	img := loadHex(t, "v1-basic.hex")
	short := writeImage(t, img[:len(img)-BlockSize])
	if _, err := Reset(short, ResetOptions{NodeID: 7, TrimOffset: 32768}); !errors.Is(err, ErrCapacityMismatch) {
		t.Fatalf("Reset of a truncated WAL = %v, want ErrCapacityMismatch", err)
	}
	if !bytes.Equal(readImage(t, short), img[:len(img)-BlockSize]) {
		t.Fatal("a refused reset changed the file")
	}
	if _, err := Reset(writeImage(t, img), ResetOptions{NodeID: 7, TrimOffset: -2}); !errors.Is(err, ErrTrimMismatch) {
		t.Fatalf("Reset from trim -2 = %v, want ErrTrimMismatch", err)
	}
	if _, err := Reset(filepath.Join(t.TempDir(), "missing"), ResetOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Reset of a missing file = %v", err)
	}
}

// TestResetTrimOffset pins the arithmetic: a fresh WAL's -1 becomes
// capacity - 1; an aligned sum stays; an unaligned one rounds up.
func TestResetTrimOffset(t *testing.T) {
	for _, c := range []struct{ trim, capacity, want int64 }{
		{-1, 32768, 32767},
		{32767, 32768, 65535},
		{32768, 32768, 65535},
		{32800, 32768, 69631},
		{40000, 1 << 20, 1089535},
	} {
		if got := ResetTrimOffset(c.trim, c.capacity); got != c.want {
			t.Errorf("ResetTrimOffset(%d, %d) = %d, want %d", c.trim, c.capacity, got, c.want)
		}
	}
}
