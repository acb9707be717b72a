package agent

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/config"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// TestBackoff: the wait after each consecutive failure lies in the upper
// half of first doubled per failure after the first, capped at ceiling;
// it varies over that whole half, and is never below half of first.
func TestBackoff(t *testing.T) {
	const ttl = 1200 * time.Millisecond
	for _, tc := range []struct {
		name           string
		failures       int
		first, ceiling time.Duration // 0, 0: RenewalBackoff for ttl
		bound          time.Duration // the wait lies in [bound/2, bound]
	}{
		{"renewal 1", 1, 0, 0, 100 * time.Millisecond},
		{"renewal 2", 2, 0, 0, 200 * time.Millisecond},
		{"renewal 3", 3, 0, 0, 400 * time.Millisecond},
		{"renewal 4", 4, 0, 0, 400 * time.Millisecond},
		{"renewal 1000", 1000, 0, 0, 400 * time.Millisecond},
		{"renewal MaxInt", math.MaxInt, 0, 0, 400 * time.Millisecond},
		{"registration 1", 1, 50 * time.Millisecond, 2 * time.Second, 50 * time.Millisecond},
		{"registration 5", 5, 50 * time.Millisecond, 2 * time.Second, 800 * time.Millisecond},
		{"registration 6", 6, 50 * time.Millisecond, 2 * time.Second, 1600 * time.Millisecond},
		{"registration 7", 7, 50 * time.Millisecond, 2 * time.Second, 2 * time.Second},
		{"no failure yet counts as one", 0, 50 * time.Millisecond, 2 * time.Second, 50 * time.Millisecond},
		{"first above the ceiling", 1, time.Second, 300 * time.Millisecond, 300 * time.Millisecond},
		{"the longest ceiling", 80, time.Nanosecond, math.MaxInt64, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			call := fmt.Sprintf("Backoff(%d, %v, %v)", tc.failures, tc.first, tc.ceiling)
			if tc.ceiling == 0 {
				call = fmt.Sprintf("RenewalBackoff(%d, %v)", tc.failures, ttl)
			}
			lo, hi := tc.bound, time.Duration(0)
			seen := map[time.Duration]bool{}
			for range 500 {
				w := Backoff(tc.failures, tc.first, tc.ceiling)
				if tc.ceiling == 0 {
					w = RenewalBackoff(tc.failures, ttl)
				}
				if w < tc.bound/2 || w > tc.bound {
					t.Fatalf("%s = %v, want in [%v, %v]", call, w, tc.bound/2, tc.bound)
				}
				lo, hi = min(lo, w), max(hi, w)
				seen[w] = true
			}
			// 500 uniform draws over the upper half: the lowest in its
			// first tenth and the highest in its last, but for a chance
			// of 2·0.9^500.
			if spread := tc.bound / 2; lo > tc.bound/2+spread/10 || hi < tc.bound-spread/10 || len(seen) < 400 {
				t.Fatalf("%s: %d distinct waits in [%v, %v], want them spread over [%v, %v]",
					call, len(seen), lo, hi, tc.bound/2, tc.bound)
			}
		})
	}
	if w := Backoff(3, 0, 0); w != 0 {
		t.Fatalf("Backoff without a wait = %v", w)
	}
}

