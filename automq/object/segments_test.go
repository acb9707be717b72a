package object

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// TestSegmentsReadBackEveryVector writes every vector through a Writer into
// Segments, decoded (the Writer reuses its record-header buffer) and
// encoded, and reads it back whole and in random ranges: AutoMQ's bytes.
func TestSegmentsReadBackEveryVector(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			var decoded, encoded Segments
			wd, err := NewWriter(&decoded, v.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			we, err := NewWriter(&encoded, v.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			for _, call := range v.calls(t) {
				var bodies [][]byte
				for _, r := range call {
					bodies = append(bodies, encodeByREADME(r))
				}
				if err := wd.Write(call[0].StreamID, call); err != nil {
					t.Fatal(err)
				}
				if err := we.WriteEncoded(call[0].StreamID, bodies); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := wd.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := we.Close(); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, uint64(len(v.obj))))
			for name, s := range map[string]*Segments{"Write": &decoded, "WriteEncoded": &encoded} {
				if s.Size() != int64(len(v.obj)) {
					t.Fatalf("%s: %d bytes, AutoMQ's object has %d", name, s.Size(), len(v.obj))
				}
				got, err := io.ReadAll(io.NewSectionReader(s, 0, s.Size()))
				if err != nil || !bytes.Equal(got, v.obj) {
					t.Fatalf("%s: read back %d bytes (%v), differ from AutoMQ's %d at %d", name, len(got), err, len(v.obj), firstDiff(got, v.obj))
				}
				for range 200 {
					off := rng.Int64N(int64(len(v.obj)))
					p := make([]byte, rng.IntN(len(v.obj)-int(off))+1)
					n, err := s.ReadAt(p, off)
					if err != nil || n != len(p) || !bytes.Equal(p, v.obj[off:off+int64(n)]) {
						t.Fatalf("%s: ReadAt(%d bytes, %d) = %d, %v", name, len(p), off, n, err)
					}
				}
			}
		})
	}
}

// TestSegmentsKeepLongWritesAndCopyShortOnes: a long write is read where it
// lies (no copy); a short one is copied, so a writer reusing its buffer
// does not change what was written; reads past the end are io.EOF.
func TestSegmentsKeepLongWritesAndCopyShortOnes(t *testing.T) {
	var s Segments
	long := bytes.Repeat([]byte{'L'}, 100)
	short := []byte("hdr")
	for _, p := range [][]byte{short, short, long, short} {
		if n, err := s.Write(p); err != nil || n != len(p) {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	short[0], long[0] = 'X', 'Y'
	got := make([]byte, s.Size())
	if n, err := s.ReadAt(got, 0); err != nil || n != 109 {
		t.Fatalf("ReadAt = %d, %v", n, err)
	}
	want := "hdrhdrY" + string(bytes.Repeat([]byte{'L'}, 99)) + "hdr"
	if string(got) != want {
		t.Fatalf("read %q, expected %q", got, want)
	}
	if len(s.segs) != 3 {
		t.Fatalf("%d segments, expected 3 (two short writes share one copy)", len(s.segs))
	}
	p := make([]byte, 10)
	if n, err := s.ReadAt(p, 105); n != 4 || !errors.Is(err, io.EOF) {
		t.Fatalf("ReadAt across the end = %d, %v; expected 4, EOF", n, err)
	}
	if n, err := s.ReadAt(p, 109); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("ReadAt at the end = %d, %v", n, err)
	}
	if _, err := s.ReadAt(p, -1); err == nil {
		t.Fatal("ReadAt at a negative offset succeeded")
	}
}
