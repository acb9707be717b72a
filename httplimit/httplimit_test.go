package httplimit

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// serve starts a bounded server and counts its open connections.
func serve(t *testing.T, l Limits) (addr string, open, peak *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }), l, nil)
	cl := &countingListener{Listener: Listener(ln, l), open: new(atomic.Int64), peak: new(atomic.Int64)}
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), cl.open, cl.peak
}

// countingListener counts the connections the server holds: one more at
// each Accept, one less when the server starts closing it (before the
// limit frees its slot for the next Accept).
type countingListener struct {
	net.Listener
	open, peak *atomic.Int64
	mu         sync.Mutex
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if n := l.open.Add(1); n > l.peak.Load() {
		l.peak.Store(n)
	}
	l.mu.Unlock()
	return &countedConn{Conn: c, open: l.open}, nil
}

type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// get sends one request on c and reads the status line.
func get(c net.Conn, extra string) (string, error) {
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n%s\r\n", extra); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// TestIdleConnectionFlood is the HTTP row of the hardening table: a flood
// of idle keep-alive connections holds at most MaxConns of them open (a
// process's file descriptors are not exhausted), idle ones are closed after
// IdleTimeout, and a real request is served once a slot frees up.
func TestIdleConnectionFlood(t *testing.T) {
	addr, open, peak := serve(t, Limits{MaxConns: 16, IdleTimeout: 300 * time.Millisecond, ReadHeaderTimeout: 200 * time.Millisecond})
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 200 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, c)
	}
	// The first 16 are accepted; the rest wait in the kernel's queue.
	for _, c := range flood[:16] {
		if line, err := get(c, ""); err != nil || line != "HTTP/1.1 200 OK" {
			t.Fatalf("first connections: %q %v", line, err)
		}
	}
	if p := peak.Load(); p > 16 {
		t.Fatalf("%d connections open at once, limit 16", p)
	}
	// Idle connections close after IdleTimeout (silent ones after
	// ReadHeaderTimeout), so the queue drains and a new client is served,
	// while never more than 16 are open.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if line, err := get(c, ""); err != nil || line != "HTTP/1.1 200 OK" {
		t.Fatalf("a client after the flood: %q %v", line, err)
	}
	if p := peak.Load(); p > 16 {
		t.Fatalf("%d connections open at once, limit 16", p)
	}
	t.Logf("open now %d, peak %d of 16, with 201 clients", open.Load(), peak.Load())
}

// TestHeaderLimits: headers over MaxHeaderBytes get 431; a client that
// trickles its headers is cut off after ReadHeaderTimeout.
func TestHeaderLimits(t *testing.T) {
	addr, _, _ := serve(t, Limits{MaxHeaderBytes: 1 << 10, ReadHeaderTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	line, err := get(c, "X-Big: "+strings.Repeat("a", 64<<10)+"\r\n")
	if err != nil || line != "HTTP/1.1 431 Request Header Fields Too Large" {
		t.Fatalf("big header: %q %v", line, err)
	}

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprint(slow, "GET / HTTP/1.1\r\nHost: x\r\n") // and never the end
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(slow)
	if err != nil {
		t.Fatalf("a trickling client was not cut off: %v (%q)", err, b)
	}
}

func TestDefaults(t *testing.T) {
	s := Server(http.NotFoundHandler(), Limits{}, nil)
	if s.ReadHeaderTimeout != DefaultReadHeaderTimeout || s.IdleTimeout != DefaultIdleTimeout || s.MaxHeaderBytes != DefaultMaxHeaderBytes || s.ReadTimeout != DefaultReadTimeout {
		t.Fatalf("defaults %+v", s)
	}
}
