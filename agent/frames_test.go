package agent

import (
	"context"
	"crypto/tls"
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
