package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/agent"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/wal"
)

// Read answer limits.
const (
	// DefaultMaxReadRecords is the Read answer size when max_records is 0.
	DefaultMaxReadRecords = 1000
	// MaxReadBytes stops a Read answer once its payloads reach it (an
	// answer holds at least one record), below gRPC's 4 MiB default.
	MaxReadBytes = 2 << 20
)

// apiServer serves walden.v1.BrokerAPI.
type apiServer struct {
	waldenv1.UnimplementedBrokerAPIServer
	b *Broker

	hintMu sync.Mutex
	hints  map[uint64]ownerHint
}

type ownerHint struct {
	id, addr string
	at       time.Time
}

// checkLease returns nil when the agent confirms the lease of the
// incarnation's epoch now, else the API's refusal. A lease of another epoch
// (the agent registered again after a failover) is no lease for inc.
func (b *Broker) checkLease(inc *incarnation) error {
	if err := b.agent.Check(); err != nil {
		switch {
		case errors.Is(err, agent.ErrFenced):
			return rpcerr.New(refusal.NodeFenced, err.Error(), nil)
		case errors.Is(err, agent.ErrStopped):
			return rpcerr.New(refusal.ShuttingDown, err.Error(), nil)
		default:
			return rpcerr.New(refusal.LeaseInvalid, err.Error(), nil)
		}
	}
	if l := b.agent.Lease(); l.Epoch != inc.epoch || !l.Valid {
		if l.Epoch != inc.epoch {
			return rpcerr.New(refusal.NodeFenced,
				fmt.Sprintf("epoch %d was failed over; the broker registered again with epoch %d and is recovering", inc.epoch, l.Epoch), nil)
		}
		return rpcerr.New(refusal.LeaseInvalid, fmt.Sprintf("lease of epoch %d not confirmed", inc.epoch), nil)
	}
	return nil
}

// Append writes the records as one WAL batch and acknowledges their offsets
// once the batch is durable and the lease is still valid.
func (s *apiServer) Append(ctx context.Context, req *waldenv1.AppendRequest) (*waldenv1.AppendResponse, error) {
	b := s.b
	if len(req.GetRecords()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "records: at least one record is required")
	}
	if len(req.GetRecords()) > math.MaxUint32 {
		return nil, status.Error(codes.InvalidArgument, "records: too many")
	}
	b.mu.Lock()
	inc, draining := b.inc, b.draining
	b.mu.Unlock()
	switch {
	case draining:
		return nil, rpcerr.New(refusal.ShuttingDown, "the broker is stopping", nil)
	case inc == nil:
		if l := b.agent.Lease(); l.Fenced {
			return nil, rpcerr.New(refusal.NodeFenced, "the broker was failed over; it serves again after it has registered and recovered", nil)
		}
		return nil, rpcerr.New(refusal.NotReady, "the broker is registering or recovering", nil)
	}
	if err := b.checkLease(inc); err != nil {
		return nil, err
	}
	if h := b.opts.Hooks.AppendAdmitted; h != nil {
		h()
	}

	b.walMu.RLock()
	st := inc.streams[req.GetStreamId()]
	if st == nil {
		b.walMu.RUnlock()
		return nil, s.notOwner(ctx, req.GetStreamId())
	}
	st.mu.Lock()
	if st.lost {
		st.mu.Unlock()
		b.walMu.RUnlock()
		return nil, rpcerr.New(refusal.NodeFenced, "the broker was failed over", nil)
	}
	count := uint32(len(req.GetRecords()))
	pid, seq := req.GetProducerId(), req.GetSequence()
	if pid != 0 {
		v, last := st.producers.Check(pid, seq, count)
		if v != producer.Append {
			st.mu.Unlock()
			b.walMu.RUnlock()
			return b.answerProducer(inc, st, v, last, pid, seq, count)
		}
	}
	batch := wal.Batch{
		StreamID:   st.id,
		Epoch:      st.epoch,
		BaseOffset: st.next,
		Count:      count,
		Payload:    producer.Encode(producer.Header{ID: pid, Sequence: seq}, req.GetRecords()),
	}
	// The WAL write is not tied to the request: once submitted it either
	// becomes durable under these offsets or the writer fails for good.
	off, err := inc.w.Append(context.Background(), batch)
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
		b.failIncarnation(inc)
		return nil, status.Errorf(codes.Unavailable, "wal append failed: %v", err)
	}
	st.next = batch.EndOffset()
	if pid != 0 {
		// Durable: a retry of this batch is answered with these offsets,
		// whether or not this attempt is acknowledged below.
		st.producers.Record(pid, seq, count, batch.BaseOffset)
	}
	b.mu.Lock()
	inc.pending = append(inc.pending, pendingRecord{walOffset: off, batch: batch})
	inc.pendingBytes += int64(len(batch.Payload))
	// Small appends each take a 4 KiB block of the WAL: count the ring's
	// use, not only the payloads.
	full := inc.pendingBytes >= b.cfg.UploadBytes || inc.w.NextOffset()-inc.w.Header().TrimOffset >= b.cfg.UploadBytes
	fenced := inc.fenced
	// A graceful stop that began after the admission may already have
	// uploaded for the last time and be closing the streams: the record
	// would stay in the WAL only, behind a closed stream.
	draining = b.draining
	b.mu.Unlock()
	st.mu.Unlock()
	b.walMu.RUnlock()
	if full {
		b.kickUpload()
	}
	if h := b.opts.Hooks.AppendDurable; h != nil {
		h()
	}
	// The records are durable; acknowledge only if the lease still holds.
	if fenced {
		return nil, rpcerr.New(refusal.NodeFenced, "the broker was failed over", nil)
	}
	if draining {
		return nil, rpcerr.New(refusal.ShuttingDown, "the broker is stopping", nil)
	}
	if err := b.checkLease(inc); err != nil {
		return nil, err
	}
	return &waldenv1.AppendResponse{BaseOffset: batch.BaseOffset, Count: batch.Count, StreamEpoch: batch.Epoch, BrokerEpoch: inc.epoch}, nil
}

