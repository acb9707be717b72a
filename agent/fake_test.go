package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/renewframe"
	"walden/rpcerr"
)

// fakeCluster is an in-test coordinator cluster with the semantics the
// agent relies on: Register (answered by the leader; the others name it)
// always issues a new epoch, refused with RECOVERY_RUNNING while a recovery
// of the broker runs; every coordinator grants RenewLease of the current
// unfenced epoch on its own (NODE_FENCED for a fenced broker, EPOCH_EXPIRED
// for another epoch) and names the voters; each records when it received
// the renewals it granted, and would attest its grant expired lease_ttl +
// drift after that (attestAt).
type fakeCluster struct {
	ttl, drift time.Duration

	mu              sync.Mutex
	epoch           uint64 // current epoch of the broker, 0 = unknown
	nextEpoch       uint64
	fenced          bool
	recoveryRunning bool
	recoveredOffset int64
	registers       int // Register calls, refused ones included
	lastRegister    *waldenv1.RegisterRequest
	coords          []*fakeCoord
	leader          int
	// hintInDetail makes followers name the leader in an ErrorInfo
	// detail instead of the trailers.
	hintInDetail bool
	// failureTimeout is the failure_timeout registrations answer.
	failureTimeout time.Duration
	// conf is the index of the voter configuration the grants name.
	conf uint64
	// renewIn is the renewal slot request every grant carries (0: none).
	renewIn time.Duration
}

type fakeCoord struct {
	waldenv1.UnimplementedAgentServer
	c    *fakeCluster
	id   string
	addr string
	// stop closes its listener and connections: unreachable from then on.
	stop  func()
	clock lease.Clock
	// incarnation is the coordinator's incarnation in the configuration
	// (replace gives it another one).
	incarnation uint64

	mu sync.Mutex
	// hang: renewals get no answer (a call waits until its caller gives
	// up; a stream receives them and answers none).
	hang bool
	// refuse, when set, answers every renewal at once with this refusal
	// (a coordinator that cannot grant now).
	refuse refusal.Reason
	// quietUntil, when set, refuses every renewal until then as a
	// coordinator waiting out its first lease does (LEASE_NOT_GRANTED,
	// cause starting, retry_after_ms); quietRefused counts them.
	quietUntil   time.Time
	quietRefused int
	// quietGranted counts the grants of renewals that found the quiet
	// period set and over.
	quietGranted int
	lastRecv     time.Duration
	// recvs are the moments it received the renewals it granted.
	recvs    []time.Duration
	renewals int
	calls    int // Register calls answered with a leader hint
	// noStream makes the coordinator one of a walden before streamed
	// renewals: RenewLeases is Unimplemented.
	noStream bool
	// streams counts the renewal streams opened, streamed the renewals
	// answered on them, unary the RenewLease calls.
	streams, streamed, unary int
	// breakAfter, when positive, ends every stream with Unavailable after
	// that many answers on it (a coordinator restarting, a proxy cutting
	// long streams).
	breakAfter int
	// longest is the most renewals one stream carried.
	longest int
	// attempts counts every renewal received, answered or not; open the
	// renewal streams being served now.
	attempts, open int
	// lateN renewals from now on a stream are answered lateBy after they
	// arrived (a coordinator slow to answer); lateSent counts the late
	// answers sent.
	lateN, lateSent int
	lateBy          time.Duration
	// noFrames makes the coordinator one that does not serve renewals
	// over their own connection: under TLS it offers only h2, without it
	// gRPC gets the connections that start with the preface (and closes
	// them). framesAsked counts the connections that asked for frames,
	// frameConns those it served, framedRenewals the renewals granted on
	// them.
	noFrames                                bool
	framesAsked, frameConns, framedRenewals int
	// refuseConn: the next renewals on a stream are refused
	// (PermissionDenied) and the stream ended.
	refuseConn bool
}

