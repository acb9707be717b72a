package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/fieldlimit"
	"walden/objformat"
	"walden/objstore"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// indexCache keeps the indexes of committed objects (they never change).
type indexCache struct {
	mu sync.Mutex
	m  map[string]*objformat.Index
}

func newIndexCache() *indexCache { return &indexCache{m: map[string]*objformat.Index{}} }

func (c *indexCache) get(key string) *objformat.Index {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[key]
}

func (c *indexCache) put(key string, ix *objformat.Index) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= 4096 {
		clear(c.m)
	}
	c.m[key] = ix
}

// Read serves the stream's committed records from S3 and, when this broker
// owns the stream, its records not committed yet. A stream owned by another
// broker is served up to its committed end; the answer names the owner,
// which serves the rest.
func (s *apiServer) Read(ctx context.Context, req *waldenv1.ReadRequest) (*waldenv1.ReadResponse, error) {
	b := s.b
	max, err := fieldlimit.Count("max_records", uint64(req.GetMaxRecords()), fieldlimit.MaxRepeated)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if max <= 0 {
		max = DefaultMaxReadRecords
	}
	from := req.GetFromOffset()
	resp := &waldenv1.ReadResponse{}

	// This broker's view first: the committed end and the tail above it,
	// read together so that every offset is in one or the other.
	var tail []pendingRecord
	owned := false
	var committed uint64
	b.mu.Lock()
	inc := b.inc
	b.mu.Unlock()
	if inc != nil {
		b.walMu.RLock()
		if st := inc.streams[req.GetStreamId()]; st != nil && !inc.isFenced(b) {
			owned = true
			b.mu.Lock()
			committed = st.committed.Load()
			for _, r := range inc.pending {
				if r.batch.StreamID == st.id && r.batch.EndOffset() > from {
					tail = append(tail, r)
				}
			}
			b.mu.Unlock()
		}
		b.walMu.RUnlock()
	}

	d, err := b.coords.DescribeStream(ctx, req.GetStreamId(), math.MaxUint64, 1)
	if err != nil {
		if rpcerr.Reason(err) == refusal.StreamNotFound {
			return nil, rpcerr.New(refusal.StreamNotFound, fmt.Sprintf("stream_id: stream %d not found", req.GetStreamId()), nil)
		}
		return nil, status.Errorf(codes.Unavailable, "describe stream %d: %v", req.GetStreamId(), err)
	}
	stream := d.GetStream()
	if !owned && stream.GetState() == "opened" && stream.GetOwnerBrokerId() == b.cfg.BrokerID {
		// The catalog names this broker the stream's owner, but no epoch of
		// it serves the stream now: it was fenced (a failover, a restore, a
		// forced new cluster) and registers or recovers. Its WAL may hold
		// acknowledged records beyond the catalog's end: answering as the
		// owner from the catalog alone would hide them.
		return nil, rpcerr.New(refusal.NotReady, fmt.Sprintf("stream %d: this broker owns it in the catalog but is registering "+
			"or recovering its WAL; retry", req.GetStreamId()), nil)
	}
	resp.CommittedEndOffset = stream.GetEndOffset()
	if !owned {
		committed = stream.GetEndOffset()
	}
	if stream.GetState() == "opened" {
		resp.OwnerBrokerId = stream.GetOwnerBrokerId()
		if resp.OwnerBrokerId == b.cfg.BrokerID {
			resp.OwnerAddr = b.addr
		} else if id, addr := s.owner(ctx, req.GetStreamId()); id == resp.OwnerBrokerId {
			resp.OwnerAddr = addr
		}
	}
	from = max64(from, stream.GetStartOffset())
	recs, next, err := b.readCommitted(ctx, req.GetStreamId(), from, committed, max)
	var unbacked *UnbackedRangeError
	switch {
	case errors.As(err, &unbacked):
		b.log.Error("a committed range is in no object of the object store: its records cannot be read", "stream_id", unbacked.StreamID,
			"start_offset", unbacked.Start, "end_offset", unbacked.End, "object_id", unbacked.ObjectID, "key", unbacked.Key)
		return nil, rpcerr.New(refusal.ObjectMissing, unbacked.Error(), unbacked.Metadata())
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "read stream %d: %v", req.GetStreamId(), err)
	}
	resp.Records = recs
	end := committed
	if owned {
		for _, r := range tail {
			end = max64(end, r.batch.EndOffset())
		}
		size := 0
		for _, r := range resp.Records {
			size += len(r.GetPayload())
		}
		full := func() bool { return len(resp.Records) >= max || size >= MaxReadBytes }
		if next >= committed {
			for _, r := range tail {
				if full() || r.batch.BaseOffset > next {
					break
				}
				_, payloads, err := producer.Decode(r.batch.Payload, r.batch.Count)
				if err != nil {
					return nil, status.Errorf(codes.Internal, "stream %d offset %d: %v", r.batch.StreamID, r.batch.BaseOffset, err)
				}
				for i, p := range payloads {
					off := r.batch.BaseOffset + uint64(i)
					if off < next || full() {
						continue
					}
					resp.Records = append(resp.Records, &waldenv1.ReadRecord{Offset: off, Payload: append([]byte(nil), p...)})
					size += len(p)
					next = off + 1
				}
			}
		}
	}
	resp.NextOffset = next
	resp.EndOffset = end
	return resp, nil
}

