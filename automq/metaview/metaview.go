package metaview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"walden/automq/devcontroller"
	"walden/automq/object"
)

// Errors of this package; test with errors.Is.
var (
	// ErrUnavailable means the view did not answer, or answered something
	// else than its JSON.
	ErrUnavailable = errors.New("metaview: the controller's metadata view is unavailable")
	// ErrGap means a stream's committed ranges leave offsets out.
	ErrGap = errors.New("metaview: the stream's committed objects leave a gap")
	// ErrOverlap means two committed objects claim the same offsets of a
	// stream.
	ErrOverlap = errors.New("metaview: two committed objects claim the same offsets")
	// ErrDisagree means an object's index does not hold what the
	// controller says it holds.
	ErrDisagree = errors.New("metaview: an object's index disagrees with the controller")
)

// Stream and Object are the view's stream and object (the development
// controller's JSON).
type (
	Stream = devcontroller.StreamView
	Object = devcontroller.ObjectView
	// View is the whole view: nodes, streams, objects, voters, answers.
	View = devcontroller.View
)

// Client reads the controller's metadata view over HTTP. It is safe for
// concurrent use.
type Client struct {
	base string
	http *http.Client
}

// NewClient returns a client of the view at baseURL (http://host:port);
// hc nil uses a client with a 5s timeout.
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Second}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), http: hc}
}

// URL is the view's base URL.
func (c *Client) URL() string { return c.base }

func (c *Client) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, c.base+path, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%w: GET %s answered %s: %s", ErrUnavailable, c.base+path, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(out); err != nil {
		return fmt.Errorf("%w: GET %s: not the view's JSON: %w", ErrUnavailable, c.base+path, err)
	}
	return nil
}

