package server

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"walden/authz"
	"walden/config"
	"walden/connlimit"
	"walden/internal/testutil"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
	"walden/renewframe"
)

// frameClient is a test agent that renews over its own connection
// (package renewframe): one renewal written, its answer read.
type frameClient struct {
	t    *testing.T
	conn net.Conn
	r    *renewframe.Reader
	w    *renewframe.Writer
	seq  uint64
}

func newFrameClient(t *testing.T, conn net.Conn) *frameClient {
	t.Cleanup(func() { conn.Close() })
	return &frameClient{t: t, conn: conn, r: renewframe.NewReader(conn, renewframe.MaxResponse), w: renewframe.NewWriter(conn, renewframe.MaxRequest)}
}

// dialFramesTLS opens a framed connection to addr with the certificate of
// tc, asking for renewframe.ALPN only.
func dialFramesTLS(t *testing.T, addr string, tc config.TLS) (*frameClient, error) {
	t.Helper()
	cfgs, err := mtls.Load(tc)
	if err != nil {
		t.Fatal(err)
	}
	c := cfgs.Client.Clone()
	c.NextProtos, c.ServerName = []string{renewframe.ALPN}, "127.0.0.1"
	d := &net.Dialer{Timeout: testutil.Deadline(5 * time.Second)}
	conn, err := tls.DialWithDialer(d, "tcp", addr, c)
	if err != nil {
		return nil, err
	}
	if p := conn.ConnectionState().NegotiatedProtocol; p != renewframe.ALPN {
		conn.Close()
		return nil, fmt.Errorf("negotiated %q", p)
	}
	return newFrameClient(t, conn), nil
}

// dialFramesPlain opens a framed connection to addr without TLS: it sends
// renewframe.Preface first.
func dialFramesPlain(t *testing.T, addr string) *frameClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, testutil.Deadline(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(renewframe.Preface)); err != nil {
		t.Fatal(err)
	}
	return newFrameClient(t, conn)
}

// renew sends one renewal and reads an answer, which must carry its seq.
func (c *frameClient) renew(broker string, epoch uint64) (*waldenv1.RenewLeasesResponse, error) {
	c.seq++
	_ = c.conn.SetDeadline(time.Now().Add(testutil.Deadline(10 * time.Second)))
	if err := c.w.Write(&waldenv1.RenewLeasesRequest{BrokerId: broker, Epoch: epoch, Seq: c.seq}); err != nil {
		return nil, err
	}
	resp := &waldenv1.RenewLeasesResponse{}
	if err := c.r.Read(resp); err != nil {
		return nil, err
	}
	if resp.GetSeq() != c.seq {
		c.t.Fatalf("answer seq %d, want %d", resp.GetSeq(), c.seq)
	}
	return resp, nil
}

// mustRenew is renew that fails the test on an error.
func (c *frameClient) mustRenew(broker string, epoch uint64) *waldenv1.RenewLeasesResponse {
	c.t.Helper()
	resp, err := c.renew(broker, epoch)
	if err != nil {
		c.t.Fatalf("renewal of %s at %d: %v", broker, epoch, err)
	}
	return resp
}

// closed says whether the server closed the connection: a read ends
// without an answer.
func (c *frameClient) closed() error {
	_ = c.conn.SetReadDeadline(time.Now().Add(testutil.Deadline(10 * time.Second)))
	var b [1]byte
	n, err := c.conn.Read(b[:])
	if n > 0 {
		return fmt.Errorf("read a byte %#x, want the connection closed", b[0])
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errors.New("the connection is still open")
	}
	return nil
}

// grantedOver renews broker at epoch over c until it is granted (a fresh
// member grants nothing in its quiet period) and returns the grant.
func grantedOver(t *testing.T, c *frameClient, broker string, epoch uint64) *waldenv1.RenewLeaseResponse {
	t.Helper()
	var g *waldenv1.RenewLeaseResponse
	testutil.Eventually(t, 10*time.Second, "a framed grant after the quiet period", func() error {
		resp := c.mustRenew(broker, epoch)
		if g = resp.GetGrant(); g == nil {
			// A refusal of the quiet period says when it ends (a lease and
			// its drift margin at most: seconds here).
			if f := resp.GetRefusal(); f.GetMetadata()["cause"] == "starting" {
				ms, err := strconv.ParseInt(f.GetMetadata()["retry_after_ms"], 10, 64)
				if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > 10*time.Second {
					t.Errorf("a quiet period's refusal with retry_after_ms %q: %v", f.GetMetadata()["retry_after_ms"], f)
				}
			}
			return fmt.Errorf("refused: %v", resp.GetRefusal())
		}
		return nil
	})
	return g
}

