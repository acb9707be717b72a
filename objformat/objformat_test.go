package objformat

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"walden/wal"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// sample builds a small object with two streams, interleaved on input.
func sample(t testing.TB) *Builder {
	t.Helper()
	b := NewBuilder()
	for _, bt := range []wal.Batch{
		{StreamID: 7, Epoch: 2, BaseOffset: 100, Count: 3, Payload: []byte("abc")},
		{StreamID: 3, Epoch: 1, BaseOffset: 0, Count: 1, Payload: []byte("x")},
		{StreamID: 7, Epoch: 2, BaseOffset: 103, Count: 2, Payload: []byte("de")},
		{StreamID: 3, Epoch: 1, BaseOffset: 1, Count: 5, Payload: nil},
	} {
		if err := b.Add(bt); err != nil {
			t.Fatalf("Add: %v", err)
		}
	}
	return b
}

func TestGolden(t *testing.T) {
	data, ix, err := sample(t).Build()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "two-streams.hex")
	got := hex.Dump(data)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create): %v", err)
	}
	if got != string(want) {
		t.Errorf("encoding changed; got\n%s\nwant\n%s", got, want)
	}
	// Hand-checked fields of the layout documented in docs/object-format.md.
	if int64(len(data)) != ix.Size || ix.Size != 16+(16+1+16+0)+(16+3+16+2)+4+2*56+32 {
		t.Errorf("size %d (index says %d)", len(data), ix.Size)
	}
	if !bytes.Equal(data[:8], []byte{0x57, 0x44, 0x4F, 0x42, 0, 1, 0, 0}) {
		t.Errorf("header % x", data[:8])
	}
	if !bytes.Equal(data[len(data)-4:], []byte("WDOB")) {
		t.Errorf("footer magic % x", data[len(data)-4:])
	}
	want0 := IndexEntry{StreamID: 3, StreamEpoch: 1, StartOffset: 0, EndOffset: 6, Position: 16, Length: 33, BatchCount: 2}
	e0 := ix.Entries[0]
	e0.CRC32C = 0
	if e0 != want0 {
		t.Errorf("entry 0 = %+v, want %+v", e0, want0)
	}
	if e := ix.Entries[1]; e.StreamID != 7 || e.Position != 49 || e.Length != 37 || e.StartOffset != 100 || e.EndOffset != 105 {
		t.Errorf("entry 1 = %+v", e)
	}
	if e0.CRC32C = ix.Entries[0].CRC32C; e0.CRC32C != CRC32C(data[16:49]) {
		t.Errorf("section CRC %#x, computed %#x", e0.CRC32C, CRC32C(data[16:49]))
	}
}

func TestRoundTrip(t *testing.T) {
	b := sample(t)
	data, ix, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := b.WriteTo(&buf)
	if err != nil || n != int64(len(data)) || !bytes.Equal(buf.Bytes(), data) || b.Size() != n {
		t.Fatalf("WriteTo = %d, %v; Build %d bytes; Size %d; equal %v", n, err, len(data), b.Size(), bytes.Equal(buf.Bytes(), data))
	}
	got, err := ReadIndex(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ix) {
		t.Fatalf("ReadIndex = %+v, Build index %+v", got, ix)
	}
	e, ok := got.Entry(7)
	if !ok {
		t.Fatal("no entry for stream 7")
	}
	bs, err := ReadSection(bytes.NewReader(data), e)
	if err != nil {
		t.Fatal(err)
	}
	want := []wal.Batch{
		{StreamID: 7, Epoch: 2, BaseOffset: 100, Count: 3, Payload: []byte("abc")},
		{StreamID: 7, Epoch: 2, BaseOffset: 103, Count: 2, Payload: []byte("de")},
	}
	if !reflect.DeepEqual(bs, want) {
		t.Fatalf("ReadSection = %+v", bs)
	}
	// A ranged read of just the section parses the same.
	bs2, err := ParseSection(data[e.Position:e.Position+e.Length], e)
	if err != nil || !reflect.DeepEqual(bs2, want) {
		t.Fatalf("ParseSection = %+v, %v", bs2, err)
	}
	_, all, err := ReadAll(bytes.NewReader(data), int64(len(data)))
	if err != nil || len(all) != 4 || all[0].StreamID != 3 || all[1].Count != 5 || len(all[1].Payload) != 0 {
		t.Fatalf("ReadAll = %+v, %v", all, err)
	}
}