// newFakeCluster serves n coordinators on loopback until the test ends;
// c1 leads.
func newFakeCluster(t testing.TB, n int, ttl, drift time.Duration, clock lease.Clock) *fakeCluster {
	t.Helper()
	if clock == nil {
		clock = lease.BootClock
	}
	c := &fakeCluster{ttl: ttl, drift: drift, nextEpoch: 1, recoveredOffset: -1, conf: 1}
	for i := range n {
		fc := &fakeCoord{c: c, id: fmt.Sprintf("c%d", i+1), clock: clock, incarnation: uint64(i + 1)}
		fc.addr, fc.stop = serveCoordinator(t, fc, nil)
		c.coords = append(c.coords, fc)
	}
	return c
}

// addrs are the coordinators' addresses.
func (c *fakeCluster) addrs() []string {
	var out []string
	for _, fc := range c.coords {
		out = append(out, fc.addr)
	}
	return out
}

// refusedWith is the status a coordinator answers for a refusal of the
// replicated state.
func refusedWith(reason refusal.Reason) error {
	return rpcerr.Err(refusal.Sentinel(reason))
}

func (f *fakeCoord) Register(ctx context.Context, req *waldenv1.RegisterRequest) (*waldenv1.RegisterResponse, error) {
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.coords[c.leader] != f {
		f.mu.Lock()
		f.calls++
		f.mu.Unlock()
		leaderAddr := c.coords[c.leader].addr
		if c.hintInDetail {
			s, _ := status.New(codes.Unavailable, "not leader").WithDetails(&errdetails.ErrorInfo{
				Reason: "NOT_LEADER", Domain: "walden.v1", Metadata: map[string]string{"leader_id": c.coords[c.leader].id, "leader_addr": leaderAddr},
			})
			return nil, s.Err()
		}
		_ = grpc.SetTrailer(ctx, metadata.Pairs("walden-leader-id", c.coords[c.leader].id, "walden-leader-addr", leaderAddr))
		return nil, status.Error(codes.Unavailable, "not leader")
	}
	c.registers++
	c.lastRegister = req
	if req.GetClusterName() != "demo" {
		return nil, status.Error(codes.InvalidArgument, "cluster_name: wrong cluster")
	}
	if c.recoveryRunning {
		return nil, refusedWith(reasonRecoveryRunning)
	}
	c.epoch = c.nextEpoch
	c.nextEpoch++
	c.fenced = false
	return &waldenv1.RegisterResponse{BrokerId: req.GetBrokerId(), Epoch: c.epoch, LeaseTtlMs: c.ttl.Milliseconds(), RecoveredWalOffset: c.recoveredOffset,
		FailureTimeoutMs: c.failureTimeout.Milliseconds()}, nil
}

func (f *fakeCoord) RenewLease(ctx context.Context, req *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	f.mu.Lock()
	f.unary++
	f.attempts++
	hang := f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return f.renew(ctx, req)
}

// RenewLeases serves the gRPC stream of renewals (serveRenewals).
func (f *fakeCoord) RenewLeases(stream waldenv1.Agent_RenewLeasesServer) error {
	f.mu.Lock()
	if f.noStream {
		f.mu.Unlock()
		return status.Error(codes.Unimplemented, "unknown method RenewLeases for service walden.v1.Agent")
	}
	f.streams++
	f.mu.Unlock()
	return f.serveRenewals(stream, false)
}

// renewalServer is the coordinator's side of a stream of renewals: the
// gRPC stream, or a connection of frames.
type renewalServer interface {
	Recv() (*waldenv1.RenewLeasesRequest, error)
	Send(*waldenv1.RenewLeasesResponse) error
	Context() context.Context
}

