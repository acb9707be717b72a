package object

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"
)

func TestTailReadSize(t *testing.T) {
	for _, c := range []struct{ size, want int64 }{
		{0, 0}, {48, 48}, {8192, 8192}, {9000, 8192},
		{1<<20 - 1, 8192}, {1 << 20, 8192 + 36}, {64 << 20, 8192 + 64*36}, {1 << 30, 8192 + 1024*36},
	} {
		if got := TailReadSize(c.size); got != c.want {
			t.Errorf("TailReadSize(%d) = %d, expected %d", c.size, got, c.want)
		}
	}
}

// An index larger than the tail read needs the second read, from the index
// position to the end, as AutoMQ's ObjectReader does.
func TestReadIndexSecondRead(t *testing.T) {
	var calls [][]Record
	for s := range 300 { // 300 blocks: a 10,800-byte index
		calls = append(calls, []Record{rec(int64(s), 0, 1, 3)})
	}
	obj, l := run(t, DefaultBlockSize, calls...)
	r := &countingReaderAt{r: bytes.NewReader(obj)}
	o, err := ReadIndex(r, int64(len(obj)))
	if err != nil {
		t.Fatal(err)
	}
	if r.reads != 2 {
		t.Fatalf("%d reads, expected the tail and then the index", r.reads)
	}
	if !reflect.DeepEqual(o.Index(), l.Index) {
		t.Fatal("index differs")
	}
	// The same object read with the index just inside the tail: one read.
	calls = calls[:227] // 227*36 + 48 = 8,220 bytes > 8,192, 226 fit
	obj, _ = run(t, DefaultBlockSize, calls[:226]...)
	r = &countingReaderAt{r: bytes.NewReader(obj)}
	if _, err := ReadIndex(r, int64(len(obj))); err != nil || r.reads != 1 {
		t.Fatalf("226 blocks: %d reads, %v", r.reads, err)
	}
	obj, _ = run(t, DefaultBlockSize, calls...)
	r = &countingReaderAt{r: bytes.NewReader(obj)}
	if _, err := ReadIndex(r, int64(len(obj))); err != nil || r.reads != 2 {
		t.Fatalf("227 blocks: %d reads, %v", r.reads, err)
	}
}

// TestSecondReadSeesAChangedFooter: an object replaced between the two
// reads is refused, not read half old and half new.
func TestSecondReadSeesAChangedFooter(t *testing.T) {
	var calls [][]Record
	for s := range 300 {
		calls = append(calls, []Record{rec(int64(s), 0, 1, 3)})
	}
	obj, _ := run(t, DefaultBlockSize, calls...)
	changed := bytes.Clone(obj)
	changed[len(changed)-48+20] = 1 // a reserved byte, after the first read
	r := &switchingReaderAt{first: obj, then: changed}
	if _, err := ReadIndex(r, int64(len(obj))); !errors.Is(err, ErrFooterMagic) {
		t.Fatalf("object changed between reads: %v", err)
	}
}

type switchingReaderAt struct {
	first, then []byte
	reads       int
}

func (s *switchingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	s.reads++
	if s.reads == 1 {
		return bytes.NewReader(s.first).ReadAt(p, off)
	}
	return bytes.NewReader(s.then).ReadAt(p, off)
}

