package failover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"walden/automq/controller"
	"walden/automq/object"
	"walden/automq/protocol"
	"walden/objstore"
)

// planned is one object of a batch: a stream-set object holding several
// streams, or a stream object holding one.
type planned struct {
	kind    string
	streams []*streamRecs
	size    int64
	ranges  []object.StreamRange
	id      int64
	key     string
}

// commitAttempts bounds how often a batch is prepared again after the
// controller forgot its ids (OBJECT_NOT_EXIST: they expired).
const commitAttempts = 3

// plan splits a batch into objects as AutoMQ's WAL upload task does
// (DefaultUploadWriteAheadLogTask in 1.4.1): a stream with at least
// stream_split_size bytes of payload gets a stream object of its own, the
// others share one stream-set object; when only one stream has records, or
// every stream reaches the split size, there is no stream-set object.
func (r *run) plan(b *batch) ([]*planned, error) {
	split := r.f.cfg.StreamSplitSize
	force := len(b.streams) == 1
	if !force {
		force = true
		for _, s := range b.streams {
			if s.payload < split {
				force = false
				break
			}
		}
	}
	var set *planned
	var out []*planned
	for _, s := range b.streams {
		if force || s.payload >= split {
			out = append(out, &planned{kind: KindStream, streams: []*streamRecs{s}})
			continue
		}
		if set == nil {
			set = &planned{kind: KindStreamSet}
		}
		set.streams = append(set.streams, s)
	}
	if set != nil {
		// The stream-set object takes the first prepared id, as AutoMQ
		// prepares it before its stream objects.
		out = append([]*planned{set}, out...)
	}
	for _, o := range out {
		p, err := object.NewPlanner(r.f.cfg.BlockSize)
		if err != nil {
			return nil, err
		}
		for _, s := range o.streams {
			if err := p.WriteEncoded(s.id, s.bodies()); err != nil {
				return nil, fmt.Errorf("automq failover: plan the object of stream %d: %w", s.id, err)
			}
		}
		l := p.Layout()
		o.size, o.ranges = l.Size, l.Ranges
	}
	return out, nil
}

func (s *streamRecs) bodies() [][]byte {
	out := make([][]byte, len(s.recs))
	for i, r := range s.recs {
		out[i] = r.body
	}
	return out
}

// uploadAndCommit prepares ids for the batch's objects, uploads them and
// commits them in failover mode.
func (r *run) uploadAndCommit(ctx context.Context, b *batch) error {
	objs, err := r.plan(b)
	if err != nil {
		return err
	}
	var total int64
	for _, o := range objs {
		total += o.size
	}
	r.planned += total
	attrs, err := object.Attributes{Bucket: r.f.cfg.BucketIndex}.Encode()
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		if err := r.prepare(ctx, objs); err != nil {
			return err
		}
		if err := r.uploadAll(ctx, objs); err != nil {
			return err
		}
		err := r.commit(ctx, b, objs, attrs)
		if errors.Is(err, protocol.ErrObjectNotExist) && attempt < commitAttempts {
			r.log.Warn("the controller forgot the prepared ids (expired): preparing again", "attempt", attempt, "err", err)
			r.dropObjects(objs)
			continue
		}
		return err
	}
}

// prepare reserves one id per object and names their keys.
func (r *run) prepare(ctx context.Context, objs []*planned) error {
	if err := r.emit(StepUpload, false, "preparing %s", plural(int64(len(objs)), "object id", "object ids")); err != nil {
		return err
	}
	first, err := r.f.ctl.PrepareS3Object(ctx, r.req.NodeID, int32(len(objs)), r.f.cfg.PrepareTTL)
	if err != nil {
		return r.controllerError(err)
	}
	for i, o := range objs {
		o.id = first + int64(i)
		if o.key, err = object.Key(r.f.cfg.ClusterID, o.id); err != nil {
			return fmt.Errorf("automq failover: the controller prepared id %d: %w", o.id, err)
		}
		r.rep.Objects = append(r.rep.Objects, ObjectReport{ObjectID: o.id, Key: o.key, Size: o.size, Kind: o.kind, State: StatePrepared})
	}
	return nil
}

// dropObjects removes objects that will never be committed from the
// report (their ids expire at the controller).
func (r *run) dropObjects(objs []*planned) {
	gone := map[int64]bool{}
	for _, o := range objs {
		gone[o.id] = true
	}
	kept := r.rep.Objects[:0]
	for _, o := range r.rep.Objects {
		if !gone[o.ObjectID] || o.State == StateCommitted {
			kept = append(kept, o)
		}
	}
	r.rep.Objects = kept
}

