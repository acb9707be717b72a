package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/automq/metaview"
	"walden/automq/object"
	"walden/fieldlimit"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/wal"
)

// automqAPI serves walden.v1.BrokerAPI for a broker in mode automq.
type automqAPI struct {
	waldenv1.UnimplementedBrokerAPIServer
	b *AutomqBroker
}

// Append writes the records as one WAL batch and acknowledges their offsets
// once the batch is durable, without asking anyone: an AutoMQ broker has no
// lease.
func (s *automqAPI) Append(ctx context.Context, req *waldenv1.AppendRequest) (*waldenv1.AppendResponse, error) {
	b := s.b
	if len(req.GetRecords()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "records: at least one record is required")
	}
	if len(req.GetRecords()) > math.MaxInt32 {
		return nil, status.Error(codes.InvalidArgument, "records: too many")
	}
	b.mu.Lock()
	ready, draining, w := b.ready, b.draining, b.w
	b.mu.Unlock()
	switch {
	case draining:
		return nil, rpcerr.New(refusal.ShuttingDown, "the broker is stopping", nil)
	case !ready || w == nil:
		return nil, rpcerr.New(refusal.NotReady, "the broker is registering with the controller and recovering its WAL", nil)
	}
	if h := b.opts.Hooks.AppendAdmitted; h != nil {
		h()
	}
	b.walMu.RLock()
	st := b.streams[req.GetStreamId()]
	if st == nil {
		b.walMu.RUnlock()
		return nil, rpcerr.New(refusal.NotOwner, fmt.Sprintf("broker %s (AutoMQ node %d) does not lead stream %d", b.cfg.BrokerID, b.node,
			req.GetStreamId()), nil)
	}
	st.mu.Lock()
	count := uint32(len(req.GetRecords()))
	pid, seq := req.GetProducerId(), req.GetSequence()
	if pid != 0 {
		v, last := st.producers.Check(pid, seq, count)
		if v != producer.Append {
			st.mu.Unlock()
			b.walMu.RUnlock()
			return b.answerProducer(st, v, last, pid, seq, count)
		}
	}
	batch := wal.Batch{
		StreamID:   st.id,
		Epoch:      st.epoch,
		BaseOffset: st.next,
		Count:      count,
		Payload:    producer.Encode(producer.Header{ID: pid, Sequence: seq}, req.GetRecords()),
	}
	off, err := w.Append(context.Background(), batch)
	if err != nil {
		st.mu.Unlock()
		b.walMu.RUnlock()
		switch {
		case errors.Is(err, wal.ErrFull):
			b.kickUpload()
			return nil, rpcerr.New(refusal.WALFull, "the WAL is full until the next upload", nil)
		case errors.Is(err, wal.ErrTooLarge):
			return nil, status.Errorf(codes.InvalidArgument, "records: batch too large for the WAL: %v", err)
		}
		b.log.Error("wal append failed; the broker stops acknowledging", "stream_id", batch.StreamID, "err", err)
		b.mu.Lock()
		b.ready = false
		b.lastErr = "wal append failed"
		b.mu.Unlock()
		return nil, status.Errorf(codes.Unavailable, "wal append failed: %v", err)
	}
	st.next = batch.EndOffset()
	if pid != 0 {
		st.producers.Record(pid, seq, count, batch.BaseOffset)
	}
	b.mu.Lock()
	b.pending = append(b.pending, pendingRecord{walOffset: off, batch: batch})
	b.pendingBytes += int64(len(batch.Payload))
	full := b.pendingBytes >= b.cfg.UploadBytes || w.NextOffset()-w.Header().TrimOffset >= b.cfg.UploadBytes
	b.mu.Unlock()
	st.mu.Unlock()
	b.walMu.RUnlock()
	if full {
		b.kickUpload()
	}
	if h := b.opts.Hooks.AppendDurable; h != nil {
		h()
	}
	return &waldenv1.AppendResponse{BaseOffset: batch.BaseOffset, Count: batch.Count, StreamEpoch: batch.Epoch, BrokerEpoch: uint64(b.epoch)}, nil
}

// answerProducer answers an idempotent append that is not written: a retry
// of the producer's last batch with its stored offsets, an out-of-order or
// unknown producer with a refusal.
func (b *AutomqBroker) answerProducer(st *ownedStream, v producer.Verdict, last *waldenv1.ProducerState, pid, seq uint64, count uint32) (*waldenv1.AppendResponse, error) {
	switch v {
	case producer.Duplicate:
		return &waldenv1.AppendResponse{BaseOffset: last.GetOffset(), Count: last.GetCount(), StreamEpoch: st.epoch,
			BrokerEpoch: uint64(b.epoch), Duplicate: true}, nil
	case producer.Unknown:
		return nil, rpcerr.New(refusal.UnknownProducer, fmt.Sprintf(
			"stream %d does not know producer %d, whose append starts at sequence %d (a producer's first batch starts at 0); "+
				"start again with a new producer id", st.id, pid, seq), nil)
	}
	next := last.GetSequence() + uint64(last.GetCount())
	return nil, rpcerr.New(refusal.OutOfOrderSequence, fmt.Sprintf(
		"producer %d on stream %d: sequence %d (%d records) is neither the next one (%d) nor a retry of the last batch (sequence %d, %d records)",
		pid, st.id, seq, count, next, last.GetSequence(), last.GetCount()),
		map[string]string{MetaExpectedSequence: fmt.Sprint(next)})
}

