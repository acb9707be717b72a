package wal

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestWrapAroundWithTrims appends records of random sizes into a small ring
// for many trips round it, trimming whenever the ring is full. It checks
// that ErrFull happens only when the record really does not fit, and that
// recovery always returns exactly the acknowledged, untrimmed records.
func TestWrapAroundWithTrims(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	path := filepath.Join(t.TempDir(), "wal")
	const capacity = 40 << 10
	const recordCap = capacity - HeaderRegionSize
	w, err := Create(path, CreateOptions{Capacity: capacity, NodeID: 1, NodeEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx := context.Background()
	var live []written // acknowledged records after the trim offset
	trim := w.Header().TrimOffset
	fulls := 0
	paddingSeen := int64(0)
	start := w.NextOffset()
	for i := 0; i < 300; i++ {
		n := 1 + rng.IntN(3)
		batches := make([]Batch, n)
		for j := range batches {
			batches[j] = testBatch(rng, uint64(j), uint64(i), rng.IntN(6000))
		}
		next := w.NextOffset()
		offs, err := w.AppendAll(ctx, batches)
		if errors.Is(err, ErrFull) {
			fulls++
			// The first record that failed must really not fit: its block
			// (plus padding when it would cross the end) reaches past
			// trim + ring capacity.
			k := 0
			for offs[k] >= 0 {
				live = append(live, written{offset: offs[k], batch: batches[k]})
				k++
			}
			at := next
			if k > 0 {
				at = alignUp(offs[k-1] + int64(batches[k-1].recordSize()))
			}
			size := int64(batches[k].recordSize())
			if rem := recordCap - at%recordCap; rem < size {
				at += rem
			}
			if at+size <= trim+recordCap {
				t.Fatalf("ErrFull for %d bytes at %d with trim %d: it fits", size, at, trim)
			}
			for j := k + 1; j < n; j++ {
				if offs[j] >= 0 {
					live = append(live, written{offset: offs[j], batch: batches[j]})
				}
			}
			// Trim about half of what is live; trimming is inclusive.
			if len(live) == 0 {
				t.Fatalf("ErrFull with nothing live")
			}
			cut := len(live) / 2
			trim = live[cut].offset
			if err := w.Trim(trim); err != nil {
				t.Fatal(err)
			}
			live = append([]written(nil), live[cut+1:]...)
		} else if err != nil {
			t.Fatal(err)
		} else {
			for j := range batches {
				live = append(live, written{offset: offs[j], batch: batches[j]})
			}
		}
		if i%10 == 0 {
			rec, err := RecoverFile(path)
			if err != nil {
				t.Fatal(err)
			}
			checkRecovered(t, "wrap", rec, live)
			paddingSeen += rec.Stats.SkippedByReason[ReasonPadding]
		}
	}
	laps := (w.NextOffset() - start) / recordCap
	if laps < 5 || fulls == 0 {
		t.Fatalf("test did not exercise the ring: %d laps, %d ErrFull", laps, fulls)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkRecovered(t, "after close", rec, live)
	if paddingSeen == 0 {
		t.Errorf("no padding record seen in %d laps", laps)
	}
	t.Logf("%d laps, %d ErrFull, padding bytes seen %d", laps, fulls, paddingSeen)
}

// TestConcurrentAppenders runs appenders in parallel with a trimmer; every
// acknowledged record must be recovered exactly once, at its offset, and
// groups must have formed.
func TestConcurrentAppenders(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal")
	w, err := Create(path, CreateOptions{Capacity: 4 << 20, NodeID: 2, NodeEpoch: 7})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const appenders, each = 8, 40
	var mu sync.Mutex
	var acked []written
	var wg sync.WaitGroup
	for a := 0; a < appenders; a++ {
		wg.Add(1)
		go func(a int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(a), 9))
			for i := 0; i < each; i++ {
				b := testBatch(rng, uint64(a), uint64(i), rng.IntN(3000))
				off, err := w.Append(ctx, b)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked = append(acked, written{offset: off, batch: b})
				mu.Unlock()
			}
		}(a)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Records) != appenders*each {
		t.Fatalf("recovered %d records, want %d", len(rec.Records), appenders*each)
	}
	byOffset := map[int64]Batch{}
	for _, r := range rec.Records {
		if _, dup := byOffset[r.Offset]; dup {
			t.Fatalf("offset %d recovered twice", r.Offset)
		}
		byOffset[r.Offset] = r.Batch
	}
	shared := 0
	blocks := map[int64]int{}
	for _, a := range acked {
		got, ok := byOffset[a.offset]
		if !ok || !batchEqual(got, a.batch) {
			t.Fatalf("acknowledged record at %d not recovered intact", a.offset)
		}
		blocks[a.offset/BlockSize]++
	}
	for _, n := range blocks {
		if n > 1 {
			shared++
		}
	}
	t.Logf("%d records in %d blocks, %d blocks with more than one record", len(acked), len(blocks), shared)
}

func TestOpenWriterResetsPastOldRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal")
	w, err := Create(path, CreateOptions{Capacity: 64 << 10, NodeID: 3, NodeEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 5; i++ {
		if _, err := w.Append(ctx, testBatch(rng, 1, uint64(i), 500)); err != nil {
			t.Fatal(err)
		}
	}
	// No Close: the writer "crashed"; the header is ungraceful.
	old, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(old.Records) != 5 || old.Header.ShutdownType != ShutdownUngraceful {
		t.Fatalf("before reopen: %d records, shutdown %v", len(old.Records), old.Header.ShutdownType)
	}
	if err := w.Abandon(); err != nil {
		t.Fatal(err)
	}

	w2, err := OpenWriter(path, OpenOptions{NodeEpoch: 2})
	if err != nil {
		t.Fatal(err)
	}
	h := w2.Header()
	if h.NodeID != 3 || h.NodeEpoch != 2 || h.Magic != MagicV1 {
		t.Fatalf("reopened header %+v", h)
	}
	if w2.NextOffset() <= old.Records[4].Offset+int64(old.Records[4].Size) || !isAligned(w2.NextOffset()) {
		t.Fatalf("next offset %d does not start past the old log", w2.NextOffset())
	}
	rec, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Records) != 0 {
		t.Fatalf("old records visible after reset: %d", len(rec.Records))
	}
	b := testBatch(rng, 9, 0, 100)
	off, err := w2.Append(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err = RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkRecovered(t, "after reopen", rec, []written{{offset: off, batch: b}})
	if rec.Header.ShutdownType != ShutdownGraceful {
		t.Fatalf("shutdown type %v after Close", rec.Header.ShutdownType)
	}
}

func TestOpenWriterUpgradesV0(t *testing.T) {
	img := loadHex(t, "v0-basic.hex")
	path := filepath.Join(t.TempDir(), "wal")
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWriter(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(context.Background(), Batch{StreamID: 1, Count: 1, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Header.Version() != 1 || rec.Header.NodeID != 5 || rec.Header.NodeEpoch != 9 || len(rec.Records) != 1 {
		t.Fatalf("after upgrade: version %d, node %d/%d, %d records", rec.Header.Version(), rec.Header.NodeID, rec.Header.NodeEpoch, len(rec.Records))
	}
}

func TestHeaderSlotSelection(t *testing.T) {
	base := loadHex(t, "v1-basic.hex")
	cases := []struct {
		name   string
		mutate func(img []byte)
		slot   int
		err    error
	}{
		{"newer slot 1 wins", func([]byte) {}, 1, nil},
		{"slot 1 bad crc", func(img []byte) { img[BlockSize+30] ^= 1 }, 0, nil},
		{"slot 0 bad crc", func(img []byte) { img[30] ^= 1 }, 1, nil},
		{"tie goes to slot 0", func(img []byte) {
			copy(img[BlockSize:BlockSize+HeaderSize], img[:HeaderSize])
			img[BlockSize+39] = 0 // graceful in slot 1 only
			reCRC(img[BlockSize:])
		}, 0, nil},
		{"both bad crc", func(img []byte) { img[30] ^= 1; img[BlockSize+30] ^= 1 }, 0, ErrHeaderCRC},
		{"no magic", func(img []byte) { clear(img[:HeaderRegionSize]) }, 0, ErrNotWAL},
		{"one bad crc one no magic", func(img []byte) { img[30] ^= 1; clear(img[BlockSize : BlockSize+HeaderSize]) }, 0, ErrHeaderCRC},
		{"unaligned capacity", func(img []byte) { setCapacity(img, 32769) }, 0, ErrBadCapacity},
		{"tiny capacity", func(img []byte) { setCapacity(img, 4096) }, 0, ErrBadCapacity},
		{"capacity larger than device", func(img []byte) { setCapacity(img, 65536) }, 0, ErrCapacityMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			img := append([]byte(nil), base...)
			tc.mutate(img)
			rd, err := NewReader(bytes.NewReader(img), int64(len(img)), "img")
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("error %v, want %v", err, tc.err)
				}
				if !strings.Contains(err.Error(), "img") {
					t.Fatalf("error %q does not name the file", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rd.Slot() != tc.slot {
				t.Fatalf("slot %d, want %d", rd.Slot(), tc.slot)
			}
		})
	}
}

func reCRC(slot []byte) {
	var h Header
	h, _ = decodeHeader(slot[:HeaderSize])
	encodeHeader(slot[:HeaderSize], &h)
}

func setCapacity(img []byte, c uint64) {
	for _, off := range []int{0, BlockSize} {
		h, _ := decodeHeader(img[off : off+HeaderSize])
		h.Capacity = c
		encodeHeader(img[off:off+HeaderSize], &h)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	img := loadHex(t, "v1-basic.hex")
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name string
		path string
		err  error
	}{
		{"truncated file", write("short", img[:len(img)-BlockSize]), ErrCapacityMismatch},
		{"extended file", write("long", append(append([]byte(nil), img...), make([]byte, BlockSize)...)), ErrCapacityMismatch},
		{"not a wal", write("text", bytes.Repeat([]byte("hello world\n"), 2000)), ErrNotWAL},
		{"empty file", write("empty", nil), ErrNotWAL},
		{"missing file", filepath.Join(dir, "missing"), os.ErrNotExist},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RecoverFile(tc.path)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("error %q does not name %s", err, tc.path)
			}
		})
	}
}

func TestReaderNeverWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal")
	if err := os.WriteFile(path, loadHex(t, "v1-basic.hex"), 0o444); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	// A read-only file opens and recovers: the reader never asks for write access.
	rec, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Records) != 2 {
		t.Fatalf("%d records", len(rec.Records))
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("file changed")
	}
}

