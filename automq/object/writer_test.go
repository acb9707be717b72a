package object

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"

	"walden/wal"
)

func rec(stream, base int64, count int32, payloadLen int) Record {
	p := make([]byte, payloadLen)
	for i := range p {
		p[i] = byte(i)
	}
	return Record{StreamID: stream, Epoch: 1, BaseOffset: base, Count: count, Payload: p}
}

// run writes calls to a fresh Writer and returns the object and layout.
func run(t *testing.T, blockSize int, calls ...[]Record) ([]byte, Layout) {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if err := w.Write(c[0].StreamID, c); err != nil {
			t.Fatal(err)
		}
	}
	l, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if int64(buf.Len()) != l.Size {
		t.Fatalf("wrote %d bytes, layout says %d", buf.Len(), l.Size)
	}
	return buf.Bytes(), l
}

func TestEmptyWriterWritesOnlyTheFooter(t *testing.T) {
	obj, l := run(t, DefaultBlockSize)
	want := make([]byte, 48)
	copy(want[40:], []byte{0x88, 0xe2, 0x41, 0xb7, 0x85, 0xf4, 0xcf, 0xf7})
	if !bytes.Equal(obj, want) {
		t.Fatalf("empty object % x, expected % x", obj, want)
	}
	if l.Size != 48 || l.IndexPosition != 0 || l.IndexSize != 0 || len(l.Index) != 0 || len(l.Ranges) != 0 {
		t.Fatalf("empty layout %+v", l)
	}
	o, err := ReadIndex(bytes.NewReader(obj), int64(len(obj)))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Index()) != 0 {
		t.Fatalf("empty object read with %d blocks", len(o.Index()))
	}
}

func TestOneEmptyPayloadIs127Bytes(t *testing.T) {
	obj, l := run(t, DefaultBlockSize, []Record{rec(3, 0, 1, 0)})
	if len(obj) != 127 || l.Index[0].Size != 43 {
		t.Fatalf("object of %d bytes, block of %d; expected 127 and 43", len(obj), l.Index[0].Size)
	}
}

// A payload larger than the block size makes a block of its own; the next
// record starts a new block because the total was reset.
func TestPayloadLargerThanBlockSize(t *testing.T) {
	_, l := run(t, 1024, []Record{rec(1, 0, 1, 64<<10), rec(1, 1, 1, 10), rec(1, 2, 1, 70000)})
	want := []BlockIndex{
		{StreamID: 1, StartOffset: 0, EndOffsetDelta: 1, RecordCount: 1, Position: 0, Size: 10 + 33 + 65536},
		{StreamID: 1, StartOffset: 1, EndOffsetDelta: 2, RecordCount: 2, Position: 10 + 33 + 65536, Size: 10 + 66 + 70010},
	}
	if !reflect.DeepEqual(l.Index, want) {
		t.Fatalf("index %+v, expected %+v", l.Index, want)
	}
}

// The running total carries over from one call to the next, also between
// calls for the same stream.
func TestRunningTotalCarriesAcrossCalls(t *testing.T) {
	_, l := run(t, 100,
		[]Record{rec(1, 0, 1, 60)},                  // block 0, total 60
		[]Record{rec(1, 1, 1, 30), rec(1, 2, 1, 5)}, // 90: not closed; 95; call ends: block 1 of 2 records
		[]Record{rec(2, 0, 1, 5), rec(2, 1, 1, 1)},  // 100: closed after 1 record (block 2); block 3 holds the last
	)
	var got []int32
	for _, e := range l.Index {
		got = append(got, e.RecordCount)
	}
	if !reflect.DeepEqual(got, []int32{1, 2, 1, 1}) {
		t.Fatalf("records per block %v, expected [1 2 1 1]", got)
	}
	wantRanges := []StreamRange{{StreamID: 1, Epoch: 1, StartOffset: 0, EndOffset: 3}, {StreamID: 2, Epoch: 1, StartOffset: 0, EndOffset: 2}}
	if !reflect.DeepEqual(l.Ranges, wantRanges) {
		t.Fatalf("ranges %+v, expected %+v", l.Ranges, wantRanges)
	}
}

// The range's epoch is the stream's first record's; later records of the
// stream may carry another epoch (AutoMQ does not check it).
func TestRangeEpochIsTheFirstRecords(t *testing.T) {
	a, b := rec(4, 10, 2, 3), rec(4, 12, 1, 3)
	a.Epoch, b.Epoch = 7, 8
	obj, l := run(t, DefaultBlockSize, []Record{a, b})
	if l.Ranges[0].Epoch != 7 {
		t.Fatalf("range epoch %d, expected 7", l.Ranges[0].Epoch)
	}
	d, err := Describe(bytes.NewReader(obj), int64(len(obj)), DescribeOptions{Records: true})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.Streams, l.Ranges) || d.Blocks[0].Records[1].Epoch != 8 {
		t.Fatalf("described %+v", d)
	}
}

