package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sort"

	"walden/automq/controller"
	"walden/automq/failover"
	"walden/automq/object"
	"walden/automq/protocol"
)

// automqUpload is one upload of WAL records as AutoMQ's WAL upload task
// makes it: a stream-set object, and a stream object for each stream whose
// payload reaches the stream split size (or one stream object per stream
// when only one stream has records, or when every stream reaches it). It is
// retried unchanged until committed; ids are prepared again only when the
// controller forgot them.
type automqUpload struct {
	records []pendingRecord // WAL order
	last    int64           // WAL offset of the last record
	objects []*automqObject
	// prepared says the objects hold ids prepared at the controller.
	prepared bool
}

type automqObject struct {
	kind     string // failover.KindStreamSet or failover.KindStream
	streams  []int64
	data     []byte
	ranges   []object.StreamRange
	id       int64
	key      string
	uploaded bool
}

// newUpload lays records out into objects and encodes them.
func (b *AutomqBroker) newUpload(records []pendingRecord) (*automqUpload, error) {
	byStream := map[int64][]object.Record{}
	payload := map[int64]int64{}
	for _, r := range records {
		bt := r.batch
		if bt.StreamID > math.MaxInt64 || bt.Epoch > math.MaxInt64 || bt.BaseOffset > math.MaxInt64 || bt.Count > math.MaxInt32 {
			return nil, fmt.Errorf("broker: stream %d offset %d: not an AutoMQ record", bt.StreamID, bt.BaseOffset)
		}
		id := int64(bt.StreamID)
		byStream[id] = append(byStream[id], object.Record{StreamID: id, Epoch: int64(bt.Epoch), BaseOffset: int64(bt.BaseOffset),
			Count: int32(bt.Count), Payload: bt.Payload})
		payload[id] += int64(len(bt.Payload))
	}
	ids := make([]int64, 0, len(byStream))
	for id := range byStream {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		recs := byStream[id]
		sort.SliceStable(recs, func(i, j int) bool { return recs[i].BaseOffset < recs[j].BaseOffset })
	}
	split := b.cfg.Automq.StreamSplitSize
	force := len(ids) == 1
	if !force {
		force = true
		for _, id := range ids {
			if payload[id] < split {
				force = false
				break
			}
		}
	}
	up := &automqUpload{records: records, last: records[len(records)-1].walOffset}
	var set *automqObject
	var alone []*automqObject
	for _, id := range ids {
		if force || payload[id] >= split {
			alone = append(alone, &automqObject{kind: failover.KindStream, streams: []int64{id}})
			continue
		}
		if set == nil {
			set = &automqObject{kind: failover.KindStreamSet}
		}
		set.streams = append(set.streams, id)
	}
	if set != nil {
		// The stream-set object takes the first prepared id, as AutoMQ
		// prepares it before its stream objects.
		up.objects = append(up.objects, set)
	}
	up.objects = append(up.objects, alone...)
	for _, o := range up.objects {
		var buf bytes.Buffer
		w, err := object.NewWriter(&buf, b.cfg.Automq.BlockSize)
		if err != nil {
			return nil, err
		}
		for _, id := range o.streams {
			if err := w.Write(id, byStream[id]); err != nil {
				return nil, fmt.Errorf("broker: write the object of stream %d: %w", id, err)
			}
		}
		l, err := w.Close()
		if err != nil {
			return nil, fmt.Errorf("broker: write object: %w", err)
		}
		o.data, o.ranges = buf.Bytes(), l.Ranges
	}
	return up, nil
}

func (u *automqUpload) objectIDs() []int64 {
	out := make([]int64, len(u.objects))
	for i, o := range u.objects {
		out[i] = o.id
	}
	return out
}