// serveRenewals answers each renewal of the stream (framed: a connection
// of frames) as RenewLease does, with the voters once per configuration on
// a stream, as a coordinator does. While it hangs it receives renewals and
// answers none (the stream stays open); a renewal setLate names is answered
// late, and the renewals after it wait (a coordinator answers a stream in
// order). With refuseConn set it answers the first renewal with a
// PermissionDenied refusal and ends the stream, as a coordinator does with
// a renewal of another broker on a connection of frames.
func (f *fakeCoord) serveRenewals(stream renewalServer, framed bool) error {
	f.mu.Lock()
	f.open++
	breakAfter := f.breakAfter
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.open--
		f.mu.Unlock()
	}()
	var sentConf uint64
	sentVoters := false
	answered := 0
	for {
		if breakAfter > 0 && answered == breakAfter {
			return status.Error(codes.Unavailable, "the stream was cut")
		}
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		f.mu.Lock()
		f.attempts++
		hang, late, refuseConn := f.hang, time.Duration(0), f.refuseConn
		if f.lateN > 0 && !hang {
			f.lateN--
			late = f.lateBy
		}
		f.mu.Unlock()
		if refuseConn {
			_ = stream.Send(&waldenv1.RenewLeasesResponse{Seq: req.GetSeq(), Refusal: &waldenv1.RenewalRefusal{
				Code: uint32(codes.PermissionDenied), Message: "this agent may not renew the lease of another broker"}})
			return nil
		}
		if hang {
			continue // received, never answered
		}
		if late > 0 {
			select {
			case <-stream.Context().Done():
				return nil
			case <-time.After(late):
			}
		}
		resp, err := f.renew(stream.Context(), &waldenv1.RenewLeaseRequest{BrokerId: req.GetBrokerId(), Epoch: req.GetEpoch()})
		out := &waldenv1.RenewLeasesResponse{Seq: req.GetSeq()}
		if err != nil {
			p := rpcerr.Split(err)
			out.Refusal = &waldenv1.RenewalRefusal{Code: uint32(p.Code), Message: p.Message, Reason: string(p.Reason), Metadata: p.Metadata}
		} else {
			if sentVoters && resp.GetConfIndex() == sentConf {
				resp.Voters = nil
			}
			sentConf, sentVoters = resp.GetConfIndex(), true
			out.Grant = resp
			answered++
			f.mu.Lock()
			if framed {
				f.framedRenewals++
			} else {
				f.streamed++
			}
			f.longest = max(f.longest, answered)
			f.mu.Unlock()
		}
		if err := stream.Send(out); err != nil {
			return err
		}
		if late > 0 {
			f.mu.Lock()
			f.lateSent++
			f.mu.Unlock()
		}
	}
}

func (f *fakeCoord) renew(ctx context.Context, req *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	f.mu.Lock()
	refuse := f.refuse
	quiet := time.Until(f.quietUntil)
	if quiet > 0 {
		f.quietRefused++
	}
	afterQuiet := !f.quietUntil.IsZero() && quiet <= 0
	f.mu.Unlock()
	if refuse != "" {
		return nil, rpcerr.New(refuse, "refused by "+f.id, nil)
	}
	if quiet > 0 {
		return nil, rpcerr.New(refusal.LeaseNotGranted, f.id+" started less than a lease ago",
			map[string]string{"cause": "starting", "retry_after_ms": strconv.FormatInt(int64((quiet+time.Millisecond-1)/time.Millisecond), 10)})
	}
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.epoch == 0:
		return nil, refusedWith(reasonUnknownNode)
	case c.fenced:
		return nil, refusedWith(reasonNodeFenced)
	case req.GetEpoch() != c.epoch:
		return nil, refusedWith(reasonEpochExpired)
	}
	f.mu.Lock()
	f.lastRecv = f.clock.Now()
	f.recvs = append(f.recvs, f.lastRecv)
	f.renewals++
	if afterQuiet {
		f.quietGranted++
	}
	f.mu.Unlock()
	resp := &waldenv1.RenewLeaseResponse{Epoch: c.epoch, LeaseTtlMs: c.ttl.Milliseconds(), CoordinatorId: f.id, ConfIndex: c.conf,
		RenewInUs: c.renewIn.Microseconds()}
	for _, fc := range c.coords {
		fc.mu.Lock()
		resp.Voters = append(resp.Voters, &waldenv1.Voter{Id: fc.id, AdminAddr: fc.addr, Incarnation: fc.incarnation})
		fc.mu.Unlock()
	}
	return resp, nil
}

