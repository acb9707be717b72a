package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"walden/authz"
	"walden/config"
	"walden/connlimit"
	waldenv1 "walden/proto/walden/v1"
	"walden/renewframe"
)

// frameWriteTimeout bounds the write of one answer on a framed renewal
// connection: an agent that does not read its answers is closed.
const frameWriteTimeout = 5 * time.Second

// renewalFrames serves the agents' renewals over their own connection on
// the admin listener (package renewframe): the same requests and answers
// as the RenewLeases stream, framed on the TLS connection (or the plain
// one after renewframe.Preface), with one goroutine a connection — the one
// gRPC runs the connection's handshake on. It authorizes as RenewLeases
// does: the connection's certificate once, the broker of every renewal.
type renewalFrames struct {
	// agent answers the renewals; set once the Agent API is built, before
	// the admin listener serves.
	agent *agentService
	az    *authz.Authorizer
	// idle bounds the wait for each frame (limits.admin's
	// max_connection_idle; 0: no bound).
	idle   time.Duration
	logger *slog.Logger
	// bad logs the connections that sent what is not a renewal, at most a
	// line a second.
	bad *connlimit.RateLog

	mu    sync.Mutex
	conns map[net.Conn]context.CancelFunc
	// closed is set by close: a connection that dispatches after it is
	// closed at once.
	closed bool
}

func newRenewalFrames(az *authz.Authorizer, idle time.Duration, logger *slog.Logger) *renewalFrames {
	return &renewalFrames{az: az, idle: idle, logger: logger, bad: connlimit.NewRateLog(logger), conns: map[net.Conn]context.CancelFunc{}}
}

// creds wraps the admin listener's credentials (secure: TLS, offering
// renewframe.ALPN) so that a connection that asks for framed renewals is
// served by f instead of gRPC. Wrap connlimit's counting credentials, not
// the other way round: a connection served as frames is not a failed
// handshake.
func (f *renewalFrames) creds(inner credentials.TransportCredentials, secure bool) credentials.TransportCredentials {
	return &dispatchingCreds{TransportCredentials: inner, frames: f, secure: secure}
}

// dispatchingCreds hand gRPC every connection but those that ask for
// framed renewals: under TLS, the ones that negotiated renewframe.ALPN;
// without, the ones that open with renewframe.Preface. Those are served in
// ServerHandshake, which gRPC calls on the connection's own goroutine,
// until they end; then ServerHandshake returns
// credentials.ErrConnDispatched, and gRPC leaves the connection alone.
type dispatchingCreds struct {
	credentials.TransportCredentials
	frames *renewalFrames
	secure bool
}

func (c *dispatchingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if !c.secure {
		conn, framed, err := renewframe.Sniff(raw)
		if err != nil {
			return nil, nil, err // io.EOF: closed before a byte (a probe)
		}
		if !framed {
			return c.TransportCredentials.ServerHandshake(conn)
		}
		c.frames.serve(conn, nil)
		return nil, nil, credentials.ErrConnDispatched
	}
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, info, err
	}
	if ti, ok := info.(credentials.TLSInfo); !ok || ti.State.NegotiatedProtocol != renewframe.ALPN {
		return conn, info, nil
	}
	c.frames.serve(conn, info)
	return nil, nil, credentials.ErrConnDispatched
}

func (c *dispatchingCreds) Clone() credentials.TransportCredentials {
	return &dispatchingCreds{TransportCredentials: c.TransportCredentials.Clone(), frames: c.frames, secure: c.secure}
}

// serve answers the renewals of one framed connection in order, each as
// the RenewLeases stream would (agentService.renew), until the agent
// closes it, a frame is not a renewal, a renewal is refused authorization,
// the agent stops reading, it was idle for f.idle, or the server stops.
// It closes conn.
func (f *renewalFrames) serve(conn net.Conn, info credentials.AuthInfo) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if !f.track(conn, cancel) {
		_ = conn.Close()
		return
	}
	defer f.untrack(conn)
	defer f.agent.renewalsOpened(config.RenewalsFrames)()
	addr := conn.RemoteAddr()
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr, LocalAddr: conn.LocalAddr(), AuthInfo: info})
	const method = waldenv1.Agent_RenewLeases_FullMethodName
	id, refused := f.az.Authorize(ctx, method, nil)
	ctx = authz.NewContext(ctx, id)
	r := renewframe.NewReader(conn, renewframe.MaxRequest)
	w := renewframe.NewWriter(conn, renewframe.MaxResponse)
	var sess renewalSession
	authorized := "" // the broker id the identity was authorized for last
	req := &waldenv1.RenewLeasesRequest{}
	for {
		var deadline time.Time
		if f.idle > 0 {
			deadline = time.Now().Add(f.idle)
		}
		_ = conn.SetReadDeadline(deadline) // also clears gRPC's handshake deadline
		if err := r.Read(req); err != nil {
			f.ended(ctx, addr, err)
			return
		}
		ticket := f.agent.readings.Arrived()
		if refused == nil && f.az.Secure && req.GetBrokerId() != authorized {
			if _, refused = f.az.Authorize(ctx, method, req); refused == nil {
				authorized = req.GetBrokerId()
			}
		}
		var resp *waldenv1.RenewLeasesResponse
		if refused != nil {
			resp = &waldenv1.RenewLeasesResponse{Seq: req.GetSeq(), Refusal: renewalRefusal(refused)}
		} else {
			resp = f.agent.renew(ctx, &sess, req, ticket)
		}
		_ = conn.SetWriteDeadline(time.Now().Add(frameWriteTimeout))
		if err := w.Write(resp); err != nil {
			f.ended(ctx, addr, err)
			return
		}
		if refused != nil {
			return
		}
	}
}

// ended logs why a framed connection ends: at debug when the agent closed
// it, it was idle or the server stops; at warn (at most a line a second)
// when it sent what is not a renewal or did not read its answers.
func (f *renewalFrames) ended(ctx context.Context, addr net.Addr, err error) {
	const msg = "renewal connection closed"
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), ctx.Err() != nil:
		f.logger.Debug(msg, "peer", addr.String(), "err", err)
	case errors.Is(err, renewframe.ErrTooLarge), errors.Is(err, renewframe.ErrMalformed), errors.Is(err, io.ErrUnexpectedEOF):
		f.bad.Warn(msg+": the agent sent what is not a renewal", "peer", addr.String(), "err", err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		f.bad.Warn(msg+": the agent sent nothing within max_connection_idle or did not read its answers", "peer", addr.String(), "err", err)
	default:
		f.logger.Debug(msg, "peer", addr.String(), "err", err)
	}
}

// track counts conn open; false once close was called.
func (f *renewalFrames) track(conn net.Conn, cancel context.CancelFunc) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[conn] = cancel
	return true
}

// untrack closes conn and forgets it.
func (f *renewalFrames) untrack(conn net.Conn) {
	f.mu.Lock()
	delete(f.conns, conn)
	f.mu.Unlock()
	_ = conn.Close()
}

// open is the number of framed connections open.
func (f *renewalFrames) open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// close closes every framed connection, and every one that dispatches
// from now on, so that the admin gRPC server's stop, which waits for the
// goroutines that serve them, does not wait for the agents.
func (f *renewalFrames) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for conn, cancel := range f.conns {
		cancel()
		_ = conn.Close()
	}
}