// Read serves the stream's committed records from the AutoMQ objects the
// controller lists and, when this broker leads the stream, its records not
// committed yet.
func (s *automqAPI) Read(ctx context.Context, req *waldenv1.ReadRequest) (*waldenv1.ReadResponse, error) {
	b := s.b
	maxRecords, err := fieldlimit.Count("max_records", uint64(req.GetMaxRecords()), fieldlimit.MaxRepeated)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if maxRecords <= 0 {
		maxRecords = DefaultMaxReadRecords
	}
	if req.GetStreamId() > math.MaxInt64 || req.GetFromOffset() > math.MaxInt64 {
		return nil, status.Error(codes.InvalidArgument, "stream_id, from_offset: AutoMQ ids and offsets are below 2^63")
	}
	from := req.GetFromOffset()
	// This broker's view first: the committed end and the tail above it,
	// read together so that every offset is in one or the other.
	var tail []pendingRecord
	owned := false
	var committed uint64
	b.walMu.RLock()
	if st := b.streams[req.GetStreamId()]; st != nil {
		owned = true
		b.mu.Lock()
		committed = st.committed.Load()
		for _, r := range b.pending {
			if r.batch.StreamID == st.id && r.batch.EndOffset() > from {
				tail = append(tail, r)
			}
		}
		b.mu.Unlock()
	}
	b.walMu.RUnlock()

	view, ok, err := b.meta.Stream(ctx, int64(req.GetStreamId()))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "stream %d: %v", req.GetStreamId(), err)
	}
	if !ok {
		return nil, rpcerr.New(refusal.StreamNotFound, fmt.Sprintf("stream_id: stream %d not found", req.GetStreamId()), nil)
	}
	resp := &waldenv1.ReadResponse{CommittedEndOffset: uint64(max(view.EndOffset, 0))}
	if !owned {
		committed = resp.CommittedEndOffset
	} else {
		resp.OwnerBrokerId, resp.OwnerAddr = b.cfg.BrokerID, b.addr
	}
	from = max(from, uint64(max(view.StartOffset, 0)))
	size := 0
	full := func() bool { return len(resp.Records) >= maxRecords || size >= MaxReadBytes }
	next := from
	if from < committed {
		objs, err := b.meta.Committed(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "stream %d: %v", req.GetStreamId(), err)
		}
		segs, err := metaview.Segments(objs, int64(req.GetStreamId()), int64(from), int64(committed))
		if err != nil {
			return nil, status.Errorf(codes.DataLoss, "stream %d: %v", req.GetStreamId(), err)
		}
		for _, seg := range segs {
			if full() {
				break
			}
			var bad error
			err := b.objs.ReadSegment(ctx, seg, int64(next), func(r object.Record) bool {
				_, payloads, err := producer.Decode(r.Payload, uint32(r.Count))
				if err != nil {
					bad = fmt.Errorf("offset %d: %w", r.BaseOffset, err)
					return false
				}
				for i, p := range payloads {
					off := uint64(r.BaseOffset) + uint64(i)
					if off < next || off >= committed || full() {
						continue
					}
					resp.Records = append(resp.Records, &waldenv1.ReadRecord{Offset: off, Payload: append([]byte(nil), p...)})
					size += len(p)
					next = off + 1
				}
				return !full()
			})
			if err == nil {
				err = bad
			}
			if err != nil {
				return nil, status.Errorf(codes.Unavailable, "read stream %d: %v", req.GetStreamId(), err)
			}
		}
	}
	end := committed
	if owned {
		for _, r := range tail {
			end = max(end, r.batch.EndOffset())
		}
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

// BrokerStatus reports the node epoch, the streams the broker leads and its
// uploads. lease_valid is always false (an AutoMQ broker holds no lease);
// fenced says the controller refused its commits (it was failed over).
func (s *automqAPI) BrokerStatus(ctx context.Context, _ *waldenv1.BrokerStatusRequest) (*waldenv1.BrokerStatusResponse, error) {
	b := s.b
	resp := &waldenv1.BrokerStatusResponse{BrokerId: b.cfg.BrokerID, BrokerEpoch: uint64(max(b.epoch, 0))}
	b.mu.Lock()
	resp.Serving = b.ready && !b.draining
	resp.Fenced = b.fenced
	resp.Uploads = b.uploads
	resp.WalPendingBytes = uint64(b.pendingBytes)
	b.mu.Unlock()
	b.walMu.RLock()
	for _, id := range sortedKeys(b.streams) {
		st := b.streams[id]
		st.mu.Lock()
		resp.Streams = append(resp.Streams, &waldenv1.BrokerStreamStatus{StreamId: id, StreamEpoch: st.epoch, NextOffset: st.next,
			CommittedEndOffset: st.committed.Load()})
		st.mu.Unlock()
	}
	b.walMu.RUnlock()
	return resp, nil
}

func sortedKeys(m map[uint64]*ownedStream) []uint64 {
	return slices.Sorted(maps.Keys(m))
}