func vectorBytes(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name + ".obj")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReaderRefusesDamage damages the multi_block_1k vector (5 blocks of
// streams 5 and 6) one field at a time: each damage is refused with its
// named error, which also matches ErrCorrupt, and no records come back.
func TestReaderRefusesDamage(t *testing.T) {
	orig := vectorBytes(t, "multi_block_1k")
	o, err := ReadIndex(bytes.NewReader(orig), int64(len(orig)))
	if err != nil {
		t.Fatal(err)
	}
	idx := o.Index()
	size := len(orig)
	footer := size - FooterSize
	indexAt := int(o.IndexPosition())
	entry := func(i int) int { return indexAt + i*IndexEntrySize }
	block := func(i int) int { return int(idx[i].Position) }
	// record k of block 0: all records of multi_block_1k are 333 bytes.
	record := func(b, k int) int { return block(b) + BlockHeaderSize + k*333 }
	put32 := func(p []byte, at int, v uint32) { binary.BigEndian.PutUint32(p[at:], v) }
	put64 := func(p []byte, at int, v uint64) { binary.BigEndian.PutUint64(p[at:], v) }

	cases := []struct {
		name   string
		damage func(p []byte) []byte
		want   error
	}{
		{"shorter than a footer", func(p []byte) []byte { return p[:47] }, ErrTruncated},
		{"footer magic", func(p []byte) []byte { p[size-1] ^= 1; return p }, ErrFooterMagic},
		{"footer reserved byte", func(p []byte) []byte { p[footer+12] = 1; return p }, ErrFooterMagic},
		{"a byte appended", func(p []byte) []byte { return append(p, 0) }, ErrFooterMagic},
		{"index position past the object", func(p []byte) []byte { put64(p, footer, 1<<40); return p }, ErrIndexBounds},
		{"negative index position", func(p []byte) []byte { put64(p, footer, 1<<63); return p }, ErrIndexBounds},
		{"index position off by one", func(p []byte) []byte { put64(p, footer, uint64(indexAt-1)); return p }, ErrIndexBounds},
		{"index size not a multiple of 36", func(p []byte) []byte { put32(p, footer+8, 179); return p }, ErrIndexBounds},
		{"negative index size", func(p []byte) []byte { put32(p, footer+8, 0xFFFFFFDC); return p }, ErrIndexBounds},
		{"index size one entry short", func(p []byte) []byte { put32(p, footer+8, 144); return p }, ErrIndexBounds},
		{"index streams swapped", func(p []byte) []byte {
			put64(p, entry(0), 6)
			return p
		}, ErrIndexOrder},
		{"index block position", func(p []byte) []byte { put64(p, entry(1)+24, uint64(idx[1].Position+1)); return p }, ErrIndexOrder},
		{"index offsets overlap", func(p []byte) []byte { put64(p, entry(1)+8, uint64(idx[1].StartOffset-1)); return p }, ErrIndexOrder},
		{"index offsets leave a gap", func(p []byte) []byte { put64(p, entry(1)+8, uint64(idx[1].StartOffset+1)); return p }, ErrIndexOrder},
		{"index block size", func(p []byte) []byte { put32(p, entry(4)+32, uint32(idx[4].Size-1)); return p }, ErrIndexOrder},
		{"index record count zero", func(p []byte) []byte { put32(p, entry(2)+20, 0); return p }, ErrIndexOrder},
		{"index negative stream", func(p []byte) []byte { put64(p, entry(0), 1<<63); return p }, ErrIndexOrder},
		{"index record count", func(p []byte) []byte { put32(p, entry(0)+20, 3); return p }, ErrBlockMismatch},
		{"index end offset", func(p []byte) []byte { put32(p, entry(4)+16, uint32(idx[4].EndOffsetDelta+1)); return p }, ErrOffsetMismatch},
		{"block magic", func(p []byte) []byte { p[block(2)] = 0x5B; return p }, ErrBlockMagic},
		{"block flag", func(p []byte) []byte { p[block(2)+1] = 0x03; return p }, ErrBlockMagic},
		{"block record count", func(p []byte) []byte { put32(p, block(1)+2, 5); return p }, ErrBlockMismatch},
		{"block data length", func(p []byte) []byte { put32(p, block(1)+6, uint32(idx[1].Size)); return p }, ErrBlockMismatch},
		{"record magic", func(p []byte) []byte { p[record(0, 2)] = 0x21; return p }, ErrRecordMagic},
		{"record payload past the block", func(p []byte) []byte { put32(p, record(0, 3)+29, 301); return p }, ErrRecordLength},
		{"negative payload length", func(p []byte) []byte { put32(p, record(0, 3)+29, 0xFFFFFFFF); return p }, ErrRecordLength},
		{"record payload shorter", func(p []byte) []byte { put32(p, record(0, 3)+29, 299); return p }, ErrTrailingBytes},
		{"record of another stream", func(p []byte) []byte { put64(p, record(0, 1)+1, 6); return p }, ErrOffsetMismatch},
		{"record base offset", func(p []byte) []byte { put64(p, record(0, 1)+17, 11); return p }, ErrOffsetMismatch},
		{"record count", func(p []byte) []byte { put32(p, record(0, 1)+25, 9); return p }, ErrOffsetMismatch},
		{"record count zero", func(p []byte) []byte { put32(p, record(0, 3)+25, 0); return p }, ErrOffsetMismatch},
		{"record negative epoch", func(p []byte) []byte { put64(p, record(0, 0)+9, 1<<63); return p }, ErrOffsetMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.damage(bytes.Clone(orig))
			d, err := Describe(bytes.NewReader(p), int64(len(p)), DescribeOptions{Records: true})
			if !errors.Is(err, c.want) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v, expected %v", err, c.want)
			}
			if d != nil {
				t.Fatal("a description came with the error")
			}
			t.Log(err)
		})
	}
	// The undamaged object reads.
	if _, err := Describe(bytes.NewReader(orig), int64(size), DescribeOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A block's error leaves the other blocks readable, and ReadAll returns no
// records at all.
func TestDamagedBlockIsNotHalfRead(t *testing.T) {
	p := vectorBytes(t, "multi_block_1k")
	o, err := ReadIndex(bytes.NewReader(p), int64(len(p)))
	if err != nil {
		t.Fatal(err)
	}
	p[o.Index()[3].Position] = 0
	if recs, err := o.ReadBlock(3); !errors.Is(err, ErrBlockMagic) || recs != nil {
		t.Fatalf("block 3: %d records, %v", len(recs), err)
	}
	if recs, err := o.ReadAll(); !errors.Is(err, ErrBlockMagic) || recs != nil {
		t.Fatalf("ReadAll: %d records, %v", len(recs), err)
	}
	if recs, err := o.ReadBlock(4); err != nil || len(recs) != 3 {
		t.Fatalf("block 4: %d records, %v", len(recs), err)
	}
}

func TestReaderErrors(t *testing.T) {
	p := vectorBytes(t, "one_stream_one_record")
	// The store says the object is larger than it is.
	if _, err := ReadIndex(bytes.NewReader(p), int64(len(p)+1)); !errors.Is(err, ErrTruncated) {
		t.Fatalf("size too large: %v", err)
	}
	if _, err := ReadIndex(bytes.NewReader(p), MaxObjectSize+1); !errors.Is(err, ErrSizeOutOfRange) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("size above 5 TiB: %v", err)
	}
	// An I/O error is returned as it is, not as damage.
	if _, err := ReadIndex(errReaderAt{}, int64(len(p))); !errors.Is(err, errDisk) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("I/O error: %v", err)
	}
	o, err := ReadIndex(bytes.NewReader(p), int64(len(p)))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{-1, 1} {
		if _, err := o.ReadBlock(i); err == nil || errors.Is(err, ErrCorrupt) {
			t.Fatalf("ReadBlock(%d): %v", i, err)
		}
	}
	// The object shrank after its index was read.
	o.r = bytes.NewReader(p[:30])
	if _, err := o.ReadBlock(0); !errors.Is(err, ErrTruncated) {
		t.Fatalf("shrunk: %v", err)
	}
}

