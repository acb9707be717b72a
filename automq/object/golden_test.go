package object

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The vectors in testdata were made by AutoMQ 1.4.1's own ObjectWriter and
// checked with its ObjectReader (see /work/shared/automq-1.4/README.md, of
// which testdata holds the objects part): NAME.obj is the object, NAME.json
// the inputs and what AutoMQ reported.

type vector struct {
	Name              string         `json:"name"`
	Note              string         `json:"note"`
	ObjectID          int64          `json:"object_id"`
	ClusterID         string         `json:"cluster_id"`
	Namespace         string         `json:"namespace"`
	BlockSize         int            `json:"block_size"`
	PartSize          int64          `json:"part_size"`
	ExpectedKey       string         `json:"expected_key"`
	ObjectSize        int64          `json:"object_size"`
	IndexPosition     int64          `json:"index_position"`
	IndexSize         int64          `json:"index_size"`
	Records           []vectorRecord `json:"records"`
	ObjectRecordOrder []int          `json:"object_record_order"`
	Index             []vectorIndex  `json:"index"`
	StreamRanges      []StreamRange  `json:"stream_ranges"`

	obj []byte
}

type vectorRecord struct {
	StreamID   int64  `json:"stream_id"`
	Epoch      int64  `json:"epoch"`
	BaseOffset int64  `json:"base_offset"`
	Count      int32  `json:"count"`
	PayloadLen int    `json:"payload_len"`
	PayloadHex string `json:"payload_hex"`
}

type vectorIndex struct {
	BlockIndex
	EndOffset int64 `json:"end_offset"`
}