// startTLSMember starts a single member with TLS (mutate changes its
// config first) and returns it, the test CA, and a gRPC connection of the
// agent of broker b1 once the member serves.
func startTLSMember(t *testing.T, mutate func(*config.Server)) (*Server, testPKI, *grpc.ClientConn) {
	t.Helper()
	p := newTestPKI(t)
	cfg := singleMember(t)
	cfg.TLS = p.Member(t, "c1")
	cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = tFailureTimeout, tLeaseTTL, tDriftMargin
	if mutate != nil {
		mutate(cfg)
	}
	s := startServerTB(t, cfg)
	creds, err := mtls.ClientCreds(p.TLS(t, roleIdentity(authz.RoleAgent)))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.Addrs().Admin, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	waitServing(t, conn)
	return s, p, conn
}

// registerB1 registers broker b1 over conn and returns its epoch.
func registerB1(t *testing.T, conn *grpc.ClientConn) uint64 {
	t.Helper()
	reg, err := waldenv1.NewAgentClient(conn).Register(context.Background(),
		&waldenv1.RegisterRequest{ClusterName: "solo", BrokerId: "b1", AgentAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	return reg.GetEpoch()
}

// TestFramedRenewalsOverMTLS: an agent's framed connection on the admin
// port renews as the stream does (a grant, the voters left out of the
// second answer of the same configuration), while gRPC calls go on on the
// same port; the connection is counted by the listener's limits and as a
// renewal connection, and released when it closes; a renewal for another
// broker than the certificate's is refused PermissionDenied and ends the
// connection.
func TestFramedRenewalsOverMTLS(t *testing.T) {
	s, p, conn := startTLSMember(t, nil)
	ag := waldenv1.NewAgentClient(conn)
	ctx := context.Background()
	epoch := registerB1(t, conn)
	openBefore := s.listeners.Open(connlimit.Admin)
	agentTLS := p.TLS(t, roleIdentity(authz.RoleAgent))
	fc, err := dialFramesTLS(t, s.Addrs().Admin, agentTLS)
	if err != nil {
		t.Fatal(err)
	}
	g := grantedOver(t, fc, "b1", epoch)
	if g.GetEpoch() != epoch || g.GetCoordinatorId() != "c1" || len(g.GetVoters()) != 1 || g.GetVoters()[0].GetId() != "c1" {
		t.Fatalf("first framed grant: %v", g)
	}
	next := fc.mustRenew("b1", epoch).GetGrant()
	if next == nil || len(next.GetVoters()) != 0 || next.GetConfIndex() != g.GetConfIndex() {
		t.Fatalf("second framed grant: %v, want the same configuration without the voters", next)
	}
	if open := s.listeners.Open(connlimit.Admin); open != openBefore+1 {
		t.Fatalf("%v admin connections open with the framed one, want %v", open, openBefore+1)
	}
	if n := s.detector.agent.streams.Load(); n != 1 {
		t.Fatalf("%d renewal connections counted, want 1", n)
	}
	wantRenewalConnections(t, s, 1, 0)
	// gRPC on the same port, at the same time: a call and a stream.
	if _, err := ag.RenewLease(ctx, &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: epoch}); err != nil {
		t.Fatalf("RenewLease beside the framed connection: %v", err)
	}
	st := openRenewalStream(t, conn)
	if sg := st.renew("b1", epoch).GetGrant(); sg == nil {
		t.Fatal("the stream beside the framed connection was refused")
	}
	wantRenewalConnections(t, s, 1, 1)
	if g := fc.mustRenew("b1", epoch).GetGrant(); g == nil {
		t.Fatal("the framed connection was refused beside the stream")
	}

	// Another broker's renewal: refused, and the connection ends.
	f := fc.mustRenew("b2", 1).GetRefusal()
	if f == nil || codes.Code(f.GetCode()) != codes.PermissionDenied {
		t.Fatalf("renewal for b2 on b1's connection: %v, want PermissionDenied", f)
	}
	if err := fc.closed(); err != nil {
		t.Fatalf("after a refused identity: %v", err)
	}
	testutil.EventuallyTrue(t, 10*time.Second, "the framed connection released", func() bool {
		return s.listeners.Open(connlimit.Admin) == openBefore && s.detector.agent.streams.Load() == 1 // the stream
	})
	wantRenewalConnections(t, s, 0, 1)
	if _, err := ag.RenewLease(ctx, &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: epoch}); err != nil {
		t.Fatalf("RenewLease after the framed connection closed: %v", err)
	}
	// A connection served as frames is no failed handshake.
	if n := s.listeners.HandshakeFailures(connlimit.Admin, "other"); n != 0 {
		t.Fatalf("%v handshake failures counted", n)
	}
}

