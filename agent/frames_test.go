package agent

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/config"
	"walden/internal/testutil"
	"walden/internal/testutil/testpki"
	"walden/lease"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
	"walden/renewframe"
)

// TestRenewsOverFramesWithTLS: under mutual TLS the connection of frames
// asks for their application protocol, presents the agent's certificate
// and checks the coordinator's, and carries the renewals.
func TestRenewsOverFramesWithTLS(t *testing.T) {
	p := testpki.New(t)
	server, err := mtls.Load(p.Member(t, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	c := &fakeCluster{ttl: testTTL, drift: testDrift, nextEpoch: 1, recoveredOffset: -1, conf: 1}
	fc := &fakeCoord{c: c, id: "c1", clock: lease.BootClock}
	c.coords = []*fakeCoord{fc}
	fc.addr, fc.stop = serveCoordinator(t, fc, server.Server)
	cfg := testConfig(fc.addr)
	cfg.Renewals.Transport = config.RenewalsAuto
	cfg.TLS = p.TLS(t, authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"})
	a := startAgent(t, cfg, Options{})
	waitRegistered(t, a)
	testutil.Eventually(t, 10*time.Second, "three renewals over frames", func() error {
		if _, _, n := fc.frames(); n < 3 {
			return errorf("%d", n)
		}
		return nil
	})
	if streams, _, unary := fc.transport(); streams != 0 || unary != 0 {
		t.Fatalf("%d streams, %d calls beside frames", streams, unary)
	}
}

// renewerOf is a Renewer of fc over transport, plain or under TLS
// (agentTLS, the agent's side of mutual TLS), with its gRPC connection;
// calls counts the times it asked for the gRPC connection.
func renewerOf(t *testing.T, fc *fakeCoord, transport string, agentTLS *tls.Config, calls *int) *Renewer {
	t.Helper()
	creds := mtls.Creds(agentTLS)
	if agentTLS == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(fc.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r := NewRenewer(RenewerOptions{Conn: func() (*grpc.ClientConn, error) {
		if calls != nil {
			*calls++
		}
		return conn, nil
	}, Addr: fc.addr, TLS: renewalTLS(nil, agentTLS), Transport: transport})
	t.Cleanup(r.Close)
	return r
}

// oneCoordinator is a cluster of one coordinator, the broker b1
// registered with epoch 1, served under TLS when server is set.
func oneCoordinator(t *testing.T, server *tls.Config) *fakeCoord {
	t.Helper()
	c := &fakeCluster{ttl: testTTL, drift: testDrift, nextEpoch: 2, epoch: 1, recoveredOffset: -1, conf: 1}
	fc := &fakeCoord{c: c, id: "c1", clock: lease.BootClock}
	c.coords = []*fakeCoord{fc}
	fc.addr, fc.stop = serveCoordinator(t, fc, server)
	return fc
}

var renewB1 = &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: 1}

func mustRenew(t *testing.T, r *Renewer) {
	t.Helper()
	if _, err := r.Renew(context.Background(), renewB1, testutil.Deadline(5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestFallsBackFromFrames: a coordinator that does not serve frames —
// under TLS it refuses the handshake that asks for their application
// protocol only (it offers h2), without TLS gRPC closes the connection
// that starts with the preface — costs no attempt: the renewal goes over
// the gRPC stream, and so do the next ones, without asking for frames
// again, until streamRetry has passed; then frames are tried again, and
// taken once the coordinator serves them.
func TestFallsBackFromFrames(t *testing.T) {
	p := testpki.New(t)
	server, err := mtls.Load(p.Member(t, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	agentSide, err := mtls.Load(p.TLS(t, authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"tls", "plain"} {
		t.Run(mode, func(t *testing.T) {
			var serverTLS, clientTLS *tls.Config
			if mode == "tls" {
				serverTLS, clientTLS = server.Server, agentSide.Client
			}
			fc := oneCoordinator(t, serverTLS)
			fc.setNoFrames(true)
			r := renewerOf(t, fc, config.RenewalsAuto, clientTLS, nil)
			mustRenew(t, r)
			mustRenew(t, r)
			if asked, conns, _ := fc.frames(); asked != 1 || conns != 0 {
				t.Fatalf("frames asked for %d times, served %d: want asked once, then the stream", asked, conns)
			}
			if streams, streamed, unary := fc.transport(); streams != 1 || streamed != 2 || unary != 0 {
				t.Fatalf("%d streams, %d renewals on them, %d calls: want both renewals on one stream", streams, streamed, unary)
			}
			r.framesUntil = time.Time{} // streamRetry has passed
			mustRenew(t, r)
			if asked, _, _ := fc.frames(); asked != 2 {
				t.Fatalf("frames asked for %d times after streamRetry, want again", asked)
			}
			fc.setNoFrames(false) // upgraded
			r.framesUntil = time.Time{}
			mustRenew(t, r)
			mustRenew(t, r)
			if _, conns, framed := fc.frames(); conns != 1 || framed != 2 {
				t.Fatalf("after the upgrade: %d connections of frames, %d renewals on them, want 2 on one", conns, framed)
			}
			testutil.Eventually(t, 10*time.Second, "the stream closed", func() error {
				if _, open, _ := fc.received(); open != 1 {
					return errorf("%d streams and connections open, want the connection of frames only", open)
				}
				return nil
			})
		})
	}
}

// TestDialFailureIsNotAFallback: a coordinator that cannot be reached is
// an ordinary failed attempt, not one that does not serve frames: no
// stream is tried, and the next attempt tries frames again.
func TestDialFailureIsNotAFallback(t *testing.T) {
	fc := &fakeCoord{id: "c1", addr: closedAddr(t)}
	var conns int
	r := renewerOf(t, fc, config.RenewalsAuto, nil, &conns)
	for range 2 {
		_, err := r.Renew(context.Background(), renewB1, testutil.Deadline(time.Second))
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			t.Fatalf("renewal with an unreachable coordinator: %v", err)
		}
		if !r.framesUntil.IsZero() || conns != 0 {
			t.Fatalf("an unreachable coordinator taken for one without frames (gRPC asked %d times)", conns)
		}
	}
}

// TestTransportSettingPins: renewals.transport stream and call renew
// over the gRPC stream or with calls even with a coordinator that serves
// frames; frames never falls back, and fails with Unimplemented against a
// coordinator without them.
func TestTransportSettingPins(t *testing.T) {
	fc := oneCoordinator(t, nil)
	for _, transport := range []string{config.RenewalsStream, config.RenewalsCall} {
		r := renewerOf(t, fc, transport, nil, nil)
		mustRenew(t, r)
		mustRenew(t, r)
		r.Close()
	}
	asked, _, _ := fc.frames()
	streams, streamed, unary := fc.transport()
	if asked != 0 || streams != 1 || streamed != 2 || unary != 2 {
		t.Fatalf("frames asked for %d times, %d streams with %d renewals, %d calls: want 2 on one stream, then 2 calls", asked, streams, streamed, unary)
	}
	fc.setNoFrames(true)
	r := renewerOf(t, fc, config.RenewalsFrames, nil, nil)
	if _, err := r.Renew(context.Background(), renewB1, testutil.Deadline(5*time.Second)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("frames pinned against a coordinator without them: %v, want Unimplemented", err)
	}
	if streams2, _, unary2 := fc.transport(); streams2 != streams || unary2 != unary {
		t.Fatalf("frames pinned fell back: %d streams, %d calls", streams2, unary2)
	}
}

// TestAgentTransportSetting: the agent renews as renewals.transport says.
func TestAgentTransportSetting(t *testing.T) {
	c := newFakeCluster(t, 1, testTTL, testDrift, nil)
	cfg := testConfig(c.addrs()...)
	cfg.Renewals.Transport = config.RenewalsCall
	a := startAgent(t, cfg, Options{})
	waitRegistered(t, a)
	fc := c.coords[0]
	testutil.Eventually(t, 10*time.Second, "three calls", func() error {
		if _, _, unary := fc.transport(); unary < 3 {
			return errorf("%d", unary)
		}
		return nil
	})
	if asked, _, _ := fc.frames(); asked != 0 {
		t.Fatalf("frames asked for %d times with renewals.transport: call", asked)
	}
	if streams, _, _ := fc.transport(); streams != 0 {
		t.Fatalf("%d streams with renewals.transport: call", streams)
	}
}

// TestRefusedConnectionOfFrames: a coordinator that refuses a renewal
// and ends the connection (an identity it does not take) is answered
// with its refusal, every time, not with the end of the connection.
func TestRefusedConnectionOfFrames(t *testing.T) {
	fc := oneCoordinator(t, nil)
	fc.setRefuseConn(true)
	r := renewerOf(t, fc, config.RenewalsAuto, nil, nil)
	for range 20 {
		_, err := r.Renew(context.Background(), renewB1, testutil.Deadline(5*time.Second))
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("a refused renewal: %v, want PermissionDenied", err)
		}
	}
	if _, conns, _ := fc.frames(); conns != 20 || !r.framesUntil.IsZero() {
		t.Fatalf("%d connections of frames for 20 refused renewals (fell back: %v)", conns, !r.framesUntil.IsZero())
	}
}

// TestFramesTakeReloadedCertificates: the connections of frames read the
// TLS configuration at every new connection, so that certificates read
// again (SIGHUP: Options.TLS returns the current ones) are presented from
// the next connection on, as the gRPC connections' reloading credentials
// do. An agent whose certificate the coordinator refuses renews once its
// configuration names one it takes, with the same Renewer.
func TestFramesTakeReloadedCertificates(t *testing.T) {
	p := testpki.New(t)
	server, err := mtls.Load(p.Member(t, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	good, err := mtls.Load(p.TLS(t, authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"}))
	if err != nil {
		t.Fatal(err)
	}
	// A certificate of another CA, as one that expired or was replaced
	// would be refused: the coordinator does not take it.
	other := testpki.New(t)
	stale, err := mtls.Load(other.TLS(t, authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"}))
	if err != nil {
		t.Fatal(err)
	}
	staleClient := stale.Client.Clone()
	staleClient.RootCAs = good.Client.RootCAs // it trusts the coordinator; the coordinator does not trust it
	fc := oneCoordinator(t, server.Server)
	var current atomic.Pointer[tls.Config]
	current.Store(staleClient)
	conn, err := grpc.NewClient(fc.addr, grpc.WithTransportCredentials(mtls.Creds(good.Client)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := NewRenewer(RenewerOptions{Conn: func() (*grpc.ClientConn, error) { return conn, nil }, Addr: fc.addr,
		TLS: func() *tls.Config { return current.Load() }, Transport: config.RenewalsFrames})
	t.Cleanup(r.Close)
	if _, err := r.Renew(context.Background(), renewB1, testutil.Deadline(5*time.Second)); err == nil {
		t.Fatal("renewed with a certificate the coordinator does not trust")
	}
	current.Store(good.Client) // the certificates were read again
	mustRenew(t, r)
	if _, conns, framed := fc.frames(); conns != 1 || framed != 1 {
		t.Fatalf("%d connections of frames served, %d renewals on them: want the renewal on the one made with the new certificate", conns, framed)
	}
}

// frameListener listens on a free loopback port as a coordinator without
// TLS, and hands every connection that opens with renewframe.Preface, the
// preface read, to its serve (which returns when done or when the
// connection is closed; the connection is closed then). It closes the
// others, such as the gRPC connection of a Renewer that fell back.
// prefaces counts the connections that opened with the preface, others
// the rest.
type frameListener struct {
	addr             string
	prefaces, others atomic.Int32
}

func listenFrames(t *testing.T, serve func(net.Conn)) *frameListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &frameListener{addr: ln.Addr().String()}
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				b := make([]byte, len(renewframe.Preface))
				_ = c.SetReadDeadline(time.Now().Add(testutil.Deadline(10 * time.Second)))
				if _, err := io.ReadFull(c, b); err != nil || string(b) != renewframe.Preface {
					l.others.Add(1)
					return
				}
				_ = c.SetReadDeadline(time.Time{})
				l.prefaces.Add(1)
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l
}

// plainRenewer is a Renewer of the coordinator at addr without TLS over
// transport, its connections of frames opened by dial (nil: the default);
// calls counts the times it asked for its gRPC connection (a fallback).
func plainRenewer(t *testing.T, addr, transport string, dial func(context.Context, string) (net.Conn, error), calls *atomic.Int32) *Renewer {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r := NewRenewer(RenewerOptions{Conn: func() (*grpc.ClientConn, error) {
		calls.Add(1)
		return conn, nil
	}, Addr: addr, Dial: dial, Transport: transport})
	t.Cleanup(r.Close)
	return r
}

// closedHere is a connection closed on the agent's side while its first
// answer is awaited, as a connection that Options.Dial wraps closes
// itself when one of its own writes, delayed, fails: its reads end with
// net.ErrClosed.
type closedHere struct{ net.Conn }

func (c closedHere) Read(b []byte) (int, error) {
	_ = c.Conn.Close()
	return c.Conn.Read(b)
}

// TestUnansweredConnectionIsNotAFallback: without TLS, a new connection
// of frames that fails before its first answer on the agent's side — no
// answer in time, a read deadline, the connection closed here — is an
// ordinary failed attempt (DeadlineExceeded or Unavailable), not a
// coordinator that does not serve frames: the Renewer does not fall back
// to the gRPC stream, and with renewals.transport frames it does not fail
// with Unimplemented; the next attempt opens a connection of frames
// again. The coordinator here reads everything and answers nothing, as
// one whose answers are lost.
func TestUnansweredConnectionIsNotAFallback(t *testing.T) {
	var d net.Dialer
	cases := []struct {
		name string
		dial func(ctx context.Context, addr string) (net.Conn, error)
		// perTry bounds each attempt, attempts of which fail before the
		// next one opens a new connection; want is their code.
		perTry   time.Duration
		attempts int
		want     codes.Code
	}{
		// The Renewer gives up on the answer after perTry, and closes
		// the connection after unansweredLimit attempts (the error its
		// close ends the receiver with must not be taken for the
		// coordinator's).
		{"no answer in time", nil, 100 * time.Millisecond, unansweredLimit, codes.DeadlineExceeded},
		{"read deadline", func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			}
			return c, err
		}, testutil.Deadline(5 * time.Second), 1, codes.DeadlineExceeded},
		{"closed on the agent's side", func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return closedHere{c}, nil
		}, testutil.Deadline(5 * time.Second), 1, codes.Unavailable},
	}
	for _, tc := range cases {
		for _, transport := range []string{config.RenewalsAuto, config.RenewalsFrames} {
			t.Run(tc.name+"/"+transport, func(t *testing.T) {
				l := listenFrames(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
				var calls atomic.Int32
				r := plainRenewer(t, l.addr, transport, tc.dial, &calls)
				for i := range tc.attempts {
					_, err := r.Renew(context.Background(), renewB1, tc.perTry)
					if code := status.Code(err); code != tc.want {
						t.Fatalf("attempt %d: %v, want %v", i+1, err, tc.want)
					}
				}
				if !r.framesUntil.IsZero() || calls.Load() != 0 {
					t.Fatalf("taken for a coordinator without frames (gRPC asked for %d times)", calls.Load())
				}
				_, err := r.Renew(context.Background(), renewB1, tc.perTry)
				if code := status.Code(err); code != tc.want {
					t.Fatalf("the attempt after: %v, want %v", err, tc.want)
				}
				testutil.Eventually(t, 10*time.Second, "a second connection of frames", func() error {
					if n := l.prefaces.Load(); n < 2 {
						return errorf("%d opened with the preface", n)
					}
					return nil
				})
				if n := l.others.Load(); n != 0 || calls.Load() != 0 || !r.framesUntil.IsZero() {
					t.Fatalf("fell back: %d other connections, gRPC asked for %d times", n, calls.Load())
				}
			})
		}
	}
}

// TestPeerEndingIsAFallback: without TLS, a coordinator that ends a new
// connection of frames before its first answer, or sends what is not an
// answer, is one that does not serve frames: the Renewer falls back to the
// gRPC stream (renewals.transport auto), or fails with Unimplemented
// (frames).
func TestPeerEndingIsAFallback(t *testing.T) {
	cases := []struct {
		name  string
		serve func(net.Conn)
	}{
		{"ends the connection", func(c net.Conn) {
			// The renewal read whole: the close ends the connection
			// (io.EOF), it does not reset it.
			_ = renewframe.NewReader(c, renewframe.MaxRequest).Read(&waldenv1.RenewLeasesRequest{})
		}},
		{"ends the connection inside a frame", func(c net.Conn) {
			_ = renewframe.NewReader(c, renewframe.MaxRequest).Read(&waldenv1.RenewLeasesRequest{})
			_, _ = c.Write([]byte{0, 0, 0, 10, 0})
		}},
		{"resets the connection", func(c net.Conn) {
			// After the renewal, so that the agent's read, not its
			// write, meets the reset (ECONNRESET).
			_ = renewframe.NewReader(c, renewframe.MaxRequest).Read(&waldenv1.RenewLeasesRequest{})
			_ = c.(*net.TCPConn).SetLinger(0)
		}},
		{"sends a frame too large", func(c net.Conn) {
			_, _ = c.Write([]byte{0xff, 0xff, 0xff, 0xff})
			_, _ = io.Copy(io.Discard, c)
		}},
		{"sends a frame that is no answer", func(c net.Conn) {
			_, _ = c.Write([]byte{0, 0, 0, 2, 0xff, 0xff})
			_, _ = io.Copy(io.Discard, c)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := listenFrames(t, tc.serve)
			var calls atomic.Int32
			r := plainRenewer(t, l.addr, config.RenewalsFrames, nil, &calls)
			if _, err := r.Renew(context.Background(), renewB1, testutil.Deadline(5*time.Second)); status.Code(err) != codes.Unimplemented {
				t.Fatalf("frames pinned: %v, want Unimplemented", err)
			}
			r = plainRenewer(t, l.addr, config.RenewalsAuto, nil, &calls)
			_, _ = r.Renew(context.Background(), renewB1, testutil.Deadline(2*time.Second)) // the listener serves no gRPC
			if r.framesUntil.IsZero() || calls.Load() == 0 {
				t.Fatalf("not taken for a coordinator without frames (gRPC asked for %d times)", calls.Load())
			}
		})
	}
}

// TestFallsBackFromAnOlderGRPCServer: a coordinator of an older walden
// without TLS is a gRPC server that does not look for renewframe.Preface:
// it writes its HTTP/2 settings, finds no HTTP/2 preface in what the agent
// sent, and closes the connection (resetting it: the renewal is not all
// read). The Renewer renews with it over the gRPC stream in the same
// attempt, and fails with Unimplemented with renewals.transport frames.
func TestFallsBackFromAnOlderGRPCServer(t *testing.T) {
	c := &fakeCluster{ttl: testTTL, drift: testDrift, nextEpoch: 2, epoch: 1, recoveredOffset: -1, conf: 1}
	fc := &fakeCoord{c: c, id: "c1", clock: lease.BootClock}
	c.coords = []*fakeCoord{fc}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	waldenv1.RegisterAgentServer(gs, fc)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	fc.addr = ln.Addr().String()
	r := renewerOf(t, fc, config.RenewalsAuto, nil, nil)
	mustRenew(t, r)
	mustRenew(t, r)
	if r.framesUntil.IsZero() {
		t.Fatal("an older walden's gRPC server not taken for a coordinator without frames")
	}
	if streams, streamed, unary := fc.transport(); streams != 1 || streamed != 2 || unary != 0 {
		t.Fatalf("%d streams, %d renewals on them, %d calls: want both renewals on one stream", streams, streamed, unary)
	}
	r = renewerOf(t, fc, config.RenewalsFrames, nil, nil)
	if _, err := r.Renew(context.Background(), renewB1, testutil.Deadline(5*time.Second)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("frames pinned against an older walden: %v, want Unimplemented", err)
	}
}