// failover fences the broker the way a decision does: a new epoch, fenced,
// and a recovery job running until finishRecovery.
func (c *fakeCluster) failover() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch = c.nextEpoch
	c.nextEpoch++
	c.fenced = true
	c.recoveryRunning = true
}

func (c *fakeCluster) finishRecovery(offset int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recoveryRunning = false
	c.recoveredOffset = offset
}

// intervals are the times between the renewals it granted, from the
// first after skip.
func (f *fakeCoord) intervals(skip int) []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []time.Duration
	for i := skip + 1; i < len(f.recvs); i++ {
		out = append(out, f.recvs[i]-f.recvs[i-1])
	}
	return out
}

func (f *fakeCoord) setHang(h bool) {
	f.mu.Lock()
	f.hang = h
	f.mu.Unlock()
}

// setHang makes the first n coordinators hang (h) or answer.
func (c *fakeCluster) setHang(n int, h bool) {
	for _, fc := range c.coords[:n] {
		fc.setHang(h)
	}
}

type fakeStats struct {
	epoch               uint64
	renewals, registers int
}

func (c *fakeCluster) stats() fakeStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fakeStats{epoch: c.epoch, registers: c.registers}
	for _, fc := range c.coords {
		fc.mu.Lock()
		s.renewals += fc.renewals
		fc.mu.Unlock()
	}
	return s
}

// transport counts the renewal streams opened, the renewals granted on
// them and the RenewLease calls.
func (f *fakeCoord) transport() (streams, streamed, unary int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.streams, f.streamed, f.unary
}

// replace makes f another incarnation of its name, in a new voter
// configuration (a member replaced under its name).
func (c *fakeCluster) replace(f *fakeCoord, incarnation uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conf++
	f.mu.Lock()
	f.incarnation = incarnation
	f.mu.Unlock()
}

// longestStream is the most renewals one of f's streams carried.
func (f *fakeCoord) longestStream() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.longest
}

func (f *fakeCoord) setBreakAfter(n int) {
	f.mu.Lock()
	f.breakAfter = n
	f.mu.Unlock()
}

// setQuiet makes the coordinator refuse every renewal for d, as one that
// restarted waits out its first lease.
func (f *fakeCoord) setQuiet(d time.Duration) {
	f.mu.Lock()
	f.quietUntil = time.Now().Add(d)
	f.mu.Unlock()
}

// quiet returns how many renewals the quiet period refused, its end, and
// how many renewals were granted after it.
func (f *fakeCoord) quiet() (refused int, end time.Time, granted int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.quietRefused, f.quietUntil, f.quietGranted
}

func (f *fakeCoord) setRefuse(reason refusal.Reason) {
	f.mu.Lock()
	f.refuse = reason
	f.mu.Unlock()
}

// setLate makes the next n streamed renewals answered by after they
// arrive.
func (f *fakeCoord) setLate(n int, by time.Duration) {
	f.mu.Lock()
	f.lateN, f.lateBy = n, by
	f.mu.Unlock()
}

// received counts the renewals received (answered or not), the streams
// being served and the late answers sent.
func (f *fakeCoord) received() (attempts, open, lateSent int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts, f.open, f.lateSent
}

func (f *fakeCoord) setNoStream(on bool) {
	f.mu.Lock()
	f.noStream = on
	f.mu.Unlock()
}

func (f *fakeCoord) count() (renewals, hints int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renewals, f.calls
}

// attestAt is the earliest reading of its own clock at which the
// coordinator could attest that its last grant expired.
func (f *fakeCoord) attestAt() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastRecv + f.c.ttl + f.c.drift
}