func TestBuilderRefuses(t *testing.T) {
	b := NewBuilder()
	ok := wal.Batch{StreamID: 1, Epoch: 4, BaseOffset: 10, Count: 2, Payload: []byte("p")}
	if err := b.Add(ok); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		batch wal.Batch
		want  error
	}{
		{"gap", wal.Batch{StreamID: 1, Epoch: 4, BaseOffset: 13, Count: 1}, ErrOutOfOrder},
		{"overlap", wal.Batch{StreamID: 1, Epoch: 4, BaseOffset: 11, Count: 1}, ErrOutOfOrder},
		{"again", ok, ErrOutOfOrder},
		{"epoch", wal.Batch{StreamID: 1, Epoch: 5, BaseOffset: 12, Count: 1}, ErrEpochMismatch},
		{"empty", wal.Batch{StreamID: 2, Epoch: 1, BaseOffset: 0, Count: 0}, ErrInvalidBatch},
		{"overflow", wal.Batch{StreamID: 2, Epoch: 1, BaseOffset: ^uint64(0), Count: 2}, ErrInvalidBatch},
	}
	for _, tc := range cases {
		if err := b.Add(tc.batch); !errors.Is(err, tc.want) {
			t.Errorf("%s: Add = %v, want %v", tc.name, err, tc.want)
		}
	}
	if end, _ := b.EndOffset(1); end != 12 || b.Len() != 1 {
		t.Errorf("refused batches changed the builder: end %d len %d", end, b.Len())
	}
	if _, _, err := NewBuilder().Build(); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty Build = %v", err)
	}
}

// TestEveryByteIsChecked flips each byte of an object in turn: reading the
// whole object must fail every time with ErrCorrupt or ErrVersion.
func TestEveryByteIsChecked(t *testing.T) {
	data, _, err := sample(t).Build()
	if err != nil {
		t.Fatal(err)
	}
	for i := range data {
		bad := bytes.Clone(data)
		bad[i] ^= 0x40
		_, bs, err := ReadAll(bytes.NewReader(bad), int64(len(bad)))
		if err == nil {
			t.Fatalf("byte %d flipped: read %d batches without error", i, len(bs))
		}
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
}

// TestReservedFieldsMustBeZero rewrites the header's flags and the footer's
// reserved field with valid CRCs: version 1 readers refuse both.
func TestReservedFieldsMustBeZero(t *testing.T) {
	data, _, err := sample(t).Build()
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(data)
	bad[7] = 1
	be.PutUint32(bad[12:], CRC32C(bad[0:12]))
	if _, err := ReadIndex(bytes.NewReader(bad), int64(len(bad))); !errors.Is(err, ErrCorrupt) {
		t.Errorf("header flags set: %v", err)
	}
	bad = bytes.Clone(data)
	ft := bad[len(bad)-FooterSize:]
	ft[23] = 1
	be.PutUint32(ft[24:], CRC32C(ft[0:24]))
	if _, err := ReadIndex(bytes.NewReader(bad), int64(len(bad))); !errors.Is(err, ErrCorrupt) {
		t.Errorf("footer reserved set: %v", err)
	}
}

func TestTruncated(t *testing.T) {
	data, _, err := sample(t).Build()
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(data); n++ {
		if _, _, err := ReadAll(bytes.NewReader(data[:n]), int64(n)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d: %v", n, err)
		}
	}
	// A size larger than the data is a short read, not a panic.
	if _, err := ReadIndex(bytes.NewReader(data), int64(len(data))+10); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("oversized: %v", err)
	}
}

