package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/detect"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/rpcerr"
)

// renewalBatchWindow is how long the batcher gathers streamed renewals
// after the first of a batch arrived, before it grants them together. A
// renewal waits at most this long more than alone; the grant it gets is
// not shorter for it at the agent (the agent counts from its send), only
// longer on this member's side (the batch's reading is taken after the
// window).
const renewalBatchWindow = 0 * time.Millisecond

// renewalConfirmTimeout bounds the read index round that confirms the
// refusals of a batch that may come from lagging behind the log.
const renewalConfirmTimeout = 5 * time.Second

// errBatcherStopped answers the renewals still queued when the member
// stops.
var errBatcherStopped = status.Error(codes.Unavailable, "lease not granted: the member is stopping")

// renewalBatcher grants the renewals of every agent's stream in batches:
// the renewals that arrive within renewalBatchWindow of the first share
// one boot-clock reading, taken after the last of them arrived
// (lease.Grantor.GrantAt, docs/safety.md), and the refusals among them
// that may come from lagging behind the log share one read index round.
// The rule of each grant is RenewLease's (detect.Grant).
type renewalBatcher struct {
	d      *serviceDeps
	clock  lease.Clock
	window time.Duration

	mu     sync.Mutex
	queue  []*streamRenewal
	signal chan struct{} // capacity 1: the queue is not empty
	// stopped is closed when run returns: the handlers stop waiting.
	stopped chan struct{}
	// batches and granted count the batches and the renewals they held
	// (tests; the walden_lease_renewal_batch_size histogram says the same).
	batches, renewals atomic.Int64
}

func newRenewalBatcher(d *serviceDeps, clock lease.Clock, window time.Duration) *renewalBatcher {
	return &renewalBatcher{d: d, clock: clock, window: window, signal: make(chan struct{}, 1), stopped: make(chan struct{})}
}

// streamRenewal is one renewal of a stream waiting for its answer.
type streamRenewal struct {
	// ctx is the stream's: a renewal of a stream that ended is dropped.
	ctx    context.Context
	broker string
	epoch  uint64
	// answer receives exactly one result, unless ctx ended first.
	answer chan<- renewalResult
}

type renewalResult struct {
	grant *waldenv1.RenewLeaseResponse
	err   error
}

// submit queues r for the next batch.
func (b *renewalBatcher) submit(r *streamRenewal) {
	b.mu.Lock()
	b.queue = append(b.queue, r)
	b.mu.Unlock()
	select {
	case b.signal <- struct{}{}:
	default:
	}
}

// run grants the queued renewals, batch after batch, until ctx ends; then
// it answers what is still queued with Unavailable.
func (b *renewalBatcher) run(ctx context.Context) {
	defer close(b.stopped)
	var batch []*streamRenewal
	for {
		select {
		case <-b.signal:
		case <-ctx.Done():
			b.mu.Lock()
			left := b.queue
			b.queue = nil
			b.mu.Unlock()
			for _, r := range left {
				r.answer <- renewalResult{err: errBatcherStopped}
			}
			return
		}
		if b.window > 0 {
			time.Sleep(b.window)
		}
		b.mu.Lock()
		batch, b.queue = b.queue, batch[:0]
		b.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		b.grant(ctx, batch)
		clear(batch)
	}
}

// grant answers one batch. Its boot-clock reading is taken here, after
// every renewal of the batch was queued, so after each was received.
func (b *renewalBatcher) grant(ctx context.Context, batch []*streamRenewal) {
	d := b.d
	now := b.clock.Now()
	d.decisions.RenewalBatch(len(batch))
	b.batches.Add(1)
	b.renewals.Add(int64(len(batch)))
	var confirm []*streamRenewal
	for _, r := range batch {
		if r.ctx.Err() != nil {
			continue
		}
		lagging, err := d.renewalEpoch(r.broker, r.epoch)
		switch {
		case err == nil:
			resp, err := detect.GrantAt(d.state, d.grantor, d.nodeID, r.broker, r.epoch, now)
			resp, err = d.renewalAnswer(r.ctx, r.broker, r.epoch, resp, err)
			r.answer <- renewalResult{grant: resp, err: err}
		case lagging:
			confirm = append(confirm, r)
		default:
			r.answer <- renewalResult{err: d.stateErr(r.ctx, err)}
		}
	}
	if len(confirm) > 0 {
		go b.confirm(ctx, confirm)
	}
}