func max64(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// readCommitted reads up to max records of [from, end) from the committed
// objects. It returns the records and the offset after the last one.
func (b *Broker) readCommitted(ctx context.Context, streamID, from, end uint64, max int) ([]*waldenv1.ReadRecord, uint64, error) {
	var out []*waldenv1.ReadRecord
	size := 0
	full := func() bool { return len(out) >= max || size >= MaxReadBytes }
	next := from
	for next < end && !full() {
		d, err := b.coords.DescribeStream(ctx, streamID, next, 16)
		if err != nil {
			return nil, 0, err
		}
		progressed := false
		for _, obj := range d.GetObjects() {
			var r *waldenv1.ObjectRange
			for _, rr := range obj.GetRanges() {
				if rr.GetStreamId() == streamID {
					r = rr
				}
			}
			if r == nil || r.GetEndOffset() <= next {
				continue
			}
			if r.GetStartOffset() > next {
				return nil, 0, &UnbackedRangeError{StreamID: streamID, Start: next, End: r.GetStartOffset()}
			}
			missing := &UnbackedRangeError{StreamID: streamID, Start: next, End: r.GetEndOffset(), ObjectID: obj.GetObjectId(), Key: obj.GetKey()}
			ix, err := b.objectIndex(ctx, obj)
			if errors.Is(err, objstore.ErrNotFound) {
				return nil, 0, missing
			}
			if err != nil {
				return nil, 0, err
			}
			e, ok := ix.EntryOf(r)
			if !ok {
				return nil, 0, fmt.Errorf("broker: object %s: index disagrees with the catalog's range of stream %d: %w", obj.GetKey(), streamID, objformat.ErrCorrupt)
			}
			data, err := b.s3.GetRange(ctx, obj.GetKey(), int64(e.Position), int64(e.Length))
			if errors.Is(err, objstore.ErrNotFound) {
				return nil, 0, missing
			}
			if err != nil {
				return nil, 0, err
			}
			batches, err := objformat.ParseSection(data, e)
			if err != nil {
				return nil, 0, fmt.Errorf("broker: object %s: %w", obj.GetKey(), err)
			}
			for _, bt := range batches {
				if bt.EndOffset() <= next {
					continue
				}
				_, payloads, err := producer.Decode(bt.Payload, bt.Count)
				if err != nil {
					return nil, 0, fmt.Errorf("broker: object %s offset %d: %w", obj.GetKey(), bt.BaseOffset, err)
				}
				for i, p := range payloads {
					off := bt.BaseOffset + uint64(i)
					if off < next || off >= end || full() {
						continue
					}
					out = append(out, &waldenv1.ReadRecord{Offset: off, Payload: append([]byte(nil), p...)})
					size += len(p)
					next = off + 1
				}
			}
			progressed = true
			if full() || next >= end {
				break
			}
		}
		if !progressed {
			if next < end && len(out) == 0 {
				// The stream's end is beyond every committed object.
				return nil, 0, &UnbackedRangeError{StreamID: streamID, Start: next, End: end}
			}
			break
		}
	}
	return out, next, nil
}

// objectIndex returns an object's index, from the cache or read with
// ranged GETs.
func (b *Broker) objectIndex(ctx context.Context, obj *waldenv1.Object) (*objformat.Index, error) {
	if ix := b.reads.get(obj.GetKey()); ix != nil {
		return ix, nil
	}
	size := int64(obj.GetSize())
	if size == 0 {
		// A commit that did not record the size: ask S3 (the index and
		// its checksums still guard what is read).
		info, err := b.s3.Head(ctx, obj.GetKey())
		if err != nil {
			return nil, fmt.Errorf("broker: object %s: size: %w", obj.GetKey(), err)
		}
		size = info.Size
		b.log.Warn("committed object without a size; took it from S3", "object_id", obj.GetObjectId(), "size", size)
	}
	ix, err := objformat.ReadIndex(b.s3.ReaderAt(ctx, obj.GetKey(), size), size)
	if err != nil {
		return nil, fmt.Errorf("broker: object %s: read index: %w", obj.GetKey(), err)
	}
	b.reads.put(obj.GetKey(), ix)
	return ix, nil
}
