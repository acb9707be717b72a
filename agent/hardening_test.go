package agent

import (
	"net"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"

	"walden/httplimit"
)

// openFDs counts this process's open file descriptors (Linux).
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(es)
}

// TestHardeningIdleConnectionFlood: 600 idle connections to the agent's
// endpoint cost it at most MaxConns file descriptors (it accepted every one
// of 20,000 before and ran out), and it answers /healthz again once they
// are gone; its HTTP server has every limit of DefaultHTTPLimits.
func TestHardeningIdleConnectionFlood(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	c := newFakeCluster(t, 1, testTTL, testDrift, nil)
	lim := httplimit.Limits{MaxConns: 64, ReadHeaderTimeout: 2 * time.Second, IdleTimeout: time.Second}
	a := startAgent(t, testConfig(c.addrs()...), Options{HTTPLimits: lim})
	if s := a.httpSrv; s.ReadHeaderTimeout != lim.ReadHeaderTimeout || s.IdleTimeout != lim.IdleTimeout || s.MaxHeaderBytes != httplimit.DefaultMaxHeaderBytes {
		t.Fatalf("server limits %+v", s)
	}
	d := DefaultHTTPLimits
	if d.MaxConns == 0 || d.IdleTimeout == 0 || d.ReadHeaderTimeout == 0 || d.MaxHeaderBytes == 0 {
		t.Fatalf("default limits %+v", d)
	}

	before := openFDs(t)
	const flood = 600
	var conns []net.Conn
	for range flood {
		c, err := net.Dial("tcp", a.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	time.Sleep(200 * time.Millisecond) // let the agent accept what it will
	accepted := openFDs(t) - before - flood
	for _, c := range conns {
		c.Close()
	}
	if accepted > lim.MaxConns+8 {
		t.Fatalf("the agent holds %d descriptors for %d idle connections, limit %d", accepted, flood, lim.MaxConns)
	}
	t.Logf("%d idle connections: %d accepted (limit %d)", flood, accepted, lim.MaxConns)

	// Still serving.
	client := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.Get("http://" + a.Addr() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz after the flood: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