// answerProducer answers an idempotent append that is not written: a retry
// of the producer's last batch is acknowledged with its stored offsets
// under the same conditions as a fresh append (the incarnation serves and
// the lease holds: the batch is in this broker's WAL or committed), and an
// out-of-order or unknown producer is refused.
func (b *Broker) answerProducer(inc *incarnation, st *ownedStream, v producer.Verdict, last *waldenv1.ProducerState, pid, seq uint64, count uint32) (*waldenv1.AppendResponse, error) {
	switch v {
	case producer.Duplicate:
		b.mu.Lock()
		fenced, draining := inc.fenced, b.draining
		b.mu.Unlock()
		switch {
		case fenced:
			return nil, rpcerr.New(refusal.NodeFenced, "the broker was failed over", nil)
		case draining:
			return nil, rpcerr.New(refusal.ShuttingDown, "the broker is stopping", nil)
		}
		if err := b.checkLease(inc); err != nil {
			return nil, err
		}
		return &waldenv1.AppendResponse{BaseOffset: last.GetOffset(), Count: last.GetCount(), StreamEpoch: st.epoch,
			BrokerEpoch: inc.epoch, Duplicate: true}, nil
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

func (b *Broker) kickUpload() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// failIncarnation stops acknowledging under inc after a WAL failure.
func (b *Broker) failIncarnation(inc *incarnation) {
	b.mu.Lock()
	if b.inc == inc {
		b.inc = nil
	}
	b.lastErr = "wal append failed"
	b.mu.Unlock()
}

// notOwner answers NOT_OWNER with the owner's address when the catalog
// knows it (cached for a short while).
func (s *apiServer) notOwner(ctx context.Context, streamID uint64) error {
	id, addr := s.owner(ctx, streamID)
	md := map[string]string{}
	if id != "" {
		md[MetaOwnerBrokerID] = id
	}
	if addr != "" {
		md[MetaOwnerAddr] = addr
	}
	msg := fmt.Sprintf("broker %s does not own stream %d", s.b.cfg.BrokerID, streamID)
	if id != "" {
		msg += "; owner " + id
	}
	return rpcerr.New(refusal.NotOwner, msg, md)
}

func (s *apiServer) owner(ctx context.Context, streamID uint64) (id, addr string) {
	s.hintMu.Lock()
	h, ok := s.hints[streamID]
	s.hintMu.Unlock()
	if ok && time.Since(h.at) < 300*time.Millisecond {
		return h.id, h.addr
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d, err := s.b.coords.DescribeStream(ctx, streamID, math.MaxUint64, 1)
	if err != nil || d.GetStream().GetState() != "opened" {
		return "", ""
	}
	id = d.GetStream().GetOwnerBrokerId()
	if id == s.b.cfg.BrokerID {
		return id, "" // this broker, not serving it (yet)
	}
	addr, _ = s.b.coords.BrokerAddr(ctx, id)
	s.hintMu.Lock()
	if s.hints == nil {
		s.hints = map[uint64]ownerHint{}
	}
	s.hints[streamID] = ownerHint{id: id, addr: addr, at: time.Now()}
	s.hintMu.Unlock()
	return id, addr
}

// BrokerStatus reports the broker's epoch, lease and streams. The answer
// describes one epoch, the agent's: serving says appends of that epoch are
// accepted, and the streams are those opened under it. While the serving
// loop still holds an older incarnation (the agent registered again after a
// failover and the old epoch is ending), the answer says not serving and
// lists no streams: never the new epoch with the old incarnation's streams.
func (s *apiServer) BrokerStatus(ctx context.Context, _ *waldenv1.BrokerStatusRequest) (*waldenv1.BrokerStatusResponse, error) {
	b := s.b
	l := b.agent.Lease()
	resp := &waldenv1.BrokerStatusResponse{BrokerId: b.cfg.BrokerID, BrokerEpoch: l.Epoch, LeaseValid: l.Valid, Fenced: l.Fenced}
	b.mu.Lock()
	inc := b.inc
	resp.Serving = b.servesLocked(inc, l)
	resp.Uploads = b.uploads
	if inc != nil && inc.epoch != l.Epoch {
		inc = nil // an older epoch's incarnation, ending
	}
	if inc != nil {
		resp.WalPendingBytes = uint64(inc.pendingBytes)
	}
	b.mu.Unlock()
	if inc == nil {
		return resp, nil
	}
	b.walMu.RLock()
	for _, id := range inc.streamIDs() {
		st := inc.streams[id]
		st.mu.Lock()
		resp.Streams = append(resp.Streams, &waldenv1.BrokerStreamStatus{StreamId: id, StreamEpoch: st.epoch, NextOffset: st.next, CommittedEndOffset: st.committed.Load()})
		st.mu.Unlock()
	}
	b.walMu.RUnlock()
	return resp, nil
}
