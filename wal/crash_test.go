package wal

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// written is a record the test appended and saw acknowledged.
type written struct {
	offset int64
	batch  Batch
}

func (x written) size() int64 { return int64(x.batch.recordSize()) }

func testBatch(rng *rand.Rand, stream uint64, base uint64, n int) Batch {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.IntN(256))
	}
	return Batch{StreamID: stream, Epoch: 1, BaseOffset: base, Count: uint32(1 + rng.IntN(5)), Payload: p}
}

func appendGroup(t *testing.T, w *Writer, batches []Batch) []written {
	t.Helper()
	offs, err := w.AppendAll(context.Background(), batches)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]written, len(batches))
	for i := range batches {
		out[i] = written{offset: offs[i], batch: batches[i]}
	}
	return out
}

// checkRecovered asserts that rec holds exactly want, in order.
func checkRecovered(t *testing.T, label string, rec *Recovery, want []written) {
	t.Helper()
	if len(rec.Records) != len(want) {
		t.Fatalf("%s: recovered %d records, want %d (end %d %q)", label, len(rec.Records), len(want), rec.Stats.EndOffset, rec.Stats.EndReason)
	}
	for i, w := range want {
		got := rec.Records[i]
		if got.Offset != w.offset || !batchEqual(got.Batch, w.batch) {
			t.Fatalf("%s: record %d at %d (stream %d base %d), want offset %d (stream %d base %d)", label, i,
				got.Offset, got.Batch.StreamID, got.Batch.BaseOffset, w.offset, w.batch.StreamID, w.batch.BaseOffset)
		}
	}
}

// cutReader returns io.EOF for every byte at or beyond cut: the device ends
// there.
type cutReader struct {
	img []byte
	cut int64
}