// uploadAll uploads the objects, upload_objects at a time.
func (r *run) uploadAll(ctx context.Context, objs []*planned) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var done atomic.Int64
	base := r.uploaded
	report := func() {
		if r.f.opts.Uploaded != nil {
			r.f.opts.Uploaded(base+done.Load(), r.planned)
		}
	}
	sem := make(chan struct{}, r.f.cfg.UploadObjects)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for _, o := range objs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var cur atomic.Int64
			err := r.upload(ctx, o, func(n int64) {
				done.Add(n - cur.Swap(n))
				report()
			})
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				cancel(err)
				return
			}
			done.Add(o.size - cur.Swap(o.size))
			report()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	var n int64
	for _, o := range objs {
		n += o.size
		if rep := r.rep.object(o.id); rep != nil {
			rep.State = StateUploaded
		}
	}
	r.uploaded += n
	r.rep.BytesUploaded += n
	return r.emit(StepUpload, true, "uploaded %s, %d bytes", plural(int64(len(objs)), "object", "objects"), n)
}

// write encodes o to w.
func (r *run) write(o *planned, w io.Writer) error {
	ow, err := object.NewWriter(w, r.f.cfg.BlockSize)
	if err != nil {
		return err
	}
	for _, s := range o.streams {
		if err := ow.WriteEncoded(s.id, s.bodies()); err != nil {
			return fmt.Errorf("write object %d: stream %d: %w", o.id, s.id, err)
		}
	}
	l, err := ow.Close()
	if err != nil {
		return fmt.Errorf("write object %d: %w", o.id, err)
	}
	if l.Size != o.size {
		return fmt.Errorf("write object %d: %d bytes written, %d planned", o.id, l.Size, o.size)
	}
	return nil
}

// upload uploads o under its key, streaming it from the WAL's records into
// the multipart upload. An object already under the key is left as it is
// when it holds exactly these bytes (a retried upload), and refused
// otherwise: a prepared id is this failover's, so other bytes under its key
// mean something else wrote there.
func (r *run) upload(ctx context.Context, o *planned, progress func(int64)) error {
	info, err := r.f.store.Head(ctx, o.key)
	switch {
	case err == nil:
		same := info.Size == o.size
		if same {
			if same, err = r.sameBytes(ctx, o); err != nil {
				return fmt.Errorf("automq failover: compare object %s with what this failover would write: %w", o.key, err)
			}
		}
		if !same {
			return fmt.Errorf("automq failover: %w: %s (object %d) holds %d bytes that differ from the %d bytes this failover would write; "+
				"it was not overwritten and nothing was committed", ErrObjectExists, o.key, o.id, info.Size, o.size)
		}
		r.log.Info("object already uploaded with the same bytes", "key", o.key, "size", o.size)
		return nil
	case !errors.Is(err, objstore.ErrNotFound):
		return fmt.Errorf("automq failover: look for object %s: %w", o.key, err)
	}
	// The object is laid out over the batch's records, which stay in
	// memory until the batch is committed: its bytes are read where they
	// lie, not copied into buffers.
	body := &object.Segments{}
	if err := r.write(o, body); err != nil {
		return fmt.Errorf("automq failover: lay out object %d: %w", o.id, err)
	}
	_, err = r.f.store.UploadAt(ctx, o.key, body, o.size, progress)
	if err != nil {
		return fmt.Errorf("automq failover: upload object %d (%s, %d bytes): %w", o.id, o.key, o.size, err)
	}
	return nil
}

// sameBytes compares the object under o's key with o's encoding, a range
// at a time.
func (r *run) sameBytes(ctx context.Context, o *planned) (bool, error) {
	c := &comparer{ctx: ctx, store: r.f.store, key: o.key, size: o.size}
	err := r.write(o, c)
	if errors.Is(err, errDiffer) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return c.off == o.size, nil
}

var errDiffer = errors.New("bytes differ")

// comparer is an io.Writer that compares what is written with an S3
// object, reading it in ranges.
type comparer struct {
	ctx   context.Context
	store Store
	key   string
	size  int64
	off   int64
	buf   []byte
	bufAt int64
}

func (c *comparer) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if c.off >= c.bufAt+int64(len(c.buf)) {
			if c.off >= c.size {
				return 0, errDiffer
			}
			want := min(int64(8<<20), c.size-c.off)
			b, err := c.store.GetRange(c.ctx, c.key, c.off, want)
			if err != nil {
				return 0, err
			}
			if len(b) == 0 {
				return 0, errDiffer
			}
			c.buf, c.bufAt = b, c.off
		}
		i := int(c.off - c.bufAt)
		m := min(len(p), len(c.buf)-i)
		if !bytes.Equal(p[:m], c.buf[i:i+m]) {
			return 0, errDiffer
		}
		p = p[m:]
		c.off += int64(m)
	}
	return n, nil
}