// TestRenewalRetriesBackOff: a coordinator that stops granting — silent
// (its stream receives renewals and answers none), refusing every renewal
// at once, or unreachable (its listener closed) — gets the agent's
// attempts at about the agent's normal renewal rate, not four times it:
// after a failure the agent waits longer each time, up to a renewal
// interval. The silent one's stream is opened again only after two
// unanswered attempts, not after each. The two others keep the lease valid
// throughout, and once the coordinator grants again the agent is renewing
// with it again within about a renewal interval plus the longest wait.
func TestRenewalRetriesBackOff(t *testing.T) {
	// Renewals every 500ms, attempts bounded by 250ms; the first retry
	// within 125ms, none later than 500ms after a failure.
	const ttl = 1500 * time.Millisecond
	const window = 3 * ttl
	// normal is how many renewals a coordinator gets in the window.
	const normal = int(window / (ttl / 3))
	for _, mode := range []string{"silent", "refusing", "unreachable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			c := newFakeCluster(t, 3, ttl, testDrift, nil)
			var failed atomic.Int64
			a := startAgent(t, testConfig(c.addrs()...), Options{ObserveRenewal: func(result string) {
				if result != "granted" {
					failed.Add(1)
				}
			}})
			waitRegistered(t, a)
			down := c.coords[0]
			testutil.Eventually(t, 10*time.Second, "every coordinator's grant live", func() error {
				if live := a.grants(); len(live) != 3 {
					return errorf("grants %v", live)
				}
				return nil
			})
			attempts0, _, _ := down.received()
			streams0, _, _ := down.transport()
			failed0 := failed.Load()
			switch mode {
			case "silent":
				down.setHang(true)
			case "refusing":
				down.setRefuse(refusal.LeaseNotGranted)
			case "unreachable":
				down.stop()
			}
			end := time.Now().Add(window)
			for time.Now().Before(end) {
				if l := a.Lease(); !l.Valid {
					t.Fatalf("the lease lapsed with one coordinator of three %s: %+v, grants %v", mode, l, a.grants())
				}
				time.Sleep(20 * time.Millisecond)
			}
			attempts, _, _ := down.received()
			attempts -= attempts0
			if mode == "unreachable" { // the coordinator counts nothing now
				attempts = int(failed.Load() - failed0)
			}
			streams, _, _ := down.transport()
			streams -= streams0
			t.Logf("%s for %v: %d attempts (%d renewals at the normal rate), %d streams opened", mode, window, attempts, normal, streams)
			// A silent coordinator costs each attempt its whole bound
			// (250ms) besides the wait: at most the normal rate, and a
			// few for the first, shorter waits. One that fails at once
			// may be tried every sixth of the lease at worst (the
			// longest wait's lower half), a third more often than at
			// the normal rate on average.
			limit := normal + 3
			if mode != "silent" {
				limit = 2*normal + 3
			}
			if attempts > limit {
				t.Errorf("%d attempts in %v to a %s coordinator, want at most %d (a renewal every %v)", attempts, window, mode, limit, ttl/3)
			}
			if attempts < 3 {
				t.Errorf("%d attempts in %v to a %s coordinator: the agent stopped trying", attempts, window, mode)
			}
			if mode == "silent" && streams > attempts/2+1 {
				t.Errorf("%d streams opened for %d unanswered attempts, want one for every two", streams, attempts)
			}
			if mode == "unreachable" {
				return
			}
			down.setHang(false)
			down.setRefuse("")
			renewed, _ := down.count()
			start := time.Now()
			testutil.Eventually(t, 2*ttl, "a grant by "+down.id+" again", func() error {
				if n, _ := down.count(); n == renewed {
					return errorf("none since it answers again")
				}
				return nil
			})
			t.Logf("renewed by %s again %v after it answered again", down.id, time.Since(start))
		})
	}
}

// TestQuietRetry: the wait after a quiet period's refusal is the time it
// names, jittered by at most a 24th of the lease and bounded by two leases;
// any other refusal, or one without a readable time, leaves the backoff.
func TestQuietRetry(t *testing.T) {
	const ttl = 3 * time.Second
	quiet := func(ms string) error {
		return rpcerr.New(refusal.LeaseNotGranted, "starting", map[string]string{"cause": "starting", "retry_after_ms": ms})
	}
	for range 50 {
		if w, ok := QuietRetry(quiet("1500"), ttl); !ok || w < 1500*time.Millisecond || w > 1500*time.Millisecond+ttl/24 {
			t.Fatalf("after retry_after_ms 1500: %v %v", w, ok)
		}
		for _, long := range []string{"3600000", "9223372036854775807"} {
			if w, ok := QuietRetry(quiet(long), ttl); !ok || w < 2*ttl || w > 2*ttl+ttl/24 {
				t.Fatalf("after retry_after_ms %s: %v %v, want two leases at most", long, w, ok)
			}
		}
	}
	for _, err := range []error{
		quiet(""), quiet("-5"), quiet("soon"),
		rpcerr.New(refusal.LeaseNotGranted, "not a voter", map[string]string{"cause": "not_voter"}),
		rpcerr.New(refusal.LeaseAttested, "attested", map[string]string{"retry_after_ms": "100"}),
		status.Error(codes.DeadlineExceeded, "no answer"),
	} {
		if w, ok := QuietRetry(err, ttl); ok {
			t.Errorf("%v: wait %v, want the backoff", err, w)
		}
	}
}

// TestRenewalAfterAQuietPeriod: a coordinator that refuses renewals while
// it waits out its first lease, saying when it grants again
// (retry_after_ms), is asked again then — one refusal, two for a renewal
// already on its way, where the backoff (125ms, 250ms, 500ms ... with this
// lease) would meet three at least in its 2.5s — and grants the next one.
func TestRenewalAfterAQuietPeriod(t *testing.T) {
	const ttl = 3 * time.Second
	const quiet = 2500 * time.Millisecond
	c := newFakeCluster(t, 3, ttl, testDrift, nil)
	a := startAgent(t, testConfig(c.addrs()...), Options{})
	waitRegistered(t, a)
	testutil.Eventually(t, 10*time.Second, "every coordinator's grant live", func() error {
		if live := a.grants(); len(live) != 3 {
			return errorf("grants %v", live)
		}
		return nil
	})
	down := c.coords[0]
	down.setQuiet(quiet)
	testutil.Eventually(t, quiet+2*ttl, "a grant by "+down.id+" after its quiet period", func() error {
		if _, _, n := down.quiet(); n == 0 {
			return errorf("none yet")
		}
		return nil
	})
	refused, end, _ := down.quiet()
	late := time.Since(end)
	t.Logf("%d renewals refused in the quiet period; granted again %v after it ended", refused, late)
	if refused == 0 || refused > 2 {
		t.Errorf("%d renewals refused in a quiet period of %v, want 1 or 2: the agent asks again when the coordinator said it grants", refused, quiet)
	}
	if l := a.Lease(); !l.Valid {
		t.Errorf("the lease is not valid: %+v", l)
	}
}

