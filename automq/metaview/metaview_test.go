package metaview_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"testing"

	"walden/automq/devcontroller"
	"walden/automq/metaview"
	"walden/automq/object"
)

func obj(id int64, key string, size int64, ranges ...devcontroller.ObjectRange) metaview.Object {
	return metaview.Object{ObjectID: id, Key: key, Size: size, State: devcontroller.ObjectCommitted, Ranges: ranges}
}

func rng(stream, start, end int64) devcontroller.ObjectRange {
	return devcontroller.ObjectRange{StreamID: stream, StartOffset: start, EndOffset: end}
}

func TestSegments(t *testing.T) {
	objs := []metaview.Object{
		obj(3, "k3", 10, rng(1, 20, 30)),
		obj(1, "k1", 10, rng(1, 0, 10), rng(2, 0, 5)),
		obj(2, "k2", 10, rng(1, 10, 20)),
		{ObjectID: 4, State: devcontroller.ObjectPrepared},
	}
	segs, err := metaview.Segments(objs, 1, 12, 30)
	if err != nil || len(segs) != 2 || segs[0].Object.ObjectID != 2 || segs[1].Object.ObjectID != 3 {
		t.Fatalf("segments %+v %v", segs, err)
	}
	if _, err := metaview.Segments(objs, 1, 0, 35); !errors.Is(err, metaview.ErrGap) {
		t.Fatalf("a stream ending beyond its objects: %v", err)
	}
	gap := []metaview.Object{obj(1, "k1", 10, rng(1, 0, 10)), obj(3, "k3", 10, rng(1, 12, 30))}
	if _, err := metaview.Segments(gap, 1, 0, 30); !errors.Is(err, metaview.ErrGap) {
		t.Fatalf("a gap: %v", err)
	}
	over := []metaview.Object{obj(1, "k1", 10, rng(1, 0, 10)), obj(3, "k3", 10, rng(1, 9, 30))}
	if _, err := metaview.Segments(over, 1, 0, 30); !errors.Is(err, metaview.ErrOverlap) {
		t.Fatalf("an overlap: %v", err)
	}
}

// store serves objects from memory.
type store map[string][]byte

func (s store) ReaderAt(_ context.Context, key string, _ int64) io.ReaderAt {
	return bytes.NewReader(s[key])
}

func TestReadSegment(t *testing.T) {
	var buf bytes.Buffer
	w, err := object.NewWriter(&buf, 64)
	if err != nil {
		t.Fatal(err)
	}
	var recs []object.Record
	for i := int64(0); i < 10; i++ {
		recs = append(recs, object.Record{StreamID: 5, Epoch: 1, BaseOffset: 100 + 2*i, Count: 2, Payload: []byte(fmt.Sprintf("record %02d with a payload", i))})
	}
	if err := w.Write(5, recs); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st := store{"k": buf.Bytes()}
	r := metaview.NewReader(st)
	seg := metaview.Segment{StreamID: 5, StartOffset: 100, EndOffset: 120, Object: obj(1, "k", int64(buf.Len()), rng(5, 100, 120))}
	var got []int64
	if err := r.ReadSegment(context.Background(), seg, 105, func(rec object.Record) bool {
		got = append(got, rec.BaseOffset)
		return len(got) < 3
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[104 106 108]" {
		t.Fatalf("read %v", got)
	}
	seg.EndOffset = 124
	if err := r.ReadSegment(context.Background(), seg, 100, func(object.Record) bool { return true }); !errors.Is(err, metaview.ErrDisagree) {
		t.Fatalf("a range the object does not hold: %v", err)
	}
	damaged := append([]byte(nil), buf.Bytes()...)
	damaged[0] ^= 0xFF // the first block's magic (AutoMQ objects carry no checksum)
	r = metaview.NewReader(store{"k": damaged})
	seg.EndOffset = 120
	if err := r.ReadSegment(context.Background(), seg, 100, func(object.Record) bool { return true }); !errors.Is(err, object.ErrCorrupt) {
		t.Fatalf("a damaged object: %v", err)
	}
}

func TestClient(t *testing.T) {
	dc, err := devcontroller.New(devcontroller.Config{ClusterID: "mv", Streams: []int64{3, 9}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(dc.HTTPHandler())
	defer hs.Close()
	c := metaview.NewClient(hs.URL+"/", nil)
	s, ok, err := c.Stream(context.Background(), 9)
	if err != nil || !ok || s.StreamID != 9 || s.State != devcontroller.StreamClosed {
		t.Fatalf("stream 9: %+v %v %v", s, ok, err)
	}
	if _, ok, err := c.Stream(context.Background(), 4); ok || err != nil {
		t.Fatalf("stream 4: %v %v", ok, err)
	}
	if objs, err := c.Committed(context.Background()); err != nil || len(objs) != 0 {
		t.Fatalf("objects %v %v", objs, err)
	}
	bad := metaview.NewClient(hs.URL+"/nothing", nil)
	if _, err := bad.Streams(context.Background()); !errors.Is(err, metaview.ErrUnavailable) {
		t.Fatalf("a wrong URL: %v", err)
	}
}
