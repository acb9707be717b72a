package connlimit_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"walden/connlimit"
	"walden/internal/testutil/testpki"
	"walden/mtls"
)

// dialFrom opens a TCP connection to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// closedByServer reports whether the server closed c (a read returns at
// once with EOF or a reset instead of timing out).
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	var b [1]byte
	_, err := c.Read(b[:])
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

// TestPerSourceAndTotalCaps: one source address holds at most
// max_conns_per_source connections (the next are closed at once and
// counted), another source still gets in, and once max_conns are open the
// listener accepts no more until one closes.
func TestPerSourceAndTotalCaps(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := connlimit.NewMetrics()
	bl := m.Listener(ln, "test", 6, 4)
	defer bl.Close()
	var mu sync.Mutex
	var accepted []net.Conn
	go func() {
		for {
			c, err := bl.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c)
			mu.Unlock()
		}
	}()
	addr := ln.Addr().String()
	var flood []net.Conn
	for range 10 {
		flood = append(flood, dialFrom(t, "127.0.0.2", addr))
	}
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	closed := 0
	for _, c := range flood {
		if closedByServer(c, 200*time.Millisecond) {
			closed++
		}
	}
	if closed != 6 || m.Refused("test", "max_conns_per_source") != 6 || m.Open("test") != 4 {
		t.Fatalf("10 connections from one source: %d closed, %v refused, %v open; want 6, 6, 4", closed, m.Refused("test", "max_conns_per_source"), m.Open("test"))
	}
	// Another source: two more fit (6 in all), the third waits.
	var other []net.Conn
	for range 3 {
		other = append(other, dialFrom(t, "127.0.0.3", addr))
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.Open("test") < 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if m.Open("test") != 6 {
		t.Fatalf("open %v, want max_conns 6", m.Open("test"))
	}
	// One closes: the waiting one gets in.
	mu.Lock()
	accepted[0].Close()
	mu.Unlock()
	for m.Open("test") < 6 || len(snapshot(&mu, &accepted)) < 7 {
		if time.Now().After(deadline) {
			t.Fatalf("the waiting connection was not accepted after one closed: open %v", m.Open("test"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range other {
		c.Close()
	}
}

func snapshot(mu *sync.Mutex, cs *[]net.Conn) []net.Conn {
	mu.Lock()
	defer mu.Unlock()
	return append([]net.Conn(nil), *cs...)
}

// TestHandshakeTimeout: a connection that never starts its TLS handshake
// is closed after handshake_timeout and counted; a client with a
// certificate is served meanwhile.
func TestHandshakeTimeout(t *testing.T) {
	pki := testpki.New(t)
	sm, err := mtls.Load(pki.Member(t, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	cm, err := mtls.Load(pki.Admin(t))
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, clientTLS := sm.Server, cm.Client
	m := connlimit.NewMetrics()
	g := connlimit.Defaults(connlimit.Admin)
	g.HandshakeTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(m.ServerOptions("admin", g), grpc.Creds(m.Creds("admin", credentials.NewTLS(serverTLS), nil)))...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(m.Listener(ln, "admin", g.MaxConns, g.MaxConnsPerSource)) }()
	defer srv.Stop()
	idle := dialFrom(t, "127.0.0.2", ln.Addr().String())
	defer idle.Close()
	start := time.Now()
	if !closedByServer(idle, 10*time.Second) {
		t.Fatal("an idle connection was not closed")
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Fatalf("closed after %s, before handshake_timeout", took)
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.HandshakeFailures("admin", "timeout") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the timed-out handshake was not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestValidateNamesTheKey: every key out of bounds is refused naming it.
func TestValidateNamesTheKey(t *testing.T) {
	for key, edit := range map[string]func(*connlimit.GRPC){
		"max_conns":              func(g *connlimit.GRPC) { g.MaxConns = 0 },
		"max_conns_per_source":   func(g *connlimit.GRPC) { g.MaxConnsPerSource = g.MaxConns + 1 },
		"handshake_timeout":      func(g *connlimit.GRPC) { g.HandshakeTimeout = time.Hour },
		"max_concurrent_streams": func(g *connlimit.GRPC) { g.MaxConcurrentStreams = 0 },
		"keepalive_min_time":     func(g *connlimit.GRPC) { g.KeepaliveMinTime = time.Millisecond },
		"max_connection_idle":    func(g *connlimit.GRPC) { g.MaxConnectionIdle = time.Millisecond },
	} {
		g := connlimit.Defaults(connlimit.Admin)
		edit(&g)
		if err := g.Validate(); err == nil || !strings.HasPrefix(err.Error(), key+": ") {
			t.Errorf("%s: %v", key, err)
		}
	}
	for _, l := range []string{connlimit.Admin, connlimit.Raft, connlimit.BrokerAPI} {
		if err := connlimit.Defaults(l).Validate(); err != nil {
			t.Errorf("defaults of %s: %v", l, err)
		}
	}
}
