package agent

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
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

// unansweredLimit is how many attempts in a row may go unanswered on one
// stream before it is closed: one slow answer costs its attempt only, but
// a stream that is stuck must not hold the renewals of its coordinator.
const unansweredLimit = 2

// errNoStream marks a coordinator that answered the renewal stream with
// Unimplemented.
var errNoStream = errors.New("agent: the coordinator does not serve streamed renewals")

// Backoff is the wait before the next attempt after failures consecutive
// failed ones (1 after the first): first, doubled with each failure after
// it up to ceiling, with equal jitter — half of it fixed, half uniformly
// random — so that the agents that failed together (behind a coordinator
// that restarted or is overloaded) do not try again together. It is never
// less than half of first, never more than ceiling. The agent's
// registrations and its renewals with each coordinator (RenewalBackoff)
// wait by it.
func Backoff(failures int, first, ceiling time.Duration) time.Duration {
	d := max(min(first, ceiling), 0)
	for i := 1; i < failures && 0 < d && d < ceiling; i++ {
		d = min(d, ceiling/2) * 2
	}
	d = min(d, ceiling)
	return d/2 + rand.N(d/2+1)
}

// RenewalBackoff is the wait before the next renewal with a coordinator
// after failures consecutive failed ones, for a lease of ttl: Backoff from a
// twelfth of the lease up to a third, the interval of the renewals
// themselves. So the first retry comes no later than a twelfth of the lease
// after the failure, and a coordinator that keeps failing (silent,
// unreachable, refusing at once) gets about one attempt per renewal
// interval, not four or more.
func RenewalBackoff(failures int, ttl time.Duration) time.Duration {
	return Backoff(failures, ttl/12, ttl/3)
}

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
	// unanswered counts the attempts in a row on the stream that got no
	// answer in time.
	unanswered int
	// seq numbers the renewals of all the Renewer's streams: an answer is
	// taken for the renewal of its seq only.
	seq uint64
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
// needed, and waits for the answer with its seq until deadline. An answer
// that does not come in time costs the attempt, not the stream: the next
// renewal goes on the same stream, and the late answer is skipped by its
// seq. The stream is closed — the next renewal opens another — when it
// fails, when the send itself could not complete before deadline (flow
// control), and when unansweredLimit attempts in a row went unanswered.
func (r *Renewer) renewStreamed(ctx context.Context, req *waldenv1.RenewLeaseRequest, deadline time.Time) (*waldenv1.RenewLeaseResponse, error) {
	if r.stream == nil {
		if err := r.open(ctx, deadline); err != nil {
			return nil, err
		}
	}
	r.seq++
	seq := r.seq
	if err := r.send(&waldenv1.RenewLeasesRequest{BrokerId: req.GetBrokerId(), Epoch: req.GetEpoch(), Seq: seq}, deadline); err != nil {
		return nil, err
	}
	return r.await(ctx, seq, deadline)
}

// send sends m on the open stream, at most until deadline. A send held by
// flow control past deadline can only be ended by cancelling the stream:
// then the stream is closed and the error is DeadlineExceeded. A send that
// fails otherwise ended the stream, and the receiver reports why (a send on
// an ended stream says io.EOF only): send returns nil, and the wait for the
// answer gets the stream's error.
func (r *Renewer) send(m *waldenv1.RenewLeasesRequest, deadline time.Time) error {
	guard := time.AfterFunc(time.Until(deadline), r.cancel)
	_ = r.stream.Send(m)
	if !guard.Stop() {
		r.Close()
		return status.Error(codes.DeadlineExceeded, "renewal: the renewal could not be sent on the stream in time")
	}
	return nil
}

// await waits until deadline for the answer to the renewal seq on the open
// stream, and closes the stream when this was the unansweredLimit-th
// attempt in a row without one. The answers to earlier renewals, given up
// on, are skipped: only the answer to seq was granted after this renewal
// was sent, and a grant counts from the send of the renewal it answers (an
// earlier one's, taken for this one, would count from too late).
func (r *Renewer) await(ctx context.Context, seq uint64, deadline time.Time) (*waldenv1.RenewLeaseResponse, error) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case a := <-r.answers:
			if a.GetSeq() != seq {
				continue // the late answer to a renewal given up on
			}
			r.unanswered = 0
			return r.answer(a)
		case err := <-r.failed:
			return nil, r.ended(err)
		case <-ctx.Done():
			r.Close()
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-timer.C:
			if r.unanswered++; r.unanswered >= unansweredLimit {
				r.Close()
			}
			return nil, status.Error(codes.DeadlineExceeded, "renewal: no answer on the stream in time")
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
	// Room for the answers of every renewal the stream may have
	// outstanding (unansweredLimit - 1 given up on and the current one),
	// and more.
	answers, failed := make(chan *waldenv1.RenewLeasesResponse, 4), make(chan error, 1)
	go receive(stream, answers, failed)
	r.stream, r.cancel, r.answers, r.failed = stream, cancel, answers, failed
	r.unanswered = 0
	return nil
}

// receive hands the answers of stream to answers, in order, until the
// stream ends, then its error to failed. A grant that leaves the voters out
// gets the voters the stream sent last: that is what the coordinator
// meant, answer by answer, whether or not anyone still waits for the
// answer (so it is done here, where every answer passes). An answer that
// does not fit in answers is dropped: nobody waits for it.
func receive(stream waldenv1.Agent_RenewLeasesClient, answers chan<- *waldenv1.RenewLeasesResponse, failed chan<- error) {
	// voters and conf are the voters the stream sent last, and their
	// configuration's index: an answer of the same configuration leaves
	// them out.
	var voters []*waldenv1.Voter
	var conf uint64
	for {
		a, err := stream.Recv()
		if err != nil {
			failed <- err
			return
		}
		if g := a.GetGrant(); g != nil {
			switch {
			case len(g.GetVoters()) > 0:
				voters, conf = g.GetVoters(), g.GetConfIndex()
			case g.GetConfIndex() == conf:
				g.Voters = voters
			}
		}
		select {
		case answers <- a:
		default:
		}
	}
}

// ended closes the stream that failed with err and says why, in the terms
// of a RenewLease call: errNoStream when the coordinator does not serve it.
func (r *Renewer) ended(err error) error {
	r.Close()
	switch {
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

// answer turns a stream's answer into RenewLease's: the grant (receive
// gave it the voters it left out), or the refusal as the status error
// RenewLease would fail with.
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
	return g, nil
}