func TestWriterErrors(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	path := filepath.Join(dir, "wal")
	if _, err := Create(path, CreateOptions{Capacity: 10000}); !errors.Is(err, ErrBadCapacity) || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("bad capacity: %v", err)
	}
	w, err := Create(path, CreateOptions{Capacity: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path, CreateOptions{Capacity: 16 << 10}); !errors.Is(err, ErrExists) {
		t.Fatalf("create over existing file: %v", err)
	}
	if _, err := w.Append(ctx, Batch{Payload: make([]byte, 8192)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	if err := w.Trim(w.NextOffset()); !errors.Is(err, ErrBadTrim) {
		t.Fatalf("trim past the end: %v", err)
	}
	// The ring holds two blocks; the third record does not fit until a trim
	// past the first one (the record at the trim offset itself stays: recovery
	// reads it to skip it).
	if _, err := w.Append(ctx, Batch{Payload: make([]byte, 3000)}); err != nil {
		t.Fatal(err)
	}
	off, err := w.Append(ctx, Batch{Payload: make([]byte, 3000)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, Batch{Payload: make([]byte, 3000)}); !errors.Is(err, ErrFull) {
		t.Fatalf("full ring: %v", err)
	}
	if err := w.Trim(off); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, Batch{Payload: make([]byte, 3000)}); err != nil {
		t.Fatalf("after trim: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := w.Append(cctx, Batch{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, Batch{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	if err := w.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if _, err := OpenWriter(filepath.Join(dir, "nope"), OpenOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open missing: %v", err)
	}
}

// TestReaderSurvivesShrinkingFile truncates the file under an open Reader:
// the mapped scan reports an error naming the file instead of crashing.
func TestReaderSurvivesShrinkingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal")
	w, err := Create(path, CreateOptions{Capacity: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := w.Append(context.Background(), Batch{StreamID: 1, Payload: make([]byte, 100)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rd, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if rd.mapped == nil {
		t.Skip("the file could not be mapped")
	}
	if err := os.Truncate(path, HeaderRegionSize); err != nil {
		t.Fatal(err)
	}
	if _, err = rd.Next(); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Next on a shrunk mapped file: %v", err)
	}
}

// TestWriterFailsAfterIOError makes the data writes fail (the descriptor is
// swapped for a read-only one): the append fails, every later append fails
// at once, and Close leaves the header ungraceful and reports the failure.
func TestWriterFailsAfterIOError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal")
	w, err := Create(path, CreateOptions{Capacity: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Append(ctx, Batch{StreamID: 1, Payload: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	w.writeMu.Lock()
	rw := w.f
	w.f, w.fd = ro, int(ro.Fd())
	w.writeMu.Unlock()
	defer rw.Close()
	if _, err := w.Append(ctx, Batch{StreamID: 1, Payload: []byte("lost")}); !errors.Is(err, ErrFailed) {
		t.Fatalf("append with failing writes: %v", err)
	}
	if _, err := w.Append(ctx, Batch{StreamID: 1, Payload: []byte("refused")}); !errors.Is(err, ErrFailed) {
		t.Fatalf("append after a failure: %v", err)
	}
	if err := w.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("close after a failure: %v", err)
	}
	rec, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Header.ShutdownType != ShutdownUngraceful || len(rec.Records) != 1 {
		t.Fatalf("after failure: shutdown %v, %d records", rec.Header.ShutdownType, len(rec.Records))
	}
}

// TestHealthyWALReportsNoDamage checks that a cleanly written WAL recovers
// with no skipped byte attributed to damage: the start at a fresh WAL's trim
// offset (capacity-1) and block tails are normal, and recovery jobs report
// only damage.
func TestHealthyWALReportsNoDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "healthy.wal")
	w, err := Create(path, CreateOptions{Capacity: 1 << 20, NodeID: 1, NodeEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := w.Append(context.Background(), Batch{StreamID: 1, Epoch: 1, BaseOffset: uint64(i), Count: 1, Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Records) != 20 {
		t.Fatalf("recovered %d records, want 20", len(rec.Records))
	}
	for reason, n := range rec.Stats.SkippedByReason {
		switch reason {
		case ReasonBlockTail, ReasonTrimmedRecord, ReasonPadding:
		default:
			t.Errorf("healthy WAL: %d bytes skipped as %q", n, reason)
		}
	}
}

// TestRecordBodyIsTheEncodedBatch: a record's Body is the body as written
// (the stream record batch encoding, payload included), for readers that
// copy records on without encoding them again; Open maps the file, so the
// views outlive the next call.
func TestRecordBodyIsTheEncodedBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "body.wal")
	w, err := Create(path, CreateOptions{Capacity: MinCapacity * 4, NodeID: 3, NodeEpoch: 9})
	if err != nil {
		t.Fatal(err)
	}
	in := []Batch{{StreamID: 7, Epoch: 2, BaseOffset: 10, Count: 3, Payload: []byte("hello")}, {StreamID: 8, Epoch: 1, BaseOffset: 0, Count: 1, Payload: []byte("")}}
	if _, err := w.AppendAll(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rd, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if !rd.Mapped() {
		t.Fatal("Open did not map a regular file")
	}
	recs := scanAll(t, rd, len(in))
	for i, r := range recs {
		want := make([]byte, BodyHeaderSize, BodyHeaderSize+len(in[i].Payload))
		encodeBodyHeader(want, &in[i])
		want = append(want, in[i].Payload...)
		if !bytes.Equal(r.Body, want) {
			t.Errorf("record %d: body %x, want %x", i, r.Body, want)
		}
		if !bytes.Equal(r.Body[BodyHeaderSize:], in[i].Payload) {
			t.Errorf("record %d: the body's payload is not the batch's", i)
		}
	}
}
