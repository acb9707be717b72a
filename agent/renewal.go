package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/config"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/renewframe"
	"walden/rpcerr"
)

// streamRetryAfter is how long an agent renews over the gRPC stream with a
// coordinator that does not serve renewals over their own connection, or
// with one call each with one that does not serve the stream either (a
// walden before them, during a rolling upgrade), before it tries the
// better transport again.
const streamRetryAfter = 5 * time.Minute

// renewalWindow is the fixed flow-control window of the agent's
// connections to the coordinators (grpc's initial window).
const renewalWindow = 64 << 10

// unansweredLimit is how many attempts in a row may go unanswered on one
// stream (or connection of frames) before it is closed: one slow answer costs its attempt only, but
// a stream that is stuck must not hold the renewals of its coordinator.
const unansweredLimit = 2

// errNoStream marks a coordinator that answered the renewal stream with
// Unimplemented.
var errNoStream = errors.New("agent: the coordinator does not serve streamed renewals")

// errNoFrames marks a coordinator that does not serve renewals over their
// own connection: under TLS it refused the handshake that asked for
// renewframe.ALPN only (or chose no protocol); without TLS it ended a new
// connection before its first answer, or sent what is not an answer (a
// gRPC server closes one that starts with renewframe.Preface: see
// endedByPeer).
var errNoFrames = errors.New("agent: the coordinator does not serve renewals over their own connection")

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

// QuietRetry is the wait before the next renewal with a coordinator whose
// refusal err says it restarted less than a lease ago and when it grants
// again (LEASE_NOT_GRANTED with retry_after_ms): until then, plus up to a
// 24th of ttl so that a fleet does not ask all at once, and never more than
// twice ttl (a quiet period is one lease and its drift margin). Retrying
// sooner only meets another refusal; on the backoff instead, the agent
// would count that coordinator again up to a third of the lease after its
// quiet ended. false when err is no such refusal.
func QuietRetry(err error, ttl time.Duration) (time.Duration, bool) {
	p := rpcerr.Split(err)
	if p.Reason != refusal.LeaseNotGranted {
		return 0, false
	}
	ms, perr := strconv.ParseInt(p.Metadata["retry_after_ms"], 10, 64)
	if perr != nil || ms < 0 {
		return 0, false
	}
	wait := 2 * ttl
	if ms < int64(wait/time.Millisecond) { // compared before multiplying, which could overflow
		wait = time.Duration(ms) * time.Millisecond
	}
	return wait + rand.N(ttl/24+1), true
}

