package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// streamRetryAfter is how long an agent renews with one call each with a
// coordinator that does not serve the renewal stream (a walden before it,
// during a rolling upgrade) before it tries the stream again.
const streamRetryAfter = 5 * time.Minute

// renewalWindow is the fixed flow-control window of the agent's
// connections to the coordinators (grpc's initial window).
const renewalWindow = 64 << 10

// errNoStream marks a coordinator that answered the renewal stream with
// Unimplemented.
var errNoStream = errors.New("agent: the coordinator does not serve streamed renewals")

// Renewer renews a lease with one coordinator, one renewal after the
// other: over one long-lived stream (Agent.RenewLeases), which costs both
// sides a few bytes a renewal instead of a call each, or with one
// RenewLease call each with a coordinator that does not serve the stream
// (a walden before it, during a rolling upgrade), trying the stream again
// every streamRetryAfter. The agent keeps one per coordinator; it is not
// safe for concurrent use.
type Renewer struct {
	conn func() (*grpc.ClientConn, error)
	log  *slog.Logger
	// unaryUntil: until then, renew with one call each. streamRetry is
	// how long after an Unimplemented answer (streamRetryAfter).
	unaryUntil  time.Time
	streamRetry time.Duration

	// The open stream; nil when there is none.
	stream waldenv1.Agent_RenewLeasesClient
	cancel context.CancelFunc
	// answers carries the stream's answers, failed the error that ended it
	// (each stream has its own).
	answers chan *waldenv1.RenewLeasesResponse
	failed  chan error
	// timedOut is set when an attempt's deadline cancelled the stream.
	timedOut *atomic.Bool
	seq      uint64
	// voters and conf are the voters the stream sent last, and their
	// configuration's index: an answer of the same configuration leaves
	// them out.
	voters []*waldenv1.Voter
	conf   uint64
}

// NewRenewer returns a Renewer over the connection conn returns (the same
// one each time, dialled on first use); log gets the fallback to calls.
func NewRenewer(conn func() (*grpc.ClientConn, error), log *slog.Logger) *Renewer {
	return &Renewer{conn: conn, log: log, streamRetry: streamRetryAfter}
}

// Renew sends one renewal and waits for its answer, at most perTry. Its
// answers are RenewLease's: the grant, or the refusal as a gRPC status
// error; DeadlineExceeded when no answer came in time.
func (r *Renewer) Renew(ctx context.Context, req *waldenv1.RenewLeaseRequest, perTry time.Duration) (*waldenv1.RenewLeaseResponse, error) {
	deadline := time.Now().Add(perTry)
	if time.Now().Before(r.unaryUntil) {
		return r.renewOnce(ctx, req, deadline)
	}
	resp, err := r.renewStreamed(ctx, req, deadline)
	if errors.Is(err, errNoStream) {
		r.unaryUntil = time.Now().Add(r.streamRetry)
		r.log.Info("this coordinator does not serve streamed renewals (an older walden): renewing with one call each",
			"try_the_stream_again_in", r.streamRetry)
		return r.renewOnce(ctx, req, deadline)
	}
	return resp, err
}

// renewOnce is one RenewLease call, until deadline.
func (r *Renewer) renewOnce(ctx context.Context, req *waldenv1.RenewLeaseRequest, deadline time.Time) (*waldenv1.RenewLeaseResponse, error) {
	conn, err := r.conn()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return waldenv1.NewAgentClient(conn).RenewLease(cctx, req)
}

// renewStreamed sends one renewal on the stream, opening it first if
// needed, and waits for the answer with its seq until deadline. A deadline
// that passes, or any failure of the stream, closes the stream: the next
// renewal opens a new one.
func (r *Renewer) renewStreamed(ctx context.Context, req *waldenv1.RenewLeaseRequest, deadline time.Time) (*waldenv1.RenewLeaseResponse, error) {
	if r.stream == nil {
		if err := r.open(ctx, deadline); err != nil {
			return nil, err
		}
	}
	// The deadline cancels the stream, which ends a send held by flow
	// control as well as the wait.
	timedOut, cancel := r.timedOut, r.cancel
	guard := time.AfterFunc(time.Until(deadline), func() {
		timedOut.Store(true)
		cancel()
	})
	resp, err := r.exchange(ctx, req)
	if !guard.Stop() && r.stream != nil {
		// The deadline passed as the answer came: the stream is cancelled.
		r.Close()
	}
	return resp, err
}

