package main

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentEndpoint accepts connections and never answers (a hung process,
// a black-holing proxy).
func silentEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestTimeoutBoundsEveryCommand is the waldenctl row of the hardening
// table: against endpoints that accept and never answer, every command —
// jobs watch and events --follow included — gives up after --timeout per
// endpoint with one line saying so (jobs watch took 103 s with
// --timeout 2s before).
func TestTimeoutBoundsEveryCommand(t *testing.T) {
	eps := silentEndpoint(t) + "," + silentEndpoint(t)
	const timeout = 300 * time.Millisecond
	for _, args := range [][]string{
		{"status"}, {"brokers"}, {"jobs"}, {"jobs", "watch"}, {"events", "--follow"}, {"member", "list"}, {"policy", "get"},
	} {
		start := time.Now()
		code, _, errOut := runCtl(t, append([]string{"--endpoints", eps, "--timeout", timeout.String()}, args...)...)
		took := time.Since(start)
		if code != exitUnavailable || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "no answer within 300ms") {
			t.Errorf("%v: exit %d %q", args, code, errOut)
		}
		// Two endpoints, each tried once: about 600ms; far from unbounded.
		if took > 15*time.Second {
			t.Errorf("%v took %s with --timeout %s and two endpoints", args, took, timeout)
		}
		t.Logf("%v: %s", args, took.Round(time.Millisecond))
	}
}
