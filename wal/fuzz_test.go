package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// maxFuzzImage bounds the device images the fuzz target builds, and so the
// memory a scan can use (the reader never allocates more than the image).
const maxFuzzImage = 256 << 10

// fuzzImage turns a compact fuzz input into a device image: bytes 0-55 are
// header slot 0, bytes 56-111 header slot 1, and the rest is the record ring
// from physical offset 8192 on. The image is zero-extended to the capacity
// in slot 0 (or slot 1) when that is larger, up to 256 KiB. Small inputs
// keep the fuzzer (and its minimizer) fast.
func fuzzImage(data []byte) []byte {
	var slots [2][]byte
	ring := []byte(nil)
	for i := range slots {
		lo := min(len(data), i*HeaderSize)
		hi := min(len(data), (i+1)*HeaderSize)
		slots[i] = data[lo:hi]
	}
	if len(data) > 2*HeaderSize {
		ring = data[2*HeaderSize:]
	}
	size := HeaderRegionSize + len(ring)
	if len(data) < HeaderSize {
		size = len(data)
	}
	for _, s := range slots {
		if len(s) >= 12 {
			if c := binary.BigEndian.Uint64(s[4:12]); c > uint64(size) && c <= maxFuzzImage {
				size = int(c)
			}
			break
		}
	}
	if size > maxFuzzImage {
		return nil
	}
	img := make([]byte, size)
	copy(img, slots[0])
	if size > BlockSize {
		copy(img[BlockSize:], slots[1])
	}
	if size > HeaderRegionSize {
		copy(img[HeaderRegionSize:], ring)
	}
	return img
}

// FuzzReader feeds arbitrary device images (see fuzzImage) to the reader.
// The reader must not panic, must terminate, and every record it returns
// must carry a matching header CRC, body CRC and body offset, in increasing
// offset order within one ring from the trim offset. The committed corpus
// is in testdata/fuzz/FuzzReader.
func FuzzReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		img := fuzzImage(data)
		if img == nil {
			return
		}
		rd, err := NewReader(bytes.NewReader(img), int64(len(img)), "fuzz")
		if err != nil {
			if !errors.Is(err, ErrNotWAL) && !errors.Is(err, ErrHeaderCRC) && !errors.Is(err, ErrBadCapacity) && !errors.Is(err, ErrCapacityMismatch) && !errors.Is(err, ErrBadHeader) {
				t.Fatalf("unexpected error: %v", err)
			}
			return
		}
		h := rd.Header()
		capacity := int64(h.Capacity)
		recordCap := capacity - HeaderRegionSize
		start := max(h.TrimOffset, 0)
		last := int64(-1)
		for n := 0; ; n++ {
			if n > len(img) {
				t.Fatalf("more records than bytes")
			}
			rec, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec.Offset <= last || rec.Offset < start || rec.Offset >= start+recordCap {
				t.Fatalf("record offset %d after %d, trim %d", rec.Offset, last, h.TrimOffset)
			}
			last = rec.Offset
			checkRawRecord(t, img, capacity, rec)
		}
		st := rd.Stats()
		if st.EndReason == "" || st.EndOffset < start {
			t.Fatalf("scan ended without a reason: %+v", st)
		}
	})
}

// checkRawRecord verifies a returned record against the image bytes with an
// independent decoding.
func checkRawRecord(t *testing.T, img []byte, capacity int64, rec Record) {
	t.Helper()
	pos := physical(rec.Offset, capacity)
	if pos+int64(rec.Size) > capacity {
		t.Fatalf("record at %d runs past the device end", rec.Offset)
	}
	raw := img[pos : pos+int64(rec.Size)]
	be := binary.BigEndian
	if be.Uint32(raw[0:]) != RecordMagicData {
		t.Fatalf("record at %d: magic %x", rec.Offset, be.Uint32(raw[0:]))
	}
	if Checksum(raw[:20]) != be.Uint32(raw[20:]) {
		t.Fatalf("record at %d: header CRC mismatch returned", rec.Offset)
	}
	if int(be.Uint32(raw[4:])) != rec.Size-RecordHeaderSize || int64(be.Uint64(raw[8:])) != rec.Offset+RecordHeaderSize {
		t.Fatalf("record at %d: length or body offset mismatch returned", rec.Offset)
	}
	body := raw[RecordHeaderSize:]
	if Checksum(body) != be.Uint32(raw[16:]) {
		t.Fatalf("record at %d: body CRC mismatch returned", rec.Offset)
	}
	if !bytes.Equal(body[BodyHeaderSize:], rec.Batch.Payload) || body[0] != BodyMagic {
		t.Fatalf("record at %d: payload differs from the image", rec.Offset)
	}
}

// TestFuzzCorpusSeeds checks that the committed seeds describe what their
// names say, so the fuzzer starts from meaningful WALs.
func TestFuzzCorpusSeeds(t *testing.T) {
	want := map[string][]string{
		"v1-two-records":       {"one", "two!"},
		"v1-padding-wrap":      {"kept", "after the wrap"},
		"v1-damaged-mid-block": {"good", "next block"},
		"v0-one-record":        {"one"},
		"headers-only":         nil,
	}
	for name, payloads := range want {
		raw, err := os.ReadFile(filepath.Join("testdata", "fuzz", "FuzzReader", name))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitN(string(raw), "\n", 3)
		lit := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		s, err := strconv.Unquote(lit)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		img := fuzzImage([]byte(s))
		rec, err := Recover(bytes.NewReader(img), int64(len(img)), name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got []string
		for _, r := range rec.Records {
			got = append(got, string(r.Batch.Payload))
		}
		if strings.Join(got, "|") != strings.Join(payloads, "|") {
			t.Errorf("%s: payloads %q, want %q", name, got, payloads)
		}
	}
}