// State returns the whole view.
func (c *Client) State(ctx context.Context) (*View, error) {
	var v View
	if err := c.get(ctx, "/v1/state", &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Streams returns every stream, ordered by id.
func (c *Client) Streams(ctx context.Context) ([]Stream, error) {
	var body struct {
		Streams []Stream `json:"streams"`
	}
	if err := c.get(ctx, "/v1/streams", &body); err != nil {
		return nil, err
	}
	return body.Streams, nil
}

// Stream returns one stream; ok is false when the controller has none of
// that id.
func (c *Client) Stream(ctx context.Context, id int64) (Stream, bool, error) {
	ss, err := c.Streams(ctx)
	if err != nil {
		return Stream{}, false, err
	}
	i, ok := slices.BinarySearchFunc(ss, id, func(s Stream, id int64) int {
		switch {
		case s.StreamID < id:
			return -1
		case s.StreamID > id:
			return 1
		}
		return 0
	})
	if !ok {
		return Stream{}, false, nil
	}
	return ss[i], true, nil
}

// Committed returns the committed objects, ordered by id.
func (c *Client) Committed(ctx context.Context) ([]Object, error) {
	var body struct {
		Objects []Object `json:"objects"`
	}
	if err := c.get(ctx, "/v1/objects?state="+string(devcontroller.ObjectCommitted), &body); err != nil {
		return nil, err
	}
	return body.Objects, nil
}

// Segment is one committed range of a stream and the object holding it.
type Segment struct {
	StreamID    int64
	StartOffset int64
	EndOffset   int64
	Object      Object
}

// AllSegments returns every committed range of stream streamID, in offset
// order, without checking that they follow on.
func AllSegments(objs []Object, streamID int64) []Segment {
	var segs []Segment
	for _, o := range objs {
		if o.State != devcontroller.ObjectCommitted {
			continue
		}
		for _, r := range o.Ranges {
			if r.StreamID == streamID && r.EndOffset > r.StartOffset {
				segs = append(segs, Segment{StreamID: streamID, StartOffset: r.StartOffset, EndOffset: r.EndOffset, Object: o})
			}
		}
	}
	slices.SortFunc(segs, func(a, b Segment) int {
		switch {
		case a.StartOffset < b.StartOffset:
			return -1
		case a.StartOffset > b.StartOffset:
			return 1
		}
		return 0
	})
	return segs
}

// Segments returns the ranges of stream streamID that the committed objects
// hold, in offset order, from the first at or after from up to end (the
// stream's end offset at the controller). A range that starts beyond the
// previous one's end is ErrGap (naming the missing offsets) unless it is
// the first and starts at or before from; two ranges claiming one offset
// are ErrOverlap. Ranges wholly below from are left out.
func Segments(objs []Object, streamID, from, end int64) ([]Segment, error) {
	segs := AllSegments(objs, streamID)
	for i := 1; i < len(segs); i++ {
		if segs[i].StartOffset < segs[i-1].EndOffset {
			return nil, fmt.Errorf("%w: stream %d: object %d holds [%d, %d) and object %d holds [%d, %d)", ErrOverlap, streamID,
				segs[i-1].Object.ObjectID, segs[i-1].StartOffset, segs[i-1].EndOffset, segs[i].Object.ObjectID, segs[i].StartOffset, segs[i].EndOffset)
		}
	}
	var out []Segment
	next := from
	for _, s := range segs {
		if s.EndOffset <= from || s.StartOffset >= end {
			continue
		}
		if s.StartOffset > next {
			return out, fmt.Errorf("%w: stream %d: offsets [%d, %d) are in no committed object (the next one, %d, starts at %d)",
				ErrGap, streamID, next, s.StartOffset, s.Object.ObjectID, s.StartOffset)
		}
		out = append(out, s)
		next = s.EndOffset
	}
	if next < end {
		return out, fmt.Errorf("%w: stream %d: offsets [%d, %d) are in no committed object (the stream ends at %d)", ErrGap, streamID, next, end, end)
	}
	return out, nil
}

// Store is the part of an S3 client Reader needs (objstore.Client).
type Store interface {
	ReaderAt(ctx context.Context, key string, size int64) io.ReaderAt
}

// Reader reads stream records from committed objects. It is safe for
// concurrent use.
type Reader struct {
	store Store
}

// NewReader returns a Reader of the objects in store.
func NewReader(store Store) *Reader {
	return &Reader{store: store}
}

// open reads the footer and index of o.
func (r *Reader) open(ctx context.Context, o Object) (*object.Object, error) {
	ra := r.store.ReaderAt(ctx, o.Key, o.Size)
	ob, err := object.ReadIndex(ra, o.Size)
	if err != nil {
		return nil, fmt.Errorf("metaview: object %d (%s, %d bytes): %w", o.ObjectID, o.Key, o.Size, err)
	}
	return ob, nil
}

// ReadSegment reads the records of seg with base offsets in [from,
// seg.EndOffset) — the record holding from included — and calls fn with
// each, in offset order, until fn returns false. Every block read is
// checked; a block of the stream that the index does not place inside the
// segment's range, or a range the index does not cover, is ErrDisagree.
func (r *Reader) ReadSegment(ctx context.Context, seg Segment, from int64, fn func(object.Record) bool) error {
	ob, err := r.open(ctx, seg.Object)
	if err != nil {
		return err
	}
	next := seg.StartOffset
	for i, b := range ob.Index() {
		if b.StreamID != seg.StreamID {
			continue
		}
		if b.StartOffset < seg.StartOffset || b.EndOffset() > seg.EndOffset {
			return fmt.Errorf("%w: object %d: block %d holds stream %d [%d, %d), outside the committed range [%d, %d)", ErrDisagree,
				seg.Object.ObjectID, i, seg.StreamID, b.StartOffset, b.EndOffset(), seg.StartOffset, seg.EndOffset)
		}
		next = max(next, b.EndOffset())
		if b.EndOffset() <= from {
			continue
		}
		recs, err := ob.ReadBlock(i)
		if err != nil {
			return fmt.Errorf("metaview: object %d (%s): %w", seg.Object.ObjectID, seg.Object.Key, err)
		}
		for _, rec := range recs {
			if rec.EndOffset() <= from {
				continue
			}
			if !fn(rec) {
				return nil
			}
		}
	}
	if next != seg.EndOffset {
		return fmt.Errorf("%w: object %d holds stream %d up to offset %d, the controller says %d", ErrDisagree,
			seg.Object.ObjectID, seg.StreamID, next, seg.EndOffset)
	}
	return nil
}