type errReaderAt struct{}

func (errReaderAt) ReadAt([]byte, int64) (int, error) { return 0, errDisk }

// TestRoundTripRandom writes random calls with random block sizes and reads
// them back: the reader returns the records and index the writer reported,
// and the Planner predicted the layout.
func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 300 {
		blockSize := 1 + rng.IntN(4096)
		var calls [][]Record
		var all []Record
		stream := int64(rng.IntN(5))
		ends := map[int64]int64{}
		for range rng.IntN(12) {
			if rng.IntN(3) == 0 {
				stream += 1 + int64(rng.IntN(1<<20))
			}
			var call []Record
			off, ok := ends[stream]
			if !ok {
				off = int64(rng.IntN(1 << 30))
			}
			for range 1 + rng.IntN(20) {
				r := rec(stream, off, int32(1+rng.IntN(50)), rng.IntN(700))
				r.Epoch = int64(rng.IntN(4))
				call = append(call, r)
				off = r.EndOffset()
			}
			ends[stream] = off
			calls = append(calls, call)
			all = append(all, call...)
		}
		plan, _ := NewPlanner(blockSize)
		for _, c := range calls {
			if err := plan.Write(c[0].StreamID, c); err != nil {
				t.Fatal(err)
			}
		}
		obj, l := run(t, blockSize, calls...)
		if !reflect.DeepEqual(plan.Layout(), l) {
			t.Fatalf("iteration %d: the plan differs from the written layout", iter)
		}
		o, err := ReadIndex(bytes.NewReader(obj), int64(len(obj)))
		if err != nil {
			t.Fatalf("iteration %d: %v", iter, err)
		}
		recs, err := o.ReadAll()
		if err != nil {
			t.Fatalf("iteration %d: %v", iter, err)
		}
		if len(all) == 0 {
			all = nil
		}
		if !reflect.DeepEqual(recs, all) || !reflect.DeepEqual(o.Index(), l.Index) {
			t.Fatalf("iteration %d: read back differs", iter)
		}
	}
}

func TestObjectTooLarge(t *testing.T) {
	p, _ := NewPlanner(1)
	p.l.maxBlocks = 3
	if err := p.Write(1, []Record{rec(1, 0, 1, 1), rec(1, 1, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := p.Write(2, []Record{rec(2, 0, 1, 1), rec(2, 1, 1, 1)}); !errors.Is(err, ErrObjectTooLarge) {
		t.Fatalf("fourth block: %v", err)
	}
	if err := p.Write(2, []Record{rec(2, 0, 1, 1)}); err != nil {
		t.Fatalf("third block: %v", err)
	}
}

func TestBlockTooLarge(t *testing.T) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf, DefaultBlockSize)
	w.l.maxBlockSize = 100
	// 10 + 2*(33+12) = 100 fits; a third record does not.
	if err := w.Write(1, []Record{rec(1, 0, 1, 12), rec(1, 1, 1, 12)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(2, []Record{rec(2, 0, 1, 12), rec(2, 1, 1, 12), rec(2, 2, 1, 0)}); !errors.Is(err, ErrBlockTooLarge) {
		t.Fatalf("block of 143 bytes: %v", err)
	}
}