// Renewer renews a lease with one coordinator, one renewal after the
// other, over the best transport the coordinator serves (and the setting,
// renewals.transport, allows): over a connection of their own (package
// renewframe), without a gRPC stream's per-message work on either side;
// else over one long-lived gRPC stream (Agent.RenewLeases),
// a few bytes a renewal instead of a call each; else with one RenewLease
// call each (a walden before both, during a rolling upgrade). Whenever it
// falls back, it tries the better transport again after streamRetryAfter.
// The connection of frames and the gRPC stream are the same to it (a
// renewalStream): renewals numbered by seq, answered in order, the late
// answers skipped. The agent keeps one per coordinator; it is not safe for
// concurrent use.
type Renewer struct {
	conn      func() (*grpc.ClientConn, error)
	addr      string
	tls       func() *tls.Config
	dial      func(ctx context.Context, addr string) (net.Conn, error)
	transport string
	log       *slog.Logger
	// framesUntil: until then, renew over the gRPC stream; unaryUntil:
	// until then, with one call each. streamRetry is how long after the
	// coordinator showed it does not serve the better one
	// (streamRetryAfter).
	framesUntil, unaryUntil time.Time
	streamRetry             time.Duration

	// The open stream, framed when it is a connection of frames; nil when
	// there is none.
	stream renewalStream
	framed bool
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

// RenewerOptions say how a Renewer reaches its coordinator.
type RenewerOptions struct {
	// Conn returns the gRPC connection to the coordinator (the same one
	// each time, dialled on first use), for the stream and the calls.
	Conn func() (*grpc.ClientConn, error)
	// Addr is the coordinator's admin address (the one Conn dials), which
	// the connections of frames dial.
	Addr string
	// TLS returns the client side of mutual TLS (mtls.Load's Client: the
	// agent's certificate, the cluster's CA, the coordinator role
	// required) for each new connection of frames, so that certificates
	// read again (SIGHUP) are presented from the next connection on; nil,
	// or a nil configuration: the connections of frames are plain and open
	// with renewframe.Preface.
	TLS func() *tls.Config
	// Dial opens the TCP connections of frames; nil: net.Dialer.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Transport is renewals.transport (config.RenewalsAuto when empty).
	Transport string
	// Log gets the fallbacks; nil discards them.
	Log *slog.Logger
}

// NewRenewer returns a Renewer of the coordinator o names.
func NewRenewer(o RenewerOptions) *Renewer {
	r := &Renewer{conn: o.Conn, addr: o.Addr, dial: o.Dial, transport: o.Transport, log: o.Log, streamRetry: streamRetryAfter}
	if r.transport == "" {
		r.transport = config.RenewalsAuto
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.dial == nil {
		var d net.Dialer
		r.dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	r.tls = o.TLS
	return r
}

// Renew sends one renewal and waits for its answer, at most perTry. Its
// answers are RenewLease's: the grant, or the refusal as a gRPC status
// error; DeadlineExceeded when no answer came in time. A coordinator that
// does not serve a transport costs no attempt: the same renewal goes over
// the next one at once.
func (r *Renewer) Renew(ctx context.Context, req *waldenv1.RenewLeaseRequest, perTry time.Duration) (*waldenv1.RenewLeaseResponse, error) {
	now := time.Now()
	deadline := now.Add(perTry)
	if r.transport == config.RenewalsCall || now.Before(r.unaryUntil) {
		return r.renewOnce(ctx, req, deadline)
	}
	framed := r.transport == config.RenewalsFrames || (r.transport == config.RenewalsAuto && !now.Before(r.framesUntil))
	resp, err := r.renewStreamed(ctx, req, framed, deadline)
	if errors.Is(err, errNoFrames) {
		if r.transport == config.RenewalsFrames {
			return nil, status.Errorf(codes.Unimplemented, "the coordinator at %s does not serve renewals over their own connection (an older walden, or renewals.frames: false there), and renewals.transport is frames", r.addr)
		}
		r.framesUntil = time.Now().Add(r.streamRetry)
		r.log.Info("this coordinator does not serve renewals over their own connection (an older walden, or renewals.frames: false there): renewing over the gRPC stream",
			"try_frames_again_in", r.streamRetry)
		resp, err = r.renewStreamed(ctx, req, false, deadline)
	}
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

// renewStreamed sends one renewal on the stream — a connection of frames
// when framed, else the gRPC stream —, opening it first if needed, and
// waits for the answer with its seq until deadline. An answer that does
// not come in time costs the attempt, not the stream: the next renewal
// goes on the same stream, and the late answer is skipped by its seq. The
// stream is closed — the next renewal opens another — when it fails, when
// the send itself could not complete before deadline (flow control, a full
// socket), and when unansweredLimit attempts in a row went unanswered.
func (r *Renewer) renewStreamed(ctx context.Context, req *waldenv1.RenewLeaseRequest, framed bool, deadline time.Time) (*waldenv1.RenewLeaseResponse, error) {
	if r.stream != nil && r.framed != framed {
		r.Close() // the other transport's: the time to try frames again came
	}
	if r.stream == nil {
		if err := r.open(ctx, framed, deadline); err != nil {
			return nil, err
		}
	}
	r.seq++
	seq := r.seq
	if !r.stream.send(&waldenv1.RenewLeasesRequest{BrokerId: req.GetBrokerId(), Epoch: req.GetEpoch(), Seq: seq}, deadline) {
		r.Close()
		return nil, status.Error(codes.DeadlineExceeded, "renewal: the renewal could not be sent in time")
	}
	return r.await(ctx, seq, deadline)
}

// await waits until deadline for the answer to the renewal seq on the open
// stream, and closes the stream when this was the unansweredLimit-th
// attempt in a row without one. The answers to earlier renewals, given up
// on, are skipped: only the answer to seq was granted after this renewal
// was sent, and a grant counts from the send of the renewal it answers (an
// earlier one's, taken for this one, would count from too late). The
// answers a stream carried before it ended are taken before its end.
func (r *Renewer) await(ctx context.Context, seq uint64, deadline time.Time) (*waldenv1.RenewLeaseResponse, error) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case a := <-r.answers:
			if !answers(a, seq) {
				continue
			}
			r.unanswered = 0
			if codes.Code(a.GetRefusal().GetCode()) == codes.PermissionDenied {
				// The coordinator refuses this agent the renewals it
				// sent, and ends the stream after the refusal.
				r.Close()
			}
			return r.answer(a)
		case err := <-r.failed:
			for {
				select {
				case a := <-r.answers:
					if answers(a, seq) {
						r.Close()
						return r.answer(a)
					}
					continue
				default:
				}
				return nil, r.ended(err)
			}
		case <-ctx.Done():
			r.Close()
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-timer.C:
			if r.unanswered++; r.unanswered >= unansweredLimit {
				r.Close()
			}
			return nil, status.Error(codes.DeadlineExceeded, "renewal: no answer from the coordinator in time")
		}
	}
}

// answers says whether a is the answer to the renewal seq: its own, or a
// refusal of seq 0, which a coordinator sends for every renewal of a
// connection it refuses (it grants nothing).
func answers(a *waldenv1.RenewLeasesResponse, seq uint64) bool {
	return a.GetSeq() == seq || (a.GetSeq() == 0 && a.GetRefusal() != nil)
}

// open opens a stream — a connection of frames when framed, else a gRPC
// stream — and starts its receiver. Opening is bounded by deadline.
func (r *Renewer) open(ctx context.Context, framed bool, deadline time.Time) error {
	var s renewalStream
	var err error
	if framed {
		s, err = r.openFrames(ctx, deadline)
	} else {
		s, err = r.openStream(ctx, deadline)
	}
	if err != nil {
		return err
	}
	// Room for the answers of every renewal the stream may have
	// outstanding (unansweredLimit - 1 given up on and the current one),
	// and more.
	answers, failed := make(chan *waldenv1.RenewLeasesResponse, 4), make(chan error, 1)
	go receive(s, answers, failed)
	r.stream, r.framed, r.answers, r.failed = s, framed, answers, failed
	r.unanswered = 0
	return nil
}

// openStream opens a gRPC stream. Opening waits for the connection, at
// most until deadline.
func (r *Renewer) openStream(ctx context.Context, deadline time.Time) (renewalStream, error) {
	conn, err := r.conn()
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	guard := time.AfterFunc(time.Until(deadline), cancel)
	stream, err := waldenv1.NewAgentClient(conn).RenewLeases(sctx)
	if !guard.Stop() {
		cancel()
		return nil, status.Error(codes.DeadlineExceeded, "renewal: the stream did not open in time")
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &grpcRenewals{stream: stream, cancel: cancel}, nil
}

// openFrames dials a connection of frames to the coordinator, bounded by
// deadline: under TLS asking for renewframe.ALPN only (errNoFrames when
// the coordinator refuses it), plain with renewframe.Preface first.
func (r *Renewer) openFrames(ctx context.Context, deadline time.Time) (renewalStream, error) {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	conn, err := r.dial(dctx, r.addr)
	if err != nil {
		return nil, r.dialFailed(ctx, dctx, err)
	}
	var cfg *tls.Config
	if r.tls != nil {
		cfg = r.tls()
	}
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{renewframe.ALPN}
		tc, cs, err := mtls.Client(dctx, conn, cfg, authz.RoleCoordinator, r.addr)
		switch {
		case errors.Is(err, mtls.ErrNoApplicationProtocol):
			return nil, errNoFrames
		case err != nil:
			return nil, r.dialFailed(ctx, dctx, err)
		case cs.NegotiatedProtocol != renewframe.ALPN:
			// A TLS server that knows no application protocols at all.
			_ = tc.Close()
			return nil, errNoFrames
		}
		conn = tc
	} else {
		_ = conn.SetWriteDeadline(deadline)
		if _, err := io.WriteString(conn, renewframe.Preface); err != nil {
			_ = conn.Close()
			return nil, r.dialFailed(ctx, dctx, err)
		}
	}
	return &frameRenewals{conn: conn, w: renewframe.NewWriter(conn, renewframe.MaxRequest),
		r: renewframe.NewReader(conn, renewframe.MaxResponse), plain: cfg == nil}, nil
}

// dialFailed is the error of a connection of frames that could not be
// opened (dctx bounds the opening within ctx): an ordinary failed attempt,
// not a coordinator that does not serve frames.
func (r *Renewer) dialFailed(ctx, dctx context.Context, err error) error {
	var pe *mtls.PeerError
	switch {
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case dctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "renewal: the connection to the coordinator at %s did not open in time", r.addr)
	case errors.As(err, &pe):
		return status.Error(codes.Unavailable, pe.Error())
	}
	return status.Errorf(codes.Unavailable, "renewal: cannot connect to the coordinator at %s: %v", r.addr, err)
}