// commit commits the batch's objects in failover mode. A repeated commit
// (REDUNDANT_OPERATION) is done. OFFSET_NOT_MATCHED means the controller's
// end offsets moved: when they moved exactly to the batch's ends, an
// earlier run committed these records (under other ids) and the batch is
// done; otherwise the error names what was expected.
func (r *run) commit(ctx context.Context, b *batch, objs []*planned, attrs int32) error {
	if err := r.emit(StepCommit, false, "committing %s of %s", plural(int64(len(objs)), "object", "objects"),
		plural(int64(len(b.streams)), "stream", "streams")); err != nil {
		return err
	}
	req := controller.CommitRequest{NodeID: r.req.NodeID, NodeEpoch: r.epoch, ObjectID: -1, OrderID: -1, FailoverMode: true}
	for _, o := range objs {
		if o.kind == KindStreamSet {
			req.ObjectID, req.OrderID, req.ObjectSize, req.Attributes = o.id, o.id, o.size, attrs
			for _, s := range o.streams {
				// AutoMQ's upload sends stream epoch -1 in the ranges.
				req.StreamRanges = append(req.StreamRanges, protocol.ObjectStreamRange{StreamID: s.id, StreamEpoch: -1,
					StartOffset: s.start(), EndOffset: s.end()})
			}
			continue
		}
		s := o.streams[0]
		req.StreamObjects = append(req.StreamObjects, protocol.StreamObject{ObjectID: o.id, ObjectSize: o.size, StreamID: s.id,
			StartOffset: s.start(), EndOffset: s.end(), Attributes: attrs})
	}
	res, err := r.f.ctl.CommitStreamSetObject(ctx, req)
	if errors.Is(err, protocol.ErrOffsetNotMatched) {
		done, derr := r.committedBefore(ctx, b)
		if derr != nil {
			return derr
		}
		if !done {
			return err
		}
		r.log.Warn("these records were committed by an earlier run under other object ids: this batch is done", "err", err)
		r.dropObjects(objs)
		r.committed(b)
		return r.emit(StepCommit, true, "committed by an earlier run")
	}
	if err != nil {
		return r.controllerError(err)
	}
	for _, o := range objs {
		if rep := r.rep.object(o.id); rep != nil {
			rep.State = StateCommitted
		}
	}
	r.committed(b)
	detail := fmt.Sprintf("committed %s (%s), CommitStreamSetObject v%d", plural(int64(len(objs)), "object", "objects"),
		plural(int64(b.count), "record", "records"), res.Version)
	if res.Redundant {
		detail += ", committed before (REDUNDANT_OPERATION)"
	}
	return r.emit(StepCommit, true, "%s", detail)
}

// committed records the batch's records as committed in the report.
func (r *run) committed(b *batch) {
	for _, s := range b.streams {
		st := r.rep.stream(s.id, 0, s.start())
		st.EndOffsetAfter = s.end()
		st.Records += int64(len(s.recs))
		r.rep.Records += int64(len(s.recs))
	}
}

// committedBefore asks the controller whether every stream of the batch
// already ends where the batch ends; when a stream ends elsewhere the error
// names it.
func (r *run) committedBefore(ctx context.Context, b *batch) (bool, error) {
	opening, err := r.f.ctl.GetOpeningStreams(ctx, r.req.NodeID, r.epoch, true)
	if err != nil {
		return false, r.controllerError(err)
	}
	ends := map[int64]int64{}
	for _, s := range opening {
		ends[s.StreamID] = s.EndOffset
	}
	var wrong []string
	for _, s := range b.streams {
		end, ok := ends[s.id]
		switch {
		case !ok:
			wrong = append(wrong, fmt.Sprintf("stream %d is no longer opening", s.id))
		case end == s.end():
		default:
			wrong = append(wrong, fmt.Sprintf("stream %d ends at %d at the controller, expected %d (before this batch) or %d (after it)",
				s.id, end, s.start(), s.end()))
		}
	}
	if len(wrong) == 0 {
		return true, nil
	}
	for _, s := range b.streams {
		if ends[s.id] != s.start() {
			return false, fmt.Errorf("automq failover: %w: the controller's end offsets changed under this failover (%s); "+
				"nothing was committed twice: run the failover again to read them anew", ErrOffsetsMoved, joinLines(wrong))
		}
	}
	return false, nil
}