func (u *automqUpload) streamIDs() []int64 {
	var out []int64
	for _, o := range u.objects {
		out = append(out, o.streams...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// commitUpload prepares ids for up's objects (unless it holds some),
// uploads each under AutoMQ's key, and commits them with
// CommitStreamSetObject (not in failover mode). A commit the controller
// answers as redundant is done; OBJECT_NOT_EXIST (the ids expired) makes the
// next attempt prepare again.
func (b *AutomqBroker) commitUpload(ctx context.Context, up *automqUpload) error {
	if !up.prepared {
		first, err := b.ctl.PrepareS3Object(ctx, b.node, int32(len(up.objects)), failover.DefaultPrepareTTL)
		if err != nil {
			return fmt.Errorf("broker: prepare %d object ids: %w", len(up.objects), err)
		}
		for i, o := range up.objects {
			o.id = first + int64(i)
			if o.key, err = object.Key(b.cfg.Automq.ClusterID, o.id); err != nil {
				return fmt.Errorf("broker: the controller prepared id %d: %w", o.id, err)
			}
			o.uploaded = false
		}
		up.prepared = true
	}
	for _, o := range up.objects {
		if o.uploaded {
			continue
		}
		if _, err := b.s3.Upload(ctx, o.key, bytes.NewReader(o.data), int64(len(o.data)), nil); err != nil {
			return fmt.Errorf("broker: upload object %d (%s, %d bytes): %w", o.id, o.key, len(o.data), err)
		}
		o.uploaded = true
	}
	req := controller.CommitRequest{NodeID: b.node, NodeEpoch: b.epoch, ObjectID: -1, OrderID: -1}
	for _, o := range up.objects {
		if o.kind == failover.KindStreamSet {
			req.ObjectID, req.OrderID, req.ObjectSize, req.Attributes = o.id, o.id, int64(len(o.data)), b.attrs
			for _, r := range o.ranges {
				// AutoMQ's WAL upload sends stream epoch -1 in the ranges.
				req.StreamRanges = append(req.StreamRanges, protocol.ObjectStreamRange{StreamID: r.StreamID, StreamEpoch: -1,
					StartOffset: r.StartOffset, EndOffset: r.EndOffset})
			}
			continue
		}
		r := o.ranges[0]
		req.StreamObjects = append(req.StreamObjects, protocol.StreamObject{ObjectID: o.id, ObjectSize: int64(len(o.data)),
			StreamID: r.StreamID, StartOffset: r.StartOffset, EndOffset: r.EndOffset, Attributes: b.attrs})
	}
	_, err := b.ctl.CommitStreamSetObject(ctx, req)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, protocol.ErrObjectNotExist):
		up.prepared = false
	case errors.Is(err, protocol.ErrNodeFenced), errors.Is(err, protocol.ErrNodeEpochExpired):
		b.mu.Lock()
		first := !b.fenced
		b.fenced = true
		b.mu.Unlock()
		if first {
			// AutoMQ 1.4 has no lease: nothing here stops the appends, which
			// go on into the WAL until it is full. The agent's watchdog is
			// what kills a broker the cluster failed over.
			b.log.Error("the controller refuses this node's commits: it was failed over; appends are still acknowledged "+
				"into the WAL, as AutoMQ 1.4 does (the agent's watchdog is what stops this broker)", "err", err)
		}
	}
	return fmt.Errorf("broker: commit objects %v: %w", up.objectIDs(), err)
}

// uploadOnce uploads and commits the WAL records not yet committed, then
// trims the WAL to the last of them (inclusive). A failed attempt keeps the
// same objects for the next one.
func (b *AutomqBroker) uploadOnce(ctx context.Context) error {
	b.mu.Lock()
	up, w := b.upload, b.w
	b.mu.Unlock()
	if w == nil {
		return nil
	}
	if up == nil {
		// No append is between its WAL write and the pending list while
		// walMu is held: the snapshot holds every durable record.
		b.walMu.Lock()
		b.mu.Lock()
		snap := append([]pendingRecord(nil), b.pending...)
		b.mu.Unlock()
		b.walMu.Unlock()
		if len(snap) == 0 {
			return nil
		}
		sort.SliceStable(snap, func(i, j int) bool { return snap[i].walOffset < snap[j].walOffset })
		var err error
		if up, err = b.newUpload(snap); err != nil {
			b.setErr(err)
			b.log.Error("cannot lay the WAL's records out into objects", "err", err)
			return err
		}
		b.mu.Lock()
		b.upload = up
		b.mu.Unlock()
	}
	if err := b.commitUpload(ctx, up); err != nil {
		b.setErr(err)
		if ctx.Err() == nil {
			b.log.Warn("upload failed; retrying", "records", len(up.records), "err", err)
		}
		return err
	}
	b.walMu.RLock()
	b.mu.Lock()
	keep := b.pending[:0]
	for _, r := range b.pending {
		if r.walOffset > up.last {
			keep = append(keep, r)
		} else {
			b.pendingBytes -= int64(len(r.batch.Payload))
		}
	}
	clear(b.pending[len(keep):])
	b.pending = keep
	for _, o := range up.objects {
		for _, r := range o.ranges {
			if s := b.streams[uint64(r.StreamID)]; s != nil && uint64(r.EndOffset) > s.committed.Load() {
				s.committed.Store(uint64(r.EndOffset))
			}
		}
	}
	b.upload = nil
	b.uploads++
	b.lastErr = ""
	b.mu.Unlock()
	b.walMu.RUnlock()
	if err := w.Trim(up.last); err != nil {
		b.log.Warn("wal trim failed", "offset", up.last, "err", err)
	}
	b.log.Debug("uploaded", "objects", up.objectIDs(), "records", len(up.records))
	return nil
}