func (c cutReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= c.cut {
		return 0, io.EOF
	}
	n := copy(p, c.img[off:min(int64(len(c.img)), c.cut)])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// recoverInChunks is Recover reading 8 KiB at a time, so that records
// cross the reader's chunk boundaries.
func recoverInChunks(r io.ReaderAt, size int64, name string) (*Recovery, error) {
	rd, err := newReader(r, size, name, false, readerOptions{chunk: 8 << 10})
	if err != nil {
		return nil, err
	}
	return rd.collect()
}

// TestCrashEveryCutPoint writes a log, then for every byte position inside
// the blocks of the last two group commits simulates a crash that stopped
// the write there: the device ends at the cut (truncate), the bytes after it
// still hold what was there before (zero-fill), or the byte at the cut is
// garbage and the rest was never written (flip). Recovery must return
// exactly the records that were completely written before the cut.
func TestCrashEveryCutPoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	path := filepath.Join(t.TempDir(), "wal")
	const capacity = 64 << 10
	w, err := Create(path, CreateOptions{Capacity: capacity, NodeID: 1, NodeEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	var all []written
	all = append(all, appendGroup(t, w, []Batch{testBatch(rng, 1, 0, 100), testBatch(rng, 2, 0, 300), testBatch(rng, 1, 10, 50)})...)
	all = append(all, appendGroup(t, w, []Batch{testBatch(rng, 3, 0, 5000)})...)
	if err := w.Trim(all[0].offset); err != nil { // the first record is trimmed
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lastStart := w.NextOffset()
	all = append(all, appendGroup(t, w, []Batch{testBatch(rng, 1, 20, 700), testBatch(rng, 2, 30, 1), testBatch(rng, 4, 0, 2500), testBatch(rng, 1, 25, 9)})...)
	all = append(all, appendGroup(t, w, []Batch{testBatch(rng, 5, 0, 3000), testBatch(rng, 5, 3, 1500)})...)
	lastEnd := w.NextOffset()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Close rewrote a header slot; the crash happens before it.
	copy(after[:HeaderRegionSize], before[:HeaderRegionSize])
	live := all[1:]

	full, err := recoverInChunks(bytes.NewReader(after), capacity, "after")
	if err != nil {
		t.Fatal(err)
	}
	checkRecovered(t, "no crash", full, live)

	lo, hi := physical(lastStart, capacity), physical(lastStart, capacity)+(lastEnd-lastStart)
	if hi > capacity {
		t.Fatalf("test log wrapped: [%d, %d)", lo, hi)
	}
	expect := func(cut int64) []written {
		var out []written
		for _, r := range live {
			if physical(r.offset, capacity)+r.size() <= cut {
				out = append(out, r)
			}
		}
		return out
	}
	img := make([]byte, capacity)
	imgPath := filepath.Join(t.TempDir(), "img") // a sample of the images also goes through Open
	for cut := lo; cut < hi; cut++ {
		want := expect(cut)
		rec, err := recoverInChunks(cutReader{img: after, cut: cut}, capacity, "truncated")
		if err != nil {
			t.Fatalf("truncate at %d: %v", cut, err)
		}
		checkRecovered(t, fmt.Sprintf("truncate at %d", cut), rec, want)

		copy(img, after[:cut])
		copy(img[cut:], before[cut:])
		rec, err = recoverInChunks(bytes.NewReader(img), capacity, "zero-filled")
		if err != nil {
			t.Fatalf("zero-fill at %d: %v", cut, err)
		}
		checkRecovered(t, fmt.Sprintf("zero-fill at %d", cut), rec, want)
		if cut%13 == 0 {
			checkMappedSame(t, imgPath, img, rec)
		}

		img[cut] = after[cut] ^ 0xFF
		rec, err = recoverInChunks(bytes.NewReader(img), capacity, "flipped")
		if err != nil {
			t.Fatalf("flip at %d: %v", cut, err)
		}
		checkRecovered(t, fmt.Sprintf("flip at %d", cut), rec, want)
		if cut%13 == 1 {
			checkMappedSame(t, imgPath, img, rec)
		}
	}
}

// TestCorruptionNeverYieldsRecord flips every byte of a complete log in
// turn: the damaged record is never returned, an intact record is lost only
// where the rules say so (the rest of its block when the damage is
// mid-block, the rest of the log when the damaged record starts a block),
// and no record is ever returned twice or with other content.
func TestCorruptionNeverYieldsRecord(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	path := filepath.Join(t.TempDir(), "wal")
	const capacity = 32 << 10
	w, err := Create(path, CreateOptions{Capacity: capacity, NodeID: 1, NodeEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	var all []written
	all = append(all, appendGroup(t, w, []Batch{testBatch(rng, 1, 0, 200), testBatch(rng, 1, 5, 400), testBatch(rng, 1, 9, 10)})...)
	all = append(all, appendGroup(t, w, []Batch{testBatch(rng, 2, 0, 1000), testBatch(rng, 2, 4, 30)})...)
	all = append(all, appendGroup(t, w, []Batch{testBatch(rng, 3, 0, 64)})...)
	end := w.NextOffset()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	startPhys := physical(all[0].offset, capacity)
	endPhys := startPhys + (end - all[0].offset)
	img := make([]byte, len(good))
	imgPath := filepath.Join(t.TempDir(), "img") // a sample of the images also goes through Open
	for pos := startPhys; pos < endPhys; pos++ {
		copy(img, good)
		img[pos] ^= 0x5A
		rec, err := recoverInChunks(bytes.NewReader(img), capacity, "flipped")
		if err != nil {
			t.Fatal(err)
		}
		if pos%3 == 0 {
			checkMappedSame(t, imgPath, img, rec)
		}
		// The record holding the damaged byte, if any.
		hit := -1
		for i, r := range all {
			p := physical(r.offset, capacity)
			if pos >= p && pos < p+r.size() {
				hit = i
			}
		}
		var want []written
		for i, r := range all {
			switch {
			case hit < 0 || i < hit:
				want = append(want, r)
			case i == hit:
			case isAligned(all[hit].offset):
				// A damaged record on a block boundary ends the log.
			case r.offset/BlockSize == all[hit].offset/BlockSize:
				// Mid-block damage: the rest of the block is skipped.
			default:
				want = append(want, r)
			}
		}
		checkRecovered(t, fmt.Sprintf("flip at %d (record %d)", pos, hit), rec, want)
	}
}

// checkMappedSame asserts that scanning img written to path (Open: the mapped,
// in-place path) gives exactly rec, what Recover gave through ReaderAt.
func checkMappedSame(t *testing.T, path string, img []byte, rec *Recovery) {
	t.Helper()
	// Overwrite in place: truncating and reallocating the file each time is
	// what would make this slow.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(img, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := RecoverFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Fatalf("mapped scan differs from ReaderAt scan:\n got %+v\nwant %+v", got.Stats, rec.Stats)
	}
}