// closedAddr is a loopback address nobody listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// serveCoordinator serves fc on a free loopback port until the test ends
// or stop is called, as a coordinator serves its admin listener: gRPC,
// and renewals over frames unless fc.noFrames — under TLS (tc, the server
// side of mutual TLS) the connections that negotiate renewframe.ALPN,
// without it those that start with renewframe.Preface.
func serveCoordinator(t testing.TB, fc *fakeCoord, tc *tls.Config) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	waldenv1.RegisterAgentServer(gs, fc)
	toGRPC := &chanListener{addr: ln.Addr(), conns: make(chan net.Conn), done: make(chan struct{})}
	var mu sync.Mutex
	framed := map[net.Conn]bool{}
	serve := func(raw net.Conn) {
		fc.mu.Lock()
		noFrames := fc.noFrames
		fc.mu.Unlock()
		conn, frames := raw, false
		if tc != nil {
			cfg := tc.Clone()
			cfg.NextProtos = []string{"h2"}
			if !noFrames {
				cfg.NextProtos = []string{renewframe.ALPN, "h2"}
			}
			cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
				if slices.Contains(hello.SupportedProtos, renewframe.ALPN) {
					fc.mu.Lock()
					fc.framesAsked++
					fc.mu.Unlock()
				}
				return nil, nil
			}
			tconn := tls.Server(raw, cfg)
			_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
			if err := tconn.Handshake(); err != nil {
				_ = raw.Close()
				return
			}
			_ = raw.SetDeadline(time.Time{})
			conn, frames = tconn, tconn.ConnectionState().NegotiatedProtocol == renewframe.ALPN
		} else {
			c, preface, err := renewframe.Sniff(raw)
			if err != nil {
				_ = raw.Close()
				return
			}
			if preface {
				fc.mu.Lock()
				fc.framesAsked++
				fc.mu.Unlock()
				if noFrames { // an older coordinator: gRPC gets it as it came
					c = &prefacedConn{Conn: c, head: []byte(renewframe.Preface)}
				}
			}
			conn, frames = c, preface && !noFrames
		}
		if !frames {
			select {
			case toGRPC.conns <- conn:
			case <-toGRPC.done:
				_ = conn.Close()
			}
			return
		}
		mu.Lock()
		framed[conn] = true
		mu.Unlock()
		fc.mu.Lock()
		fc.frameConns++
		fc.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		_ = fc.serveRenewals(&frameServer{ctx: ctx, r: renewframe.NewReader(conn, renewframe.MaxRequest), w: renewframe.NewWriter(conn, renewframe.MaxResponse)}, true)
		cancel()
		_ = conn.Close()
		mu.Lock()
		delete(framed, conn)
		mu.Unlock()
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	go func() { _ = gs.Serve(toGRPC) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = ln.Close()
			_ = toGRPC.Close()
			gs.Stop()
			mu.Lock()
			for c := range framed {
				_ = c.Close()
			}
			mu.Unlock()
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// frameServer is the coordinator's side of a connection of frames.
type frameServer struct {
	ctx context.Context
	r   *renewframe.Reader
	w   *renewframe.Writer
}

func (s *frameServer) Recv() (*waldenv1.RenewLeasesRequest, error) {
	m := &waldenv1.RenewLeasesRequest{}
	return m, s.r.Read(m)
}

func (s *frameServer) Send(m *waldenv1.RenewLeasesResponse) error { return s.w.Write(m) }

func (s *frameServer) Context() context.Context { return s.ctx }

// prefacedConn reads head before the rest of its connection.
type prefacedConn struct {
	net.Conn
	head []byte
}

func (c *prefacedConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// chanListener hands the gRPC server the connections sent on conns.
type chanListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

func (f *fakeCoord) setNoFrames(on bool) {
	f.mu.Lock()
	f.noFrames = on
	f.mu.Unlock()
}

func (f *fakeCoord) setRefuseConn(on bool) {
	f.mu.Lock()
	f.refuseConn = on
	f.mu.Unlock()
}

// frames counts the connections that asked for frames, those served with
// frames and the renewals granted on them.
func (f *fakeCoord) frames() (asked, conns, renewals int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.framesAsked, f.frameConns, f.framedRenewals
}