// TestALateAnswerKeepsTheStream: a coordinator that answers one renewal
// after the agent's attempt gave up on it costs that attempt only: the
// agent renews on over the same stream (the late answer is skipped by its
// seq), and opens no other.
func TestALateAnswerKeepsTheStream(t *testing.T) {
	const ttl = 1500 * time.Millisecond // attempts bounded by 250ms
	c := newFakeCluster(t, 1, ttl, testDrift, nil)
	fc := c.coords[0]
	var failed atomic.Int64
	a := startAgent(t, testConfig(fc.addr), Options{ObserveRenewal: func(result string) {
		if result != "granted" {
			failed.Add(1)
		}
	}})
	waitRegistered(t, a)
	fc.setLate(1, 400*time.Millisecond)
	waitLateAnswer(t, fc)
	_, after, _ := fc.transport()
	testutil.Eventually(t, 10*time.Second, "three renewals after the late answer", func() error {
		if _, n, _ := fc.transport(); n < after+3 {
			return errorf("%d", n-after)
		}
		return nil
	})
	if err := a.Check(); err != nil {
		t.Fatalf("Check after the late answer: %v", err)
	}
	// Only another failure (a loaded machine's) may have opened a stream
	// again; the late answer's may not.
	streams, _, unary := fc.transport()
	f := int(failed.Load())
	if f == 0 {
		t.Fatalf("no attempt failed: the late answer (400ms, the attempts' bound is %v) was taken", ttl/6)
	}
	if unary != 0 || streams > f {
		t.Fatalf("%d streams and %d calls for %d failed attempts, one of them the late answer's: want the renewals on one stream", streams, unary, f)
	}
	t.Logf("%d streams, %d failed attempts", streams, f)
}

// TestRenewerSkipsLateAnswers: an answer that comes after its attempt gave
// up is never taken for a later renewal's (its grant would count from the
// later renewal's send), and a stream whose renewals went unanswered twice
// in a row is closed: the next renewal opens another. The same over a gRPC
// stream and over a connection of frames.
func TestRenewerSkipsLateAnswers(t *testing.T) {
	for _, transport := range []string{config.RenewalsStream, config.RenewalsFrames} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			c := newFakeCluster(t, 1, testTTL, testDrift, nil)
			c.mu.Lock()
			c.epoch, c.nextEpoch = 1, 2
			c.mu.Unlock()
			fc := c.coords[0]
			r := renewerOf(t, fc, transport, nil, nil)
			opened := func() int {
				if transport == config.RenewalsFrames {
					_, conns, _ := fc.frames()
					return conns
				}
				streams, _, _ := fc.transport()
				return streams
			}
			req := &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: 1}
			if _, err := r.Renew(context.Background(), req, testutil.Deadline(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			// Answered 750ms after it arrived: the attempt gives up at
			// 250ms (room for a loaded machine to run the send before its
			// guard fires).
			fc.setLate(1, 750*time.Millisecond)
			if _, err := r.Renew(context.Background(), req, 250*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("a renewal answered after its deadline: %v, want DeadlineExceeded", err)
			}
			waitLateAnswer(t, fc)
			// The next renewal gets no answer: the only one on the stream
			// is the late answer to the one before.
			fc.setHang(true)
			if resp, err := r.Renew(context.Background(), req, 500*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("a renewal nobody answered: %v, %v, want DeadlineExceeded (the late answer to another was taken for it)", resp, err)
			}
			if n := opened(); n != 1 {
				t.Fatalf("%d streams opened, want the first kept across an unanswered attempt", n)
			}
			// Two attempts in a row unanswered: the stream is closed.
			testutil.Eventually(t, 10*time.Second, "the unanswered stream closed", func() error {
				if _, open, _ := fc.received(); open != 0 {
					return errorf("%d streams open", open)
				}
				return nil
			})
			fc.setHang(false)
			if _, err := r.Renew(context.Background(), req, testutil.Deadline(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			if n := opened(); n != 2 {
				t.Fatalf("%d streams opened, want a second one after two unanswered attempts", n)
			}
			// Closing the renewer ends its stream (and so its receiver).
			r.Close()
			testutil.Eventually(t, 10*time.Second, "the stream closed", func() error {
				if _, open, _ := fc.received(); open != 0 {
					return errorf("%d streams open", open)
				}
				return nil
			})
		})
	}
}

// waitLateAnswer waits until fc sent its late answer on its one stream,
// and fails the test when the stream was closed first: the agent gave it
// up after one unanswered attempt.
func waitLateAnswer(t *testing.T, fc *fakeCoord) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "the late answer sent, or its stream closed", func() error {
		if _, open, late := fc.received(); late == 0 && open == 1 {
			return errorf("not yet")
		}
		return nil
	})
	if _, _, late := fc.received(); late == 0 {
		t.Fatalf("the stream was closed before its late answer came: given up after one unanswered attempt")
	}
}
