package wal

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// loadHex builds a device image from a commented hex fixture (syntax in the
// fixture files: "size N", "@0xOFF", hex pairs, "fill N 0xBB", "#" comments).
func loadHex(t testing.TB, name string) []byte {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var img []byte
	pos := 0
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		bad := func(err error) { t.Fatalf("%s:%d: %v", name, line, err) }
		switch {
		case fields[0] == "size":
			n, err := strconv.Atoi(fields[1])
			if err != nil {
				bad(err)
			}
			img = make([]byte, n)
		case strings.HasPrefix(fields[0], "@"):
			n, err := strconv.ParseInt(fields[0][1:], 0, 64)
			if err != nil {
				bad(err)
			}
			pos = int(n)
		case fields[0] == "fill":
			n, err1 := strconv.Atoi(fields[1])
			v, err2 := strconv.ParseUint(fields[2], 0, 8)
			if err1 != nil || err2 != nil {
				bad(fmt.Errorf("bad fill %q", text))
			}
			for i := 0; i < n; i++ {
				img[pos] = byte(v)
				pos++
			}
		default:
			for _, h := range fields {
				b, err := hex.DecodeString(h)
				if err != nil || len(b) != 1 {
					bad(fmt.Errorf("bad byte %q", h))
				}
				img[pos] = b[0]
				pos++
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return img
}

// counterClock returns 1000, 1001, ... as header timestamps.
func counterClock(first uint64) func() uint64 {
	n := first
	return func() uint64 { n++; return n - 1 }
}

func rep(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

type goldenCase struct {
	file    string
	header  Header
	slot    int
	records []Record
	end     int64
	reason  string
	skipped map[string]int64
}

var goldenCases = []goldenCase{
	{
		file: "v1-basic.hex",
		header: Header{Magic: MagicV1, Capacity: 32768, TrimOffset: 32768, LastWriteTimestamp: 1003,
			SlidingWindowMaxLength: 24576, ShutdownType: ShutdownGraceful, NodeID: 7, NodeEpoch: 3, CRC: 0x0da803ca},
		slot: 1,
		records: []Record{
			{Offset: 32830, Size: 63, Batch: Batch{StreamID: 2, Epoch: 1, BaseOffset: 100, Count: 1, Payload: []byte("world!")}},
			{Offset: 36864, Size: 60, Batch: Batch{StreamID: 1, Epoch: 2, BaseOffset: 3, Count: 2, Payload: []byte("xyz")}},
		},
		end:     40960,
		reason:  ReasonRecordMagic,
		skipped: map[string]int64{ReasonTrimmedRecord: 62, ReasonBlockTail: 3971 + 4036},
	},
	{
		file: "v1-wrap.hex",
		header: Header{Magic: MagicV1, Capacity: 24576, TrimOffset: 24576, LastWriteTimestamp: 1003,
			SlidingWindowMaxLength: 16384, ShutdownType: ShutdownGraceful, NodeID: 9, NodeEpoch: 5, CRC: 0x293c67da},
		slot: 1,
		records: []Record{
			{Offset: 32768, Size: 5057, Batch: Batch{StreamID: 7, Epoch: 1, BaseOffset: 1, Count: 10, Payload: rep('B', 5000)}},
		},
		end:     40960,
		reason:  ReasonRingBound,
		skipped: map[string]int64{ReasonTrimmedRecord: 157, ReasonBlockTail: 3939 + 3135, ReasonPadding: 4096},
	},
	{
		file: "v0-basic.hex",
		header: Header{Magic: MagicV0, Capacity: 32768, TrimOffset: 32767, LastWriteTimestamp: 2001,
			SlidingWindowMaxLength: 8192, ShutdownType: ShutdownUngraceful, NodeID: 5, NodeEpoch: 9},
		slot: 1,
		records: []Record{
			{Offset: 32768, Size: 63, Batch: Batch{StreamID: 3, Epoch: 4, BaseOffset: 10, Count: 5, Payload: []byte("v0-one")}},
			{Offset: 32831, Size: 63, Batch: Batch{StreamID: 3, Epoch: 4, BaseOffset: 15, Count: 1, Payload: []byte("v0-two")}},
		},
		reason: ReasonWindow,
	},
}

func TestGoldenRead(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.file, func(t *testing.T) {
			img := loadHex(t, tc.file)
			rec, err := Recover(bytes.NewReader(img), int64(len(img)), tc.file)
			if err != nil {
				t.Fatal(err)
			}
			h := rec.Header
			if tc.header.CRC == 0 {
				h.CRC = 0
			}
			if h != tc.header {
				t.Errorf("header\n got %+v\nwant %+v", h, tc.header)
			}
			if rec.Slot != tc.slot {
				t.Errorf("slot %d, want %d", rec.Slot, tc.slot)
			}
			if len(rec.Records) != len(tc.records) {
				t.Fatalf("%d records, want %d: %+v", len(rec.Records), len(tc.records), rec.Records)
			}
			for i, want := range tc.records {
				got := rec.Records[i]
				if got.Offset != want.Offset || got.Size != want.Size || !batchEqual(got.Batch, want.Batch) {
					t.Errorf("record %d\n got %+v\nwant %+v", i, got, want)
				}
			}
			if tc.end != 0 && rec.Stats.EndOffset != tc.end {
				t.Errorf("end offset %d, want %d", rec.Stats.EndOffset, tc.end)
			}
			if rec.Stats.EndReason != tc.reason {
				t.Errorf("end reason %q, want %q", rec.Stats.EndReason, tc.reason)
			}
			for reason, n := range tc.skipped {
				if rec.Stats.SkippedByReason[reason] != n {
					t.Errorf("skipped %q: %d bytes, want %d (all: %v)", reason, rec.Stats.SkippedByReason[reason], n, rec.Stats.SkippedByReason)
				}
			}
			if tc.skipped != nil {
				var total int64
				for _, n := range tc.skipped {
					total += n
				}
				if rec.Stats.SkippedBytes != total {
					t.Errorf("skipped %d bytes, want %d", rec.Stats.SkippedBytes, total)
				}
			}
		})
	}
}

func batchEqual(a, b Batch) bool {
	return a.StreamID == b.StreamID && a.Epoch == b.Epoch && a.BaseOffset == b.BaseOffset &&
		a.Count == b.Count && bytes.Equal(a.Payload, b.Payload)
}

// TestGoldenWrite checks that the Writer produces the hand-built images byte
// for byte.
func TestGoldenWrite(t *testing.T) {
	ctx := context.Background()
	t.Run("v1-basic.hex", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "wal")
		w, err := Create(path, CreateOptions{Capacity: 32768, NodeID: 7, NodeEpoch: 3,
			WriterOptions: WriterOptions{Clock: counterClock(1000)}})
		if err != nil {
			t.Fatal(err)
		}
		offs, err := w.AppendAll(ctx, []Batch{
			{StreamID: 1, Epoch: 2, BaseOffset: 0, Count: 3, Payload: []byte("hello")},
			{StreamID: 2, Epoch: 1, BaseOffset: 100, Count: 1, Payload: []byte("world!")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if offs[0] != 32768 || offs[1] != 32830 {
			t.Fatalf("offsets %v, want [32768 32830]", offs)
		}
		off, err := w.Append(ctx, Batch{StreamID: 1, Epoch: 2, BaseOffset: 3, Count: 2, Payload: []byte("xyz")})
		if err != nil || off != 36864 {
			t.Fatalf("append C: %d, %v", off, err)
		}
		if err := w.Trim(32768); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		compareImage(t, path, loadHex(t, "v1-basic.hex"))
	})
	t.Run("v1-wrap.hex", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "wal")
		w, err := Create(path, CreateOptions{Capacity: 24576, NodeID: 9, NodeEpoch: 5,
			WriterOptions: WriterOptions{Clock: counterClock(1000)}})
		if err != nil {
			t.Fatal(err)
		}
		off, err := w.Append(ctx, Batch{StreamID: 7, Epoch: 1, BaseOffset: 0, Count: 1, Payload: rep('A', 100)})
		if err != nil || off != 24576 {
			t.Fatalf("append A: %d, %v", off, err)
		}
		if err := w.Trim(24576); err != nil {
			t.Fatal(err)
		}
		off, err = w.Append(ctx, Batch{StreamID: 7, Epoch: 1, BaseOffset: 1, Count: 10, Payload: rep('B', 5000)})
		if err != nil || off != 32768 {
			t.Fatalf("append B: %d, %v", off, err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		compareImage(t, path, loadHex(t, "v1-wrap.hex"))
	})
}

func compareImage(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("image size %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			lo := i / 16 * 16
			t.Fatalf("first difference at byte %d (0x%x)\n got % x\nwant % x", i, i, got[lo:min(lo+32, len(got))], want[lo:min(lo+32, len(want))])
		}
	}
}

// TestHeaderCRCTable checks the table-driven record header CRC against
// hash/crc32 on random headers and on every single-bit message.
func TestHeaderCRCTable(t *testing.T) {
	tab := headerCRC()
	rng := rand.New(rand.NewPCG(5, 6))
	p := make([]byte, RecordHeaderSize)
	for i := 0; i < 10000; i++ {
		for j := range p {
			p[j] = byte(rng.IntN(256))
		}
		if got, want := tab.checksum20(p), Checksum(p[:20]); got != want {
			t.Fatalf("header %x: table CRC %08x, want %08x", p, got, want)
		}
	}
	for bit := 0; bit < 20*8; bit++ {
		clear(p)
		p[bit/8] = 1 << (bit % 8)
		if got, want := tab.checksum20(p), Checksum(p[:20]); got != want {
			t.Fatalf("bit %d: table CRC %08x, want %08x", bit, got, want)
		}
	}
}
