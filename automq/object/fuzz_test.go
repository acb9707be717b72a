package object

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// maxFuzzObject bounds the objects the fuzz target reads (the vectors are
// at most 65,663 bytes).
const maxFuzzObject = 1 << 20

// FuzzReadObject feeds arbitrary bytes to the reader as a whole object. The
// reader must not panic; every refusal must match ErrCorrupt (a
// bytes.Reader has no I/O errors); and whatever it accepts must be exactly
// what the Writer writes from the records it returned, one write call per
// block, so the reader accepts nothing the format does not define. It is
// seeded with every vector and damaged copies of them.
func FuzzReadObject(f *testing.F) {
	names, err := filepath.Glob("testdata/*.obj")
	if err != nil || len(names) == 0 {
		f.Fatalf("no vectors in testdata: %v", err)
	}
	var empty bytes.Buffer
	w, _ := NewWriter(&empty, DefaultBlockSize)
	if _, err := w.Close(); err != nil {
		f.Fatal(err)
	}
	f.Add(empty.Bytes())
	for _, name := range names {
		obj, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(obj)
		for _, at := range []int{0, 1, 5, 10, 11, 20, len(obj) - 48, len(obj) - 40, len(obj) - 1} {
			if at >= 0 && at < len(obj) {
				bad := bytes.Clone(obj)
				bad[at] ^= 0x41
				f.Add(bad)
			}
		}
		f.Add(obj[:len(obj)-1])
		f.Add(obj[1:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzObject {
			return
		}
		o, err := ReadIndex(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("refusal that is not ErrCorrupt: %v", err)
			}
			return
		}
		var blocks [][]Record
		for i := range o.Index() {
			recs, err := o.ReadBlock(i)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) || recs != nil {
					t.Fatalf("block %d: %d records with %v", i, len(recs), err)
				}
				return
			}
			blocks = append(blocks, recs)
		}
		// Accepted: the Writer makes the same bytes. A block size no total
		// reaches makes each call exactly one block.
		var buf bytes.Buffer
		w, err := NewWriter(&buf, math.MaxInt)
		if err != nil {
			t.Fatal(err)
		}
		for i, recs := range blocks {
			if err := w.Write(recs[0].StreamID, recs); err != nil {
				t.Fatalf("the reader accepted block %d, the writer refuses it: %v", i, err)
			}
		}
		l, err := w.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), data) {
			t.Fatalf("accepted object of %d bytes re-encodes to %d different bytes (first difference at %d)", len(data), buf.Len(), firstDiff(buf.Bytes(), data))
		}
		if !reflect.DeepEqual(l.Index, o.Index()) && len(l.Index)+len(o.Index()) > 0 {
			t.Fatal("index re-encodes differently")
		}
		if _, err := Describe(bytes.NewReader(data), int64(len(data)), DescribeOptions{Records: true}); err != nil {
			t.Fatalf("Describe refuses what ReadIndex and ReadBlock accept: %v", err)
		}
	})
}