// exchange sends one renewal on the open stream and waits for its answer.
func (r *Renewer) exchange(ctx context.Context, req *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	r.seq++
	seq := r.seq
	// A send that fails ended the stream: the receiver reports why (a send
	// on an ended stream says io.EOF only).
	_ = r.stream.Send(&waldenv1.RenewLeasesRequest{BrokerId: req.GetBrokerId(), Epoch: req.GetEpoch(), Seq: seq})
	for {
		select {
		case a := <-r.answers:
			if a.GetSeq() != seq {
				continue // the answer to a renewal given up on
			}
			return r.answer(a)
		case err := <-r.failed:
			return nil, r.ended(err)
		case <-ctx.Done():
			r.Close()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// open opens a stream and starts its receiver. Opening waits for the
// connection, at most until deadline.
func (r *Renewer) open(ctx context.Context, deadline time.Time) error {
	conn, err := r.conn()
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	guard := time.AfterFunc(time.Until(deadline), cancel)
	stream, err := waldenv1.NewAgentClient(conn).RenewLeases(sctx)
	if !guard.Stop() {
		cancel()
		return status.Error(codes.DeadlineExceeded, "renewal: the stream did not open in time")
	}
	if err != nil {
		cancel()
		return err
	}
	answers, failed := make(chan *waldenv1.RenewLeasesResponse, 4), make(chan error, 1)
	go func() {
		for {
			a, err := stream.Recv()
			if err != nil {
				failed <- err
				return
			}
			select {
			case answers <- a:
			default: // answers nobody waits for
			}
		}
	}()
	r.stream, r.cancel, r.answers, r.failed = stream, cancel, answers, failed
	r.timedOut = new(atomic.Bool)
	r.voters, r.conf = nil, 0
	return nil
}

// ended closes the stream that failed with err and says why, in the terms
// of a RenewLease call: DeadlineExceeded when the attempt's deadline
// cancelled it, errNoStream when the coordinator does not serve it.
func (r *Renewer) ended(err error) error {
	timedOut := r.timedOut.Load()
	r.Close()
	switch {
	case timedOut:
		return status.Error(codes.DeadlineExceeded, "renewal: no answer on the stream in time")
	case status.Code(err) == codes.Unimplemented:
		return errNoStream
	case err == nil:
		return status.Error(codes.Unavailable, "renewal: the coordinator ended the stream")
	}
	return err
}

// Close ends the open stream, if any.
func (r *Renewer) Close() {
	if r.stream == nil {
		return
	}
	r.cancel()
	r.stream, r.cancel, r.answers, r.failed = nil, nil, nil, nil
}

// answer turns a stream's answer into RenewLease's: the grant, with the
// voters the stream sent last when it left them out, or the refusal as
// the status error RenewLease would fail with.
func (r *Renewer) answer(a *waldenv1.RenewLeasesResponse) (*waldenv1.RenewLeaseResponse, error) {
	if f := a.GetRefusal(); f != nil {
		if codes.Code(f.GetCode()) == codes.OK {
			return nil, status.Error(codes.Internal, "renewal: a refusal without a code")
		}
		return nil, rpcerr.Join(rpcerr.Parts{Code: codes.Code(f.GetCode()), Message: f.GetMessage(),
			Reason: refusal.Reason(f.GetReason()), Metadata: f.GetMetadata()})
	}
	g := a.GetGrant()
	if g == nil {
		return nil, status.Error(codes.Internal, "renewal: an answer with neither a grant nor a refusal")
	}
	switch {
	case len(g.GetVoters()) > 0:
		r.voters, r.conf = g.GetVoters(), g.GetConfIndex()
	case g.GetConfIndex() == r.conf:
		g.Voters = r.voters
	}
	return g, nil
}