// renewalStream is one open stream of renewals with a coordinator: the
// gRPC stream Agent.RenewLeases, or a connection of frames. The Renewer
// sends on it and one receiver reads it, concurrently.
type renewalStream interface {
	// send sends m, at most until deadline; false when it could not
	// complete in time (the stream is then of no more use). A send that
	// fails otherwise ended the stream, and recv reports why.
	send(m *waldenv1.RenewLeasesRequest, deadline time.Time) bool
	// recv returns the next answer, or the error that ended the stream.
	recv() (*waldenv1.RenewLeasesResponse, error)
	// close ends the stream; a send or recv blocked on it returns.
	close()
}

// grpcRenewals is the gRPC stream Agent.RenewLeases.
type grpcRenewals struct {
	stream waldenv1.Agent_RenewLeasesClient
	cancel context.CancelFunc
}

// send: a send held by flow control past deadline can only be ended by
// cancelling the stream. A send on an ended stream says io.EOF only: the
// receiver reports why it ended.
func (s *grpcRenewals) send(m *waldenv1.RenewLeasesRequest, deadline time.Time) bool {
	guard := time.AfterFunc(time.Until(deadline), s.cancel)
	_ = s.stream.Send(m)
	return guard.Stop()
}

func (s *grpcRenewals) recv() (*waldenv1.RenewLeasesResponse, error) { return s.stream.Recv() }