func TestEmptyCallIsIgnored(t *testing.T) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf, DefaultBlockSize)
	if err := w.Write(9, []Record{rec(9, 0, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	// AutoMQ skips its checks for a call without records, even for a lower
	// stream id.
	if err := w.Write(3, nil); err != nil {
		t.Fatalf("empty call refused: %v", err)
	}
	if err := w.WriteEncoded(3, nil); err != nil {
		t.Fatalf("empty encoded call refused: %v", err)
	}
	if err := w.Write(9, []Record{rec(9, 1, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	l, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Index) != 2 || len(l.Ranges) != 1 {
		t.Fatalf("layout %+v", l)
	}
}

func TestIDsNear2Pow62AndStreamOrderIsSigned(t *testing.T) {
	big := int64(math.MaxInt64 - 10)
	obj, l := run(t, DefaultBlockSize,
		[]Record{rec(1<<62-1, big, 10, 1)},
		[]Record{rec(1<<62, 0, 1, 1)},
		[]Record{rec(math.MaxInt64, 1<<62, 1, 1)},
	)
	if l.Ranges[0].EndOffset != math.MaxInt64 {
		t.Fatalf("end offset %d, expected 2^63-1", l.Ranges[0].EndOffset)
	}
	if _, err := ReadIndex(bytes.NewReader(obj), int64(len(obj))); err != nil {
		t.Fatal(err)
	}
}

func Test200StreamsRoundTrip(t *testing.T) {
	var calls [][]Record
	for s := range 200 {
		calls = append(calls, []Record{rec(int64(s*3), int64(s), 2, s%17), rec(int64(s*3), int64(s)+2, 1, 3)})
	}
	obj, l := run(t, 64, calls...)
	if len(l.Ranges) != 200 {
		t.Fatalf("%d ranges", len(l.Ranges))
	}
	o, err := ReadIndex(bytes.NewReader(obj), int64(len(obj)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.Index(), l.Index) {
		t.Fatal("index read back differs from the written one")
	}
	recs, err := o.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var want []Record
	for _, c := range calls {
		want = append(want, c...)
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatal("records read back differ")
	}
}

// TestWriterRefusals checks every rule of Write and WriteEncoded: the call
// is refused with its named error and the object is the same as without it.
func TestWriterRefusals(t *testing.T) {
	base := []Record{rec(5, 100, 2, 4), rec(5, 102, 1, 4)} // stream 5 ends at 103
	cases := []struct {
		name    string
		stream  int64
		records []Record
		encoded [][]byte
		want    error
	}{
		{"lower stream", 4, []Record{rec(4, 0, 1, 1)}, nil, ErrStreamOrder},
		{"negative stream", -1, []Record{rec(-1, 0, 1, 1)}, nil, ErrInvalidRecord},
		{"backwards across calls", 5, []Record{rec(5, 102, 1, 1)}, nil, ErrOffsetBackwards},
		{"gap across calls", 5, []Record{rec(5, 104, 1, 1)}, nil, ErrOffsetGap},
		{"backwards within a call", 6, []Record{rec(6, 10, 5, 1), rec(6, 14, 1, 1)}, nil, ErrOffsetBackwards},
		{"gap within a call", 6, []Record{rec(6, 10, 5, 1), rec(6, 16, 1, 1)}, nil, ErrOffsetGap},
		{"other stream in the call", 6, []Record{rec(6, 0, 1, 1), rec(7, 1, 1, 1)}, nil, ErrStreamMismatch},
		{"zero count", 6, []Record{rec(6, 0, 0, 1)}, nil, ErrInvalidRecord},
		{"negative count", 6, []Record{rec(6, 0, -3, 1)}, nil, ErrInvalidRecord},
		{"negative epoch", 6, []Record{{StreamID: 6, Epoch: -1, BaseOffset: 0, Count: 1}}, nil, ErrInvalidRecord},
		{"negative offset", 6, []Record{rec(6, -5, 1, 1)}, nil, ErrInvalidRecord},
		{"offsets past 2^63", 6, []Record{rec(6, math.MaxInt64-1, 2, 1)}, nil, ErrInvalidRecord},
		{"block offsets past int32", 6, []Record{rec(6, 0, math.MaxInt32, 1), rec(6, math.MaxInt32, 1, 1)}, nil, ErrBlockTooLarge},
		{"encoded too short", 6, nil, [][]byte{{0x22, 0, 0}}, ErrInvalidRecord},
		{"encoded bad magic", 6, nil, [][]byte{badMagic(rec(6, 0, 1, 2))}, ErrInvalidRecord},
		{"encoded length disagrees", 6, nil, [][]byte{rec(6, 0, 1, 2).AppendEncoded(nil)[:34]}, ErrInvalidRecord},
		{"encoded other stream", 6, nil, [][]byte{rec(7, 0, 1, 2).AppendEncoded(nil)}, ErrStreamMismatch},
		{"encoded gap", 5, nil, [][]byte{rec(5, 200, 1, 2).AppendEncoded(nil)}, ErrOffsetGap},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			w, _ := NewWriter(&buf, 8)
			p, _ := NewPlanner(8)
			if err := w.Write(5, base); err != nil {
				t.Fatal(err)
			}
			if err := p.Write(5, base); err != nil {
				t.Fatal(err)
			}
			before, size := buf.Len(), w.Size()
			var errs [4]error
			if c.encoded != nil {
				errs[0] = w.WriteEncoded(c.stream, c.encoded)
				errs[1] = p.WriteEncoded(c.stream, c.encoded)
				_, errs[2] = p.SizeWithEncoded(c.stream, c.encoded)
			} else {
				errs[0] = w.Write(c.stream, c.records)
				errs[1] = p.Write(c.stream, c.records)
				_, errs[2] = p.SizeWith(c.stream, c.records)
				var bodies [][]byte
				for _, r := range c.records {
					bodies = append(bodies, r.AppendEncoded(nil))
				}
				errs[3] = w.WriteEncoded(c.stream, bodies)
			}
			for i, err := range errs {
				if i == 3 && c.encoded != nil {
					continue
				}
				if !errors.Is(err, c.want) {
					t.Fatalf("error %d: %v, expected %v", i, err, c.want)
				}
			}
			if buf.Len() != before || w.Size() != size || p.Size() != size {
				t.Fatalf("a refused call changed the object: %d→%d bytes, size %d→%d (plan %d)", before, buf.Len(), size, w.Size(), p.Size())
			}
			// The object goes on as if the call had not been made.
			if err := w.Write(5, []Record{rec(5, 103, 1, 1)}); err != nil {
				t.Fatalf("writer unusable after a refusal: %v", err)
			}
		})
	}
}

func badMagic(r Record) []byte {
	p := r.AppendEncoded(nil)
	p[0] = 0x23
	return p
}

func TestNewWriterRefusesBlockSize(t *testing.T) {
	for _, n := range []int{0, -1} {
		if _, err := NewWriter(&bytes.Buffer{}, n); !errors.Is(err, ErrInvalidBlockSize) {
			t.Fatalf("block size %d: %v", n, err)
		}
		if _, err := NewPlanner(n); !errors.Is(err, ErrInvalidBlockSize) {
			t.Fatalf("planner block size %d: %v", n, err)
		}
	}
}

func TestWriterAfterClose(t *testing.T) {
	w, _ := NewWriter(&bytes.Buffer{}, DefaultBlockSize)
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(1, []Record{rec(1, 0, 1, 1)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if _, err := w.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}

type failingWriter struct{ after int }

var errDisk = errors.New("disk on fire")

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.after <= 0 {
		return 0, errDisk
	}
	f.after--
	return len(p), nil
}

func TestWriterBrokenByItsWriter(t *testing.T) {
	w, _ := NewWriter(&failingWriter{after: 2}, DefaultBlockSize)
	err := w.Write(1, []Record{rec(1, 0, 1, 1), rec(1, 1, 1, 1)})
	if !errors.Is(err, errDisk) {
		t.Fatalf("write: %v", err)
	}
	if err := w.Write(2, []Record{rec(2, 0, 1, 1)}); !errors.Is(err, errDisk) {
		t.Fatalf("write after failure: %v", err)
	}
	if _, err := w.Close(); !errors.Is(err, errDisk) {
		t.Fatalf("close after failure: %v", err)
	}
}

func TestRecordEncoding(t *testing.T) {
	r := Record{StreamID: 1 << 62, Epoch: 3, BaseOffset: 77, Count: 5, Payload: []byte("abc")}
	p := r.AppendEncoded(nil)
	if len(p) != r.EncodedSize() || !bytes.Equal(p, encodeByREADME(r)) {
		t.Fatalf("encoding % x", p)
	}
	got, err := DecodeRecord(p)
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("DecodeRecord = %+v, %v", got, err)
	}
	for _, bad := range [][]byte{p[:32], p[:35], append(p[:len(p):len(p)], 0), badMagic(r)} {
		if _, err := DecodeRecord(bad); !errors.Is(err, ErrInvalidRecord) {
			t.Fatalf("DecodeRecord(% x): %v", bad, err)
		}
	}
}

func TestRecordFromWAL(t *testing.T) {
	b := wal.Batch{StreamID: 9, Epoch: 2, BaseOffset: 40, Count: 3, Payload: []byte{1, 2}}
	r, err := RecordFromWAL(b)
	if err != nil || r.StreamID != 9 || r.Epoch != 2 || r.BaseOffset != 40 || r.Count != 3 || &r.Payload[0] != &b.Payload[0] {
		t.Fatalf("RecordFromWAL = %+v, %v", r, err)
	}
	for _, bad := range []wal.Batch{
		{StreamID: 1 << 63, Count: 1},
		{StreamID: 1, Epoch: 1 << 63, Count: 1},
		{StreamID: 1, BaseOffset: 1 << 63, Count: 1},
		{StreamID: 1, Count: 1 << 31},
		{StreamID: 1, Count: 0},
		{StreamID: 1, BaseOffset: math.MaxInt64, Count: 1},
	} {
		if _, err := RecordFromWAL(bad); !errors.Is(err, ErrInvalidRecord) {
			t.Fatalf("RecordFromWAL(%+v): %v", bad, err)
		}
	}
}