func TestParseSectionChecksIndexAgreement(t *testing.T) {
	data, ix, err := sample(t).Build()
	if err != nil {
		t.Fatal(err)
	}
	e := ix.Entries[1]
	sec := data[e.Position : e.Position+e.Length]
	for name, mut := range map[string]func(*IndexEntry){
		"start":  func(e *IndexEntry) { e.StartOffset++ },
		"end":    func(e *IndexEntry) { e.EndOffset++ },
		"count":  func(e *IndexEntry) { e.BatchCount++ },
		"crc":    func(e *IndexEntry) { e.CRC32C++ },
		"length": func(e *IndexEntry) { e.Length-- },
	} {
		m := e
		mut(&m)
		if _, err := ParseSection(sec, m); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestKey(t *testing.T) {
	k := Key("walden/", "broker-1", 3, 4096, 1<<20)
	if want := "walden/broker-1/00000000000000000003/00000000000000004096-00000000000001048576.obj"; k != want {
		t.Errorf("Key = %q, want %q", k, want)
	}
	if k := Key("", "b/x", 1, 2, 3); !strings.HasPrefix(k, "b%2Fx/") {
		t.Errorf("Key without prefix = %q", k)
	}
	if k1, k2 := Key("p", "b", 1, 2, 3), Key("p", "b", 1, 2, 3); k1 != k2 {
		t.Errorf("Key not deterministic")
	}
	if id := ObjectID("broker-1", 3, 4096, 8192); id != "broker-1-00000000000000000003-00000000000000004096-00000000000000008192" {
		t.Errorf("ObjectID = %q", id)
	}
}

func FuzzReadAll(f *testing.F) {
	data, _, err := sample(f).Build()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(data[:len(data)-1])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		ix, bs, err := ReadAll(bytes.NewReader(in), int64(len(in)))
		if err != nil {
			if ix != nil || bs != nil {
				t.Fatalf("error %v with results", err)
			}
			return
		}
		// Whatever is accepted must re-encode to exactly the same bytes.
		b := NewBuilder()
		for _, bt := range bs {
			if err := b.Add(bt); err != nil {
				t.Fatalf("accepted object does not rebuild: %v", err)
			}
		}
		out, _, err := b.Build()
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("accepted object re-encodes differently (err %v)", err)
		}
	})
}

func TestRanges(t *testing.T) {
	_, ix, err := sample(t).Build()
	if err != nil {
		t.Fatal(err)
	}
	rs := ix.Ranges()
	if len(rs) != 2 || rs[1].GetStreamId() != 7 || rs[1].GetStreamEpoch() != 2 || rs[1].GetStartOffset() != 100 ||
		rs[1].GetEndOffset() != 105 || rs[1].GetPosition() != 49 || rs[1].GetLength() != 37 {
		t.Fatalf("Ranges = %v", rs)
	}
	if e, ok := ix.EntryOf(rs[1]); !ok || e != ix.Entries[1] {
		t.Fatalf("EntryOf = %+v, %v", e, ok)
	}
	rs[1].Length++
	if _, ok := ix.EntryOf(rs[1]); ok {
		t.Fatal("EntryOf accepted a range of another length")
	}
}

// TestParseKey reads back what Key wrote, and nothing else.
func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		prefix, broker string
		epoch          uint64
		first, last    int64
	}{
		{"walden", "broker-1", 3, 16384, 1048576},
		{"", "b1", 1_000_007, 0, 0},
		{"/a/b/", "b 1/x", 1<<64 - 1, -1, 1<<63 - 1},
	} {
		key := Key(c.prefix, c.broker, c.epoch, c.first, c.last)
		kp, ok := ParseKey(c.prefix, key)
		if !ok || kp.Broker != c.broker || kp.Epoch != c.epoch || kp.FirstWAL != c.first || kp.LastWAL != c.last {
			t.Fatalf("ParseKey(%q, %q) = %+v, %t", c.prefix, key, kp, ok)
		}
		if kp.ObjectID() != ObjectID(c.broker, c.epoch, c.first, c.last) {
			t.Fatalf("object id %s", kp.ObjectID())
		}
		if _, ok := ParseKey("other", key); ok && c.prefix != "" {
			t.Fatalf("%q parsed under another prefix", key)
		}
	}
	for _, key := range []string{"walden/b1/1/2-3.obj", "walden/b1/00000000000000000001/00000000000000000002-00000000000000000003.json",
		"walden/x/b1/00000000000000000001/00000000000000000002-00000000000000000003.obj", "walden/s3-objects/123", "walden/",
		"walden/b1/0000000000000000000a/00000000000000000002-00000000000000000003.obj"} {
		if kp, ok := ParseKey("walden", key); ok {
			t.Errorf("ParseKey(%q) = %+v", key, kp)
		}
	}
}