func (s *grpcRenewals) close() { s.cancel() }

// frameRenewals is a connection of frames (package renewframe): one frame
// a renewal, written at once with a write deadline, and one frame an
// answer, in order.
type frameRenewals struct {
	conn net.Conn
	w    *renewframe.Writer
	r    *renewframe.Reader
	// plain: without TLS, where a coordinator that does not serve frames
	// shows it only by ending the connection before its first answer
	// (endedByPeer).
	plain bool
	// answered is set by the receiver at the first answer.
	answered bool
}

func (s *frameRenewals) send(m *waldenv1.RenewLeasesRequest, deadline time.Time) bool {
	_ = s.conn.SetWriteDeadline(deadline)
	return !errors.Is(s.w.Write(m), os.ErrDeadlineExceeded)
}

func (s *frameRenewals) recv() (*waldenv1.RenewLeasesResponse, error) {
	a := &waldenv1.RenewLeasesResponse{}
	if err := s.r.Read(a); err != nil {
		if s.plain && !s.answered && endedByPeer(err) {
			return nil, fmt.Errorf("%w: %w", errNoFrames, err)
		}
		var pe *mtls.PeerError
		switch {
		case errors.As(err, &pe):
			return nil, status.Error(codes.Unavailable, pe.Error())
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, status.Error(codes.DeadlineExceeded, "renewal: no answer from the coordinator in time")
		case errors.Is(err, net.ErrClosed):
			return nil, status.Error(codes.Unavailable, "renewal: the connection to the coordinator was closed on the agent's side")
		case errors.Is(err, io.EOF):
			return nil, status.Error(codes.Unavailable, "renewal: the coordinator closed the connection")
		}
		return nil, status.Errorf(codes.Unavailable, "renewal: the connection to the coordinator failed: %v", err)
	}
	s.answered = true
	return a, nil
}