// loadVectors reads every vector. Numbers go to int64 fields, which
// encoding/json parses from the literal (never through float64): the ids
// near 2^62 stay exact, as TestVectorIDsExact checks.
func loadVectors(t testing.TB) []vector {
	t.Helper()
	names, err := filepath.Glob("testdata/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 9 {
		t.Fatalf("found %d vectors in testdata, expected the 9 of AutoMQ 1.4.1", len(names))
	}
	var out []vector
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		dec.DisallowUnknownFields()
		var v vector
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		v.obj, err = os.ReadFile(strings.TrimSuffix(name, ".json") + ".obj")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

// record returns input record k with its payload, checked against the
// README's rule (byte i of record k is (i + 7k) mod 251).
func (v *vector) record(t testing.TB, k int) Record {
	t.Helper()
	r := v.Records[k]
	p, err := hex.DecodeString(r.PayloadHex)
	if err != nil {
		t.Fatalf("%s: record %d: %v", v.Name, k, err)
	}
	if len(p) != r.PayloadLen {
		t.Fatalf("%s: record %d: payload of %d bytes, payload_len %d", v.Name, k, len(p), r.PayloadLen)
	}
	for i, c := range p {
		if int(c) != (i+7*k)%251 {
			t.Fatalf("%s: record %d: payload byte %d is %d, the README's rule gives %d", v.Name, k, i, c, (i+7*k)%251)
		}
	}
	return Record{StreamID: r.StreamID, Epoch: r.Epoch, BaseOffset: r.BaseOffset, Count: r.Count, Payload: p}
}

// calls groups the records in object order into AutoMQ's write calls: one
// per run of records of the same stream.
func (v *vector) calls(t testing.TB) [][]Record {
	t.Helper()
	var calls [][]Record
	for _, k := range v.ObjectRecordOrder {
		r := v.record(t, k)
		if n := len(calls); n > 0 && calls[n-1][0].StreamID == r.StreamID {
			calls[n-1] = append(calls[n-1], r)
		} else {
			calls = append(calls, []Record{r})
		}
	}
	return calls
}

func (v *vector) wantLayout() Layout {
	l := Layout{Size: v.ObjectSize, IndexPosition: v.IndexPosition, IndexSize: v.IndexSize, Ranges: v.StreamRanges}
	for _, e := range v.Index {
		l.Index = append(l.Index, e.BlockIndex)
	}
	return l
}

// encodeByREADME encodes a record from the README's table, independently of
// the package's encoder, so that WriteEncoded is fed bytes the package did
// not make.
func encodeByREADME(r Record) []byte {
	p := make([]byte, 33+len(r.Payload))
	p[0] = 0x22
	binary.BigEndian.PutUint64(p[1:], uint64(r.StreamID))
	binary.BigEndian.PutUint64(p[9:], uint64(r.Epoch))
	binary.BigEndian.PutUint64(p[17:], uint64(r.BaseOffset))
	binary.BigEndian.PutUint32(p[25:], uint32(r.Count))
	binary.BigEndian.PutUint32(p[29:], uint32(len(r.Payload)))
	copy(p[33:], r.Payload)
	return p
}

func TestVectorIDsExact(t *testing.T) {
	for _, v := range loadVectors(t) {
		if v.Name != "ids_near_2pow62" {
			continue
		}
		if v.ObjectID != 1<<62-4 {
			t.Fatalf("object id %d, expected 2^62-4 exactly", v.ObjectID)
		}
		if got := v.Records[0].StreamID; got != 1<<62+1 {
			t.Fatalf("stream id %d, expected 2^62+1 exactly", got)
		}
		return
	}
	t.Fatal("vector ids_near_2pow62 not found")
}

// TestWriterMatchesVectors writes every vector's records, grouped in write
// calls as AutoMQ's WAL upload groups them, with the vector's block size,
// through Write and through WriteEncoded, and expects AutoMQ's bytes, key,
// size, index and stream ranges; the Planner must predict the same layout
// and every size along the way.
func TestWriterMatchesVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			calls := v.calls(t)
			want := v.wantLayout()

			key, err := Key(v.ClusterID, v.ObjectID)
			if err != nil || key != v.ExpectedKey {
				t.Fatalf("Key(%q, %d) = %q, %v; expected %q", v.ClusterID, v.ObjectID, key, err, v.ExpectedKey)
			}
			if Namespace(v.ClusterID) != v.Namespace {
				t.Fatalf("namespace %q, expected %q", Namespace(v.ClusterID), v.Namespace)
			}
			if id, err := ParseKey(v.ClusterID, v.ExpectedKey); err != nil || id != v.ObjectID {
				t.Fatalf("ParseKey(%q) = %d, %v; expected %d", v.ExpectedKey, id, err, v.ObjectID)
			}

			var decoded, encoded bytes.Buffer
			wd, err := NewWriter(&decoded, v.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			we, err := NewWriter(&encoded, v.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			plan, err := NewPlanner(v.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			for _, call := range calls {
				stream := call[0].StreamID
				predicted, err := plan.SizeWith(stream, call)
				if err != nil {
					t.Fatal(err)
				}
				var bodies [][]byte
				for _, r := range call {
					bodies = append(bodies, encodeByREADME(r))
				}
				if p2, err := plan.SizeWithEncoded(stream, bodies); err != nil || p2 != predicted {
					t.Fatalf("SizeWithEncoded = %d, %v; SizeWith = %d", p2, err, predicted)
				}
				if err := plan.Write(stream, call); err != nil {
					t.Fatal(err)
				}
				if err := wd.Write(stream, call); err != nil {
					t.Fatal(err)
				}
				if err := we.WriteEncoded(stream, bodies); err != nil {
					t.Fatal(err)
				}
				if plan.Size() != predicted || wd.Size() != predicted || we.Size() != predicted {
					t.Fatalf("after the call for stream %d: sizes %d (plan), %d, %d; SizeWith predicted %d", stream, plan.Size(), wd.Size(), we.Size(), predicted)
				}
			}
			ld, err := wd.Close()
			if err != nil {
				t.Fatal(err)
			}
			le, err := we.Close()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				name string
				got  []byte
				l    Layout
			}{{"Write", decoded.Bytes(), ld}, {"WriteEncoded", encoded.Bytes(), le}, {"Planner", nil, plan.Layout()}} {
				if c.got != nil && !bytes.Equal(c.got, v.obj) {
					t.Fatalf("%s: %d bytes differ from AutoMQ's %d, first at %d", c.name, len(c.got), len(v.obj), firstDiff(c.got, v.obj))
				}
				if !reflect.DeepEqual(c.l, want) {
					t.Fatalf("%s: layout\n%+v\nexpected\n%+v", c.name, c.l, want)
				}
			}
			if int64(len(v.obj)) != want.Size {
				t.Fatalf("object_size %d, file of %d bytes", want.Size, len(v.obj))
			}
			for i, e := range v.Index {
				if e.BlockIndex.EndOffset() != e.EndOffset {
					t.Fatalf("index %d: end_offset %d, start + delta %d", i, e.EndOffset, e.BlockIndex.EndOffset())
				}
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestReaderMatchesVectors reads every AutoMQ object back: the index as
// AutoMQ's ObjectReader reported it, the records in object order with their
// payloads, and the stream ranges the writer reported.
func TestReaderMatchesVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			r := &countingReaderAt{r: bytes.NewReader(v.obj)}
			o, err := ReadIndex(r, int64(len(v.obj)))
			if err != nil {
				t.Fatal(err)
			}
			// One tail read, or two when the index is larger than the tail
			// (never with these sizes: streams_200's 7,200-byte index fits
			// the 8,192-byte tail).
			if r.reads != 1 {
				t.Fatalf("%d reads for the index", r.reads)
			}
			want := v.wantLayout()
			if o.Size() != want.Size || o.IndexPosition() != want.IndexPosition || o.IndexSize() != want.IndexSize {
				t.Fatalf("read size %d, index at %d of %d bytes; expected %d, %d, %d", o.Size(), o.IndexPosition(), o.IndexSize(), want.Size, want.IndexPosition, want.IndexSize)
			}
			if !reflect.DeepEqual(o.Index(), want.Index) {
				t.Fatalf("index\n%+v\nexpected\n%+v", o.Index(), want.Index)
			}
			got, err := o.ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			var wantRecs []Record
			for _, k := range v.ObjectRecordOrder {
				wantRecs = append(wantRecs, v.record(t, k))
			}
			if !reflect.DeepEqual(got, wantRecs) {
				t.Fatalf("records read back differ from the vector's")
			}
			d, err := Describe(bytes.NewReader(v.obj), int64(len(v.obj)), DescribeOptions{Records: true})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(d.Streams, v.StreamRanges) {
				t.Fatalf("described ranges %+v, expected %+v", d.Streams, v.StreamRanges)
			}
			if d.RecordCount != int64(len(v.Records)) || len(d.Blocks) != len(v.Index) {
				t.Fatalf("described %d records in %d blocks, expected %d in %d", d.RecordCount, len(d.Blocks), len(v.Records), len(v.Index))
			}
			for i, b := range d.Blocks {
				if b.EndOffset != v.Index[i].EndOffset || len(b.Records) != int(v.Index[i].RecordCount) {
					t.Fatalf("described block %d: %+v", i, b)
				}
			}
		})
	}
}

type countingReaderAt struct {
	r     io.ReaderAt
	reads int
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	c.reads++
	return c.r.ReadAt(p, off)
}