// renewalConnections reads walden_lease_renewal_streams of s by its
// transport label, as a scrape would.
func renewalConnections(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.detector.d.decisions.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "walden_lease_renewal_streams" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "transport" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// wantRenewalConnections checks that s counts frames framed renewal
// connections and stream renewal streams open, each under its transport
// and nothing under another.
func wantRenewalConnections(t *testing.T, s *Server, frames, stream float64) {
	t.Helper()
	want := map[string]float64{config.RenewalsFrames: frames, config.RenewalsStream: stream}
	if got := renewalConnections(t, s); !maps.Equal(got, want) {
		t.Fatalf("walden_lease_renewal_streams by transport: %v, want %v", got, want)
	}
}

// TestFramedRenewalsRefuseOtherRoles: a framed connection with a
// certificate that may not renew (a reader's) gets its first renewal
// refused PermissionDenied and is closed; no renewal is answered.
func TestFramedRenewalsRefuseOtherRoles(t *testing.T) {
	s, p, _ := startTLSMember(t, nil)
	fc, err := dialFramesTLS(t, s.Addrs().Admin, p.TLS(t, roleIdentity(authz.RoleReader)))
	if err != nil {
		t.Fatal(err)
	}
	f := fc.mustRenew("b1", 1).GetRefusal()
	if f == nil || codes.Code(f.GetCode()) != codes.PermissionDenied {
		t.Fatalf("a reader's framed renewal: %v, want PermissionDenied", f)
	}
	if err := fc.closed(); err != nil {
		t.Fatalf("after a reader's renewal: %v", err)
	}
	// An intruder's certificate (another CA) is refused by the handshake.
	intruder := config.TLS{CAFile: p.CA, CertFile: p.OtherCert, KeyFile: p.OtherKey}
	if fc, err := dialFramesTLS(t, s.Addrs().Admin, intruder); err == nil {
		if _, err := fc.renew("b1", 1); err == nil {
			t.Fatal("an intruder's framed renewal was answered")
		}
	}
}

// TestBadFramesCloseTheConnection: a frame above the limit, bytes that are
// not a renewal, or a frame cut short close that connection only; the
// member goes on serving framed renewals and gRPC.
func TestBadFramesCloseTheConnection(t *testing.T) {
	s, p, conn := startTLSMember(t, nil)
	epoch := registerB1(t, conn)
	agentTLS := p.TLS(t, roleIdentity(authz.RoleAgent))
	good, err := dialFramesTLS(t, s.Addrs().Admin, agentTLS)
	if err != nil {
		t.Fatal(err)
	}
	grantedOver(t, good, "b1", epoch)
	header := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	for _, bad := range []struct {
		name  string
		bytes []byte
		close bool // the client closes its side after writing
	}{
		{"too large", header(renewframe.MaxRequest + 1), false},
		{"not a message", append(header(3), 0xff, 0xff, 0xff), false},
		{"cut short", append(header(10), 1, 2), true},
	} {
		fc, err := dialFramesTLS(t, s.Addrs().Admin, agentTLS)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fc.conn.Write(bad.bytes); err != nil {
			t.Fatal(err)
		}
		if bad.close {
			_ = fc.conn.(*tls.Conn).CloseWrite()
		}
		if err := fc.closed(); err != nil {
			t.Fatalf("%s: %v", bad.name, err)
		}
		if g := good.mustRenew("b1", epoch).GetGrant(); g == nil {
			t.Fatalf("after a frame %s, the good connection was refused", bad.name)
		}
	}
	waitServing(t, conn)
	testutil.EventuallyTrue(t, 10*time.Second, "only the good framed connection counted", func() bool {
		return s.detector.agent.streams.Load() == 1
	})
}

// TestFramedRenewalsWithoutTLS: without TLS a connection that opens with
// renewframe.Preface renews over frames, and gRPC is served on the same
// port.
func TestFramedRenewalsWithoutTLS(t *testing.T) {
	cfg := singleMember(t)
	cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = tFailureTimeout, tLeaseTTL, tDriftMargin
	s, conn := startServing(t, cfg)
	epoch := registerB1(t, conn)
	fc := dialFramesPlain(t, s.Addrs().Admin)
	g := grantedOver(t, fc, "b1", epoch)
	if next := fc.mustRenew("b1", epoch).GetGrant(); next == nil || len(next.GetVoters()) != 0 || next.GetConfIndex() != g.GetConfIndex() {
		t.Fatalf("second framed grant: %v", next)
	}
	// Without TLS nothing is checked: another broker's renewal is answered
	// as on gRPC (here, unknown broker), and the connection stays.
	if f := fc.mustRenew("b9", 1).GetRefusal(); f == nil || codes.Code(f.GetCode()) != codes.NotFound {
		t.Fatalf("renewal of an unknown broker: %v", f)
	}
	// A new gRPC connection is served beside it.
	c2, err := grpc.NewClient(s.Addrs().Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitServing(t, c2)
	if _, err := waldenv1.NewAgentClient(c2).RenewLease(context.Background(), &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: epoch}); err != nil {
		t.Fatalf("RenewLease beside the framed connection: %v", err)
	}
	if g := fc.mustRenew("b1", epoch).GetGrant(); g == nil {
		t.Fatal("the framed connection was refused after the gRPC call")
	}
}

// TestServerStopClosesFramedConnections: a member stops promptly with
// framed connections open (gRPC's stop waits for the goroutines that
// serve them), and closes them.
func TestServerStopClosesFramedConnections(t *testing.T) {
	s, p, conn := startTLSMember(t, nil)
	epoch := registerB1(t, conn)
	var fcs []*frameClient
	for range 3 {
		fc, err := dialFramesTLS(t, s.Addrs().Admin, p.TLS(t, roleIdentity(authz.RoleAgent)))
		if err != nil {
			t.Fatal(err)
		}
		grantedOver(t, fc, "b1", epoch)
		fcs = append(fcs, fc)
	}
	start := time.Now()
	stopServerTB(s) // fails the test when Run does not return within 10s
	took := time.Since(start)
	if took > testutil.Deadline(stopGrace) {
		t.Errorf("the member took %v to stop with framed connections open", took)
	}
	for i, fc := range fcs {
		if err := fc.closed(); err != nil {
			t.Errorf("framed connection %d after the stop: %v", i, err)
		}
	}
	if n := s.frames.open(); n != 0 {
		t.Errorf("%d framed connections left open", n)
	}
}

// TestRenewalFramesClosedAtOnceAfterClose: a connection that dispatches
// after the member began to stop is closed at once.
func TestRenewalFramesClosedAtOnceAfterClose(t *testing.T) {
	f := newRenewalFrames(&authz.Authorizer{}, 0, slog.New(slog.DiscardHandler))
	f.close()
	a, b := net.Pipe()
	defer a.Close()
	done := make(chan struct{})
	go func() { f.serve(b, nil); close(done) }()
	select {
	case <-done:
	case <-time.After(testutil.Deadline(5 * time.Second)):
		t.Fatal("serve after close did not return")
	}
	_ = a.SetReadDeadline(time.Now().Add(testutil.Deadline(5 * time.Second)))
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read from a connection dispatched after close: %v, want EOF", err)
	}
}

