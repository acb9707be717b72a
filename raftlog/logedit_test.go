package raftlog

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Helpers that read and rewrite segment files as damage would, but with
// valid checksums, so that the log's own checks (not the checksums) must
// catch what is wrong.

// segmentPaths returns the segment files of the data directory dir, oldest
// first.
func segmentPaths(t testing.TB, dir string) []string {
	t.Helper()
	names, err := osFS{}.ReadDir(filepath.Join(dir, logDirName))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if _, ok := parseSegmentName(n); ok {
			out = append(out, filepath.Join(dir, logDirName, n))
		}
	}
	return out
}

// loggedFrame is one frame of a segment: its sequence number, offset and
// records (copied out of the file).
type loggedFrame struct {
	seq  uint64
	off  int64
	recs []logRecord
}

// readFrames reads the complete frames of a segment file.
func readFrames(t testing.TB, path string) []loggedFrame {
	t.Helper()
	f, err := osFS{}.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	var frames []loggedFrame
	_, err = scanSegment(&segmentReader{f: f, size: size}, 0, true, func(off int64, payload []byte) error {
		recs, err := parseRecords(payload, nil)
		if err != nil {
			return err
		}
		for i := range recs {
			recs[i].data = bytes.Clone(recs[i].data)
		}
		hdr := make([]byte, frameHeaderSize)
		if _, err := f.ReadAt(hdr, off); err != nil {
			return err
		}
		frames = append(frames, loggedFrame{seq: binary.BigEndian.Uint64(hdr[8:]), off: off, recs: recs})
		return nil
	})
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return frames
}

// writeFrames rewrites the segment file path (keeping its size) with frames,
// numbered on from the first frame's sequence number.
func writeFrames(t testing.TB, path string, frames []loggedFrame) {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, info.Size())
	var off int64
	seq := frames[0].seq
	for _, fr := range frames {
		var fb frameBuf
		fb.reset()
		for _, r := range fr.recs {
			fb.b = append(fb.b, r.typ)
			fb.b = binary.AppendUvarint(fb.b, uint64(len(r.data)))
			fb.b = append(fb.b, r.data...)
		}
		b := fb.seal(seq)
		off += int64(copy(out[off:], b))
		seq++
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// editLastSegment rewrites the newest segment of dir with what edit makes of
// its frames.
func editLastSegment(t testing.TB, dir string, edit func([]loggedFrame) []loggedFrame) {
	t.Helper()
	paths := segmentPaths(t, dir)
	path := paths[len(paths)-1]
	writeFrames(t, path, edit(readFrames(t, path)))
}

// mapRecords applies fn to every record of every frame; fn returns the
// records that replace it (none: dropped).
func mapRecords(frames []loggedFrame, fn func(logRecord) []logRecord) []loggedFrame {
	for i := range frames {
		var recs []logRecord
		for _, r := range frames[i].recs {
			recs = append(recs, fn(r)...)
		}
		frames[i].recs = recs
	}
	return frames
}

func entryOf(t testing.TB, r logRecord) *raftpb.Entry {
	t.Helper()
	e := &raftpb.Entry{}
	if err := proto.Unmarshal(r.data, e); err != nil {
		t.Fatal(err)
	}
	return e
}

func protoRecord(t testing.TB, typ byte, m proto.Message) logRecord {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return logRecord{typ: typ, data: b}
}

// flipByte xors one byte of a file.
func flipByte(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