// confirm runs one read index round for the renewals of a batch whose
// refusal may come from this member lagging behind the log, then checks
// each again and grants or refuses it, from one reading taken after the
// round.
func (b *renewalBatcher) confirm(ctx context.Context, rs []*streamRenewal) {
	d := b.d
	rctx, cancel := context.WithTimeout(ctx, renewalConfirmTimeout)
	err := d.node.LinearizableRead(rctx)
	cancel()
	now := b.clock.Now()
	for _, r := range rs {
		if r.ctx.Err() != nil {
			continue
		}
		switch {
		case err != nil:
			r.answer <- renewalResult{err: d.stateErr(r.ctx, err)}
		default:
			if cerr := d.state.CheckBroker(r.broker, r.epoch, nil); cerr != nil {
				r.answer <- renewalResult{err: d.stateErr(r.ctx, cerr)}
				continue
			}
			resp, err := detect.GrantAt(d.state, d.grantor, d.nodeID, r.broker, r.epoch, now)
			resp, err = d.renewalAnswer(r.ctx, r.broker, r.epoch, resp, err)
			r.answer <- renewalResult{grant: resp, err: err}
		}
	}
}

// RenewLeases serves one agent's renewal stream: each request is one
// renewal, answered in order on the stream with RenewLease's grant or
// refusal, granted in a batch with the other streams' renewals
// (renewalBatcher). A stream carries one agent's renewals to this member
// for as long as the agent runs; a request for another broker than its
// certificate names ends it (PermissionDenied), as does a malformed one
// (InvalidArgument).
func (s *agentService) RenewLeases(stream waldenv1.Agent_RenewLeasesServer) error {
	d := s.d
	ctx := stream.Context()
	d.decisions.RenewalStreams(1)
	s.streams.Add(1)
	defer func() {
		d.decisions.RenewalStreams(-1)
		s.streams.Add(-1)
	}()
	answer := make(chan renewalResult, 1)
	// The voters travel once per configuration on a stream: the agent
	// keeps the last ones it was sent.
	var sentConf uint64
	sentVoters := false
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var res renewalResult
		if res.err = checkRenewalRequest(req.GetBrokerId(), req.GetEpoch()); res.err == nil {
			s.renewals.submit(&streamRenewal{ctx: ctx, broker: req.GetBrokerId(), epoch: req.GetEpoch(), answer: answer})
			select {
			case res = <-answer:
			case <-s.renewals.stopped:
				res = renewalResult{err: errBatcherStopped}
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		countRenewal(d.decisions, res.err)
		resp := &waldenv1.RenewLeasesResponse{Seq: req.GetSeq()}
		if res.err != nil {
			p := rpcerr.Split(res.err)
			lvl := slog.LevelDebug
			if p.Code == codes.InvalidArgument {
				lvl = slog.LevelInfo
			}
			d.logger.Log(ctx, lvl, "streamed renewal refused", "broker_id", req.GetBrokerId(), "epoch", req.GetEpoch(), "err", res.err)
			resp.Refusal = &waldenv1.RenewalRefusal{Code: uint32(p.Code), Message: p.Message, Reason: string(p.Reason), Metadata: p.Metadata}
		} else {
			g := res.grant
			if sentVoters && g.GetConfIndex() == sentConf {
				g.Voters = nil
			} else {
				sentConf, sentVoters = g.GetConfIndex(), true
			}
			resp.Grant = g
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}