// endedByPeer says whether err, the end of a plain connection of frames
// before its first answer, is the coordinator's own doing, as a
// coordinator that does not serve frames ends it. An older walden's (or
// one's with renewals.frames: false) gRPC server writes its HTTP/2
// SETTINGS frame, reads the first 24 bytes (an HTTP/2 client preface's
// length: renewframe.Preface and the start of the renewal), finds no
// preface, and closes the connection. The agent reads the SETTINGS
// frame's header as a frame's length, and then the frame too large or
// not a message (renewframe.ErrTooLarge, ErrMalformed), or the end inside
// or before it (io.ErrUnexpectedEOF, io.EOF), or a reset (ECONNRESET):
// every time against grpc-go's server, which closes with the renewal's
// last bytes unread, so that its kernel resets the connection instead of
// ending it. A reset is reported once, to whichever of the agent's read
// or write meets it first; the reads after it end with io.EOF.
//
// So a reset must count, though not only a coordinator without frames
// sends one: one that stops or crashes with the agent's renewal unread,
// or that restarted and no longer knows the connection, resets it too,
// as one that stops with nothing unread ends it (io.EOF). Neither can be
// told from an older walden here; mistaking one costs renewals over the
// gRPC stream for streamRetryAfter (one failed attempt with
// renewals.transport: frames). Lost packets reset nothing: TCP sends
// them again, and a link that loses everything times out after minutes
// (ETIMEDOUT, an ordinary failure).
//
// Every other error is the agent's side's, or the network's, and an
// ordinary failed attempt: a read deadline (os.ErrDeadlineExceeded), the
// connection closed on the agent's side (net.ErrClosed: by the Renewer,
// or by a connection that Options.Dial wraps, such as one that delays its
// writes and closes itself when one misses its deadline), an unreachable
// network.
func endedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, renewframe.ErrTooLarge) || errors.Is(err, renewframe.ErrMalformed)
}

func (s *frameRenewals) close() { _ = s.conn.Close() }

// receive hands the answers of stream to answers, in order, until the
// stream ends, then its error to failed. A grant that leaves the voters out
// gets the voters the stream sent last: that is what the coordinator
// meant, answer by answer, whether or not anyone still waits for the
// answer (so it is done here, where every answer passes). An answer that
// does not fit in answers is dropped: nobody waits for it.
func receive(stream renewalStream, answers chan<- *waldenv1.RenewLeasesResponse, failed chan<- error) {
	// voters and conf are the voters the stream sent last, and their
	// configuration's index: an answer of the same configuration leaves
	// them out.
	var voters []*waldenv1.Voter
	var conf uint64
	for {
		a, err := stream.recv()
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
// of a RenewLease call: errNoStream when the coordinator does not serve the
// gRPC stream, errNoFrames when it does not serve frames.
func (r *Renewer) ended(err error) error {
	r.Close()
	switch {
	case status.Code(err) == codes.Unimplemented:
		return errNoStream
	case errors.Is(err, errNoFrames):
		return errNoFrames
	case err == nil, errors.Is(err, io.EOF):
		return status.Error(codes.Unavailable, "renewal: the coordinator ended the stream")
	}
	return err
}

// Close ends the open stream, if any.
func (r *Renewer) Close() {
	if r.stream == nil {
		return
	}
	r.stream.close()
	r.stream, r.answers, r.failed = nil, nil, nil
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
