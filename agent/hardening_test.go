package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"walden/connlimit"
	"walden/httplimit"
	"walden/internal/testutil"
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

// TestHardeningFloodFromOneSource is finding 2 of the hardening table for
// the agent's endpoint: 20,000 idle connections from one source address
// take at most max_conns_per_source of its file descriptors (the rest are
// closed at once and counted), while the probes and the broker's lease
// questions from another address are answered.
func TestHardeningFloodFromOneSource(t *testing.T) {
	// Before anything starts: a skip ends the test where it stands.
	testutil.SkipFloodUnderRace(t)
	testutil.GoroutinesEnd(t, 15*time.Second)
	const flood = 20_000
	c := newFakeCluster(t, 1, testTTL, testDrift, nil)
	m := connlimit.NewMetrics()
	a := startAgent(t, testConfig(c.addrs()...), Options{ListenerMetrics: m})
	perSource := DefaultHTTPLimits.MaxConnsPerSource
	questions := askUnderFlood(t, a.Addr())
	f := testutil.NewFlood(t, a.Addr(), "127.0.0.2", flood, time.Minute)
	if f.Held < flood*9/10 {
		t.Fatalf("only %d of %d connections opened (%d failed)", f.Held, flood, f.Failed)
	}
	testutil.Eventually(t, 30*time.Second, "the flood refused", func() error {
		refused, accepted := m.Refused("agent_http", "max_conns_per_source"), m.Accepted("agent_http")
		if refused+accepted < float64(f.Held) || accepted > refused/4 {
			return fmt.Errorf("%v refused and %v accepted of %d", refused, accepted, f.Held)
		}
		return nil
	})
	if open := m.Open("agent_http"); open > float64(perSource+4) {
		t.Fatalf("%v connections open under the flood, bound %d", open, perSource)
	}
	n, failed := questions()
	for _, err := range failed {
		t.Errorf("a question to the agent under the flood: %v", err)
	}
	t.Logf("%d idle connections opened in %s: %v refused at once, %v accepted, %v open; %d questions answered meanwhile",
		f.Held, f.Took.Round(time.Millisecond), m.Refused("agent_http", "max_conns_per_source"), m.Accepted("agent_http"), m.Open("agent_http"), n)
	if n == 0 {
		t.Fatal("nothing answered under the flood")
	}
}

// askUnderFlood asks the agent at addr what a probe and the broker ask
// (/healthz, /v1/lease) every 100ms from 127.0.0.1 until the returned
// function is called, which returns how many were answered and the errors
// of those that were not. The test's cleanup ends the questions too, and
// fails the test if they do not end.
func askUnderFlood(t *testing.T, addr string) func() (answered int, failed []error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	type result struct {
		answered int
		failed   []error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() { done <- r }()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, path := range []string{"/healthz", "/v1/lease"} {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
				if err != nil {
					r.failed = append(r.failed, err)
					return
				}
				resp, err := client.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				switch {
				case ctx.Err() != nil:
					return // ended by the test, not refused by the agent
				case err != nil:
					r.failed = append(r.failed, err)
				default:
					r.answered++
				}
			}
		}
	}()
	var once sync.Once
	var r result
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case r = <-done:
			case <-time.After(testutil.Deadline(10 * time.Second)):
				t.Errorf("the questions to the agent did not end within %s", testutil.Deadline(10*time.Second))
			}
			client.CloseIdleConnections()
		})
	}
	t.Cleanup(stop)
	return func() (int, []error) {
		stop()
		return r.answered, r.failed
	}
}