// TestRenewalFramesOff: with renewals.frames false a member offers no
// framed renewals: under TLS a handshake that asks for renewframe.ALPN
// only fails (the agent renews over gRPC), and without TLS a connection
// that opens with renewframe.Preface is gRPC's, which refuses it; gRPC
// is served as before.
func TestRenewalFramesOff(t *testing.T) {
	off := func(c *config.Server) { c.Renewals.Frames = false }
	s, p, conn := startTLSMember(t, off)
	epoch := registerB1(t, conn)
	if fc, err := dialFramesTLS(t, s.Addrs().Admin, p.TLS(t, roleIdentity(authz.RoleAgent))); err == nil {
		resp, err := fc.renew("b1", epoch)
		t.Fatalf("a handshake asking for %s only succeeded with frames off: %v, %v", renewframe.ALPN, resp, err)
	}
	grantLease(t, context.Background(), "b1", epoch, conn)

	cfg := singleMember(t)
	off(cfg)
	plain, pconn := startServing(t, cfg)
	epoch = registerB1(t, pconn)
	fc := dialFramesPlain(t, plain.Addrs().Admin)
	if resp, err := fc.renew("b1", epoch); err == nil && (resp.GetGrant() != nil || resp.GetRefusal() != nil) {
		t.Fatalf("a preface connection was answered with frames off: %v", resp)
	}
	if plain.frames != nil || plain.detector.agent.streams.Load() != 0 {
		t.Fatal("framed renewals served with frames off")
	}
	grantLease(t, context.Background(), "b1", epoch, pconn)
}

// TestIdleFramedConnectionCloses: a framed connection that sends nothing
// for the admin listener's max_connection_idle is closed and released.
func TestIdleFramedConnectionCloses(t *testing.T) {
	cfg := singleMember(t)
	cfg.Limits.Admin.MaxConnectionIdle = time.Second
	s, conn := startServing(t, cfg)
	epoch := registerB1(t, conn)
	fc := dialFramesPlain(t, s.Addrs().Admin)
	if resp := fc.mustRenew("b1", epoch); resp.GetGrant() == nil && resp.GetRefusal() == nil {
		t.Fatalf("empty answer: %v", resp)
	}
	if err := fc.closed(); err != nil {
		t.Fatalf("an idle framed connection: %v", err)
	}
	testutil.EventuallyTrue(t, 10*time.Second, "the idle connection released", func() bool { return s.frames.open() == 0 })
}
