package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"walden/config"
	"walden/gossip"
	"walden/internal/testutil"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
)

const (
	testTTL    = 600 * time.Millisecond
	testMargin = 100 * time.Millisecond
	testDrift  = 100 * time.Millisecond
)

func testConfig(coords ...string) *config.Agent {
	c := config.DefaultAgentConfig()
	c.BrokerID = "b1"
	c.ClusterName = "demo"
	c.Coordinators = coords
	c.Listen = "127.0.0.1:0"
	c.Gossip.BindAddr = "127.0.0.1:0"
	c.Gossip.RejoinInterval = 0
	c.WAL = config.WALLocation{VolumeID: "vol-b1", Path: "/var/lib/broker/b1.wal"}
	c.LeaseSafetyMargin = testMargin
	// The fake coordinators serve gRPC only: the tests of frames say so.
	c.Renewals.Transport = config.RenewalsStream
	return c
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startAgent starts an agent on cfg; it is stopped (not gracefully) when the
// test ends.
func startAgent(t testing.TB, cfg *config.Agent, opts Options) *Agent {
	t.Helper()
	return startAgentWith(t, cfg, opts, nil)
}

// startAgentWith is startAgent with a hook run between New and Start (to
// register OnEpochChange hooks, which must precede Start).
func startAgentWith(t testing.TB, cfg *config.Agent, opts Options, beforeStart func(*Agent)) *Agent {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	if opts.RegisterBackoffMax == 0 {
		opts.RegisterBackoffMax = 50 * time.Millisecond
	}
	a, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if beforeStart != nil {
		beforeStart(a)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(false) })
	return a
}

func waitRegistered(t testing.TB, a *Agent) Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := a.WaitRegistered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// manualClock is a boot clock that moves only when the test says so.
type manualClock struct {
	mu sync.Mutex
	t  time.Duration
}

func (c *manualClock) Now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) set(t time.Duration) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func TestRegistersAndRenews(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	a := startAgent(t, testConfig(c.addrs()...), Options{})
	if err := a.Check(); err != nil && !errors.Is(err, ErrNotRegistered) && !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check before registration = %v", err)
	}
	l := waitRegistered(t, a)
	if l.BrokerID != "b1" || l.Epoch != 1 || !l.Valid || l.Fenced || l.Remaining <= 0 || l.Remaining > testTTL-testMargin {
		t.Fatalf("lease after registration = %+v", l)
	}
	if got := a.RecoveredWALOffset(); got != -1 {
		t.Fatalf("RecoveredWALOffset = %d, want -1", got)
	}
	// Every coordinator renews epoch 1 (one every ttl/3), and nobody
	// registers twice.
	testutil.Eventually(t, 10*time.Second, "renewals by every coordinator", func() error {
		for _, fc := range c.coords {
			if n, _ := fc.count(); n < 4 {
				return errorf("%s granted %d renewals", fc.id, n)
			}
		}
		return nil
	})
	s := c.stats()
	if s.registers != 1 || s.epoch != 1 {
		t.Fatalf("fake saw %+v, want one registration and epoch 1", s)
	}
	c.mu.Lock()
	req := c.lastRegister
	c.mu.Unlock()
	if req.GetBrokerId() != "b1" || req.GetAgentAddr() != a.Addr() || req.GetWal().GetPath() != "/var/lib/broker/b1.wal" ||
		req.GetWal().GetVolumeId() != "vol-b1" || req.GetGossipName() != "agent/b1" {
		t.Fatalf("RegisterRequest = %v (agent addr %s)", req, a.Addr())
	}
}

// TestFollowsRenewalSlots: an agent renews when its coordinator's grant
// asks it to (its renewal slot) when that is sooner than a third of the
// lease and at least a sixth of it; a request sooner than a sixth is
// ignored, and the agent renews a third of the lease after each renewal.
func TestFollowsRenewalSlots(t *testing.T) {
	const ttl = 1200 * time.Millisecond // renewals every 400ms; a sixth is 200ms
	for _, tc := range []struct {
		renewIn time.Duration
		// the median interval between renewals lies in [lo, hi]: time
		// on a loaded machine only makes it longer.
		lo, hi time.Duration
	}{
		{250 * time.Millisecond, 240 * time.Millisecond, 380 * time.Millisecond}, // below the 400ms of its own schedule
		{150 * time.Millisecond, 370 * time.Millisecond, time.Second},
	} {
		t.Run(tc.renewIn.String(), func(t *testing.T) {
			c := newFakeCluster(t, 1, ttl, testDrift, nil)
			c.renewIn = tc.renewIn
			a := startAgent(t, testConfig(c.coords[0].addr), Options{})
			waitRegistered(t, a)
			var iv []time.Duration
			testutil.Eventually(t, 30*time.Second, "nine renewals", func() error {
				if iv = c.coords[0].intervals(1); len(iv) < 8 {
					return errorf("%d intervals", len(iv))
				}
				return nil
			})
			slices.Sort(iv)
			if med := iv[len(iv)/2]; med < tc.lo || med > tc.hi {
				t.Fatalf("grants asking for renewals %v after them: median interval %v (of %v), want in [%v, %v]", tc.renewIn, med, iv, tc.lo, tc.hi)
			}
		})
	}
}

// TestRenewsOverOneStream: the agent renews with every coordinator over
// one connection of its own (frames, by default) or one gRPC stream
// (renewals.transport: stream), never a call each, and the voters sent once
// on one keep counting for the grants that leave them out. One is opened
// again only after attempts on it failed (two unanswered in a row, or one
// whose stream ended or whose send could not complete in time), which a
// loaded machine makes happen now and then; on a quiet one each
// coordinator sees one for the whole test.
func TestRenewsOverOneStream(t *testing.T) {
	for _, transport := range []string{config.RenewalsAuto, config.RenewalsStream} {
		t.Run(transport, func(t *testing.T) {
			c := newFakeCluster(t, 3, testTTL, testDrift, nil)
			cfg := testConfig(c.coords[0].addr)
			cfg.Renewals.Transport = transport
			var failed atomic.Int64
			a := startAgent(t, cfg, Options{ObserveRenewal: func(result string) {
				if result == "failed" {
					failed.Add(1)
				}
			}})
			waitRegistered(t, a)
			testutil.Eventually(t, 30*time.Second, "six renewals on one stream of each coordinator", func() error {
				for _, fc := range c.coords {
					if n := fc.longestStream(); n < 6 {
						return errorf("the longest stream of %s carried %d renewals", fc.id, n)
					}
				}
				return nil
			})
			opened, renewed := 0, 0
			for _, fc := range c.coords {
				streams, streamed, unary := fc.transport()
				_, conns, framed := fc.frames()
				if transport == config.RenewalsAuto && (streams != 0 || streamed != 0 || framed == 0) ||
					transport == config.RenewalsStream && (conns != 0 || streamed == 0) || unary != 0 {
					t.Errorf("%s: %d streams with %d renewals, %d connections of frames with %d, %d calls", fc.id, streams, streamed, conns, framed, unary)
				}
				opened, renewed = opened+streams+conns, renewed+streamed+framed
			}
			// Read after the streams: a failure is counted before the
			// attempt after it opens a stream.
			again := opened - len(c.coords)
			if allowed := int(failed.Load()); again > allowed {
				t.Errorf("%d streams opened again for %d failed attempts and %d renewals on them", again, failed.Load(), renewed)
			}
			t.Logf("%d streams for %d renewals, %d failed attempts", opened, renewed, failed.Load())
			// Every grant after the first on a stream came without the
			// voters: the lease still rests on all three, each by its
			// incarnation.
			if l := a.Lease(); !l.Valid {
				t.Fatalf("lease with grants that leave the voters out: %+v", l)
			}
			a.mu.Lock()
			live := a.st.holder.Live(a.clock.Now())
			a.mu.Unlock()
			if len(live) != 3 {
				t.Fatalf("grants counted %v, want all three voters", live)
			}
		})
	}
}

// TestBrokenStreamReopens: a stream that ends (a coordinator restarting, a
// proxy that cuts long streams) costs the attempt on it; the next attempt
// opens another, the renewals go on over streams, never a call each, and
// the grants of every new stream count (its first names the voters
// again).
func TestBrokenStreamReopens(t *testing.T) {
	ttl := 1200 * time.Millisecond
	c := newFakeCluster(t, 3, ttl, testDrift, nil)
	for _, fc := range c.coords {
		fc.setBreakAfter(2)
	}
	a := startAgent(t, testConfig(c.addrs()...), Options{})
	waitRegistered(t, a)
	testutil.Eventually(t, 30*time.Second, "every coordinator's grant live on its fourth stream", func() error {
		a.mu.Lock()
		live := a.st.holder.Live(a.clock.Now())
		a.mu.Unlock()
		for _, fc := range c.coords {
			if streams, _, _ := fc.transport(); streams < 4 {
				return errorf("%s: %d streams opened", fc.id, streams)
			}
			if live[fc.id] <= 0 {
				return errorf("%s's grant is not live: %v", fc.id, live)
			}
		}
		return a.Check()
	})
	for _, fc := range c.coords {
		if _, _, unary := fc.transport(); unary != 0 {
			t.Errorf("%s: %d calls, want renewals over streams only", fc.id, unary)
		}
		if n := fc.longestStream(); n > 2 {
			t.Errorf("%s: a stream carried %d renewals past its end after 2", fc.id, n)
		}
	}
}

// TestLeaseRestsOnAStreamAndACall: during a rolling upgrade a coordinator
// of the older walden (one call a renewal) and one of this (a stream) are a
// majority of three between them: with the third down, each one's grants
// count and they hold the lease.
func TestLeaseRestsOnAStreamAndACall(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	old, upgraded, down := c.coords[0], c.coords[1], c.coords[2]
	old.setNoStream(true)
	a := startAgent(t, testConfig(c.addrs()...), Options{})
	waitRegistered(t, a)
	down.setHang(true)
	defer down.setHang(false)
	// Once c3's last grant is over, what keeps the lease is c1's calls
	// and c2's stream.
	testutil.Eventually(t, 20*time.Second, "the lease valid on c1's calls and c2's stream alone", func() error {
		a.mu.Lock()
		live := a.st.holder.Live(a.clock.Now())
		a.mu.Unlock()
		if live[down.id] > 0 {
			return errorf("%s's grant is still live: %v", down.id, live)
		}
		if live[old.id] <= 0 || live[upgraded.id] <= 0 {
			return errorf("grants %v", live)
		}
		return a.Check()
	})
	if streams, _, calls := old.transport(); streams != 0 || calls == 0 {
		t.Fatalf("%s (no stream): %d streams, %d calls", old.id, streams, calls)
	}
	if _, streamed, calls := upgraded.transport(); streamed == 0 || calls != 0 {
		t.Fatalf("%s: %d streamed renewals, %d calls", upgraded.id, streamed, calls)
	}
}

// TestRenewerTriesTheStreamAgain: a renewer that fell back to calls with a
// coordinator of the older walden tries the stream again once streamRetry
// has passed, and renews over it from then on when the coordinator was
// upgraded meanwhile.
func TestRenewerTriesTheStreamAgain(t *testing.T) {
	c := newFakeCluster(t, 1, testTTL, testDrift, nil)
	c.mu.Lock()
	c.epoch, c.nextEpoch = 1, 2
	c.mu.Unlock()
	fc := c.coords[0]
	fc.setNoStream(true)
	conn, err := grpc.NewClient(fc.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := NewRenewer(RenewerOptions{Conn: func() (*grpc.ClientConn, error) { return conn, nil }, Transport: config.RenewalsStream})
	defer r.Close()
	r.streamRetry = time.Hour
	renew := func() {
		t.Helper()
		if _, err := r.Renew(context.Background(), &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: 1}, testutil.Deadline(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	renew()
	fc.setNoStream(false) // upgraded
	renew()
	if streams, _, calls := fc.transport(); streams != 0 || calls != 2 {
		t.Fatalf("within streamRetry: %d streams, %d calls, want calls only", streams, calls)
	}
	r.unaryUntil = time.Time{} // streamRetry has passed
	for range 3 {
		renew()
	}
	if streams, streamed, calls := fc.transport(); streams != 1 || streamed != 3 || calls != 2 {
		t.Fatalf("after streamRetry: %d streams, %d streamed renewals, %d calls, want 3 renewals on one stream", streams, streamed, calls)
	}
}

// TestGrantsCountByIncarnation: a coordinator replaced under its name is a
// new incarnation in a new voter configuration; over streams as with calls,
// the grants of the former incarnation stop counting once the agent knows
// the new configuration, and the new incarnation's count. (A stream sends
// the voters once per configuration: the grants between carry the last
// ones, incarnations included.)
func TestGrantsCountByIncarnation(t *testing.T) {
	for _, transport := range []string{"stream", "calls"} {
		t.Run(transport, func(t *testing.T) {
			c := newFakeCluster(t, 3, testTTL, testDrift, nil)
			for _, fc := range c.coords {
				fc.setNoStream(transport == "calls")
			}
			a := startAgent(t, testConfig(c.addrs()...), Options{})
			waitRegistered(t, a)
			holder := func() (lease.Voters, map[string]time.Duration) {
				a.mu.Lock()
				defer a.mu.Unlock()
				return a.st.holder.Voters(), a.st.holder.Live(a.clock.Now())
			}
			// Every voter's grant live, two lease periods on: the grants
			// without the voters counted by the incarnations of the
			// stream's first.
			begin := time.Now()
			testutil.Eventually(t, 20*time.Second, "every voter's grant live two lease periods on", func() error {
				if time.Since(begin) < 2*testTTL {
					return errorf("%v since the registration", time.Since(begin))
				}
				v, live := holder()
				if v.Index != 1 || len(live) != 3 {
					return errorf("configuration %v, grants %v", v, live)
				}
				for id, left := range live {
					if left <= 0 {
						return errorf("%s's grant is over: %v", id, live)
					}
				}
				return nil
			})
			replaced := c.coords[2]
			replaced.setHang(true)
			c.replace(replaced, 40)
			testutil.Eventually(t, 20*time.Second, "the new configuration known", func() error {
				if v, _ := holder(); v.Index != 2 {
					return errorf("configuration %v", v)
				}
				return nil
			})
			if _, live := holder(); len(live) != 2 || live[c.coords[0].id] == 0 || live[c.coords[1].id] == 0 {
				t.Fatalf("grants counted in the new configuration: %v, want c1's and c2's (c3's were of its former incarnation)", live)
			}
			replaced.setHang(false)
			testutil.Eventually(t, 20*time.Second, "the new incarnation's grant counted", func() error {
				v, live := holder()
				if live[replaced.id] <= 0 || len(v.Incarnations) != 3 || v.Incarnations[2] != 40 {
					return errorf("configuration %v, grants %v", v, live)
				}
				return nil
			})
		})
	}
}

// TestFallsBackToCallsWithAnOlderCoordinator: a coordinator of an older
// walden answers the stream with Unimplemented; the agent renews with it
// one call each and over streams with the others, and holds its lease.
func TestFallsBackToCallsWithAnOlderCoordinator(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	old := c.coords[0]
	old.setNoStream(true)
	a := startAgent(t, testConfig(c.addrs()...), Options{})
	waitRegistered(t, a)
	testutil.Eventually(t, 10*time.Second, "renewals by every coordinator", func() error {
		if _, _, unary := old.transport(); unary < 4 {
			return errorf("%s (no stream) answered %d calls", old.id, unary)
		}
		for _, fc := range c.coords[1:] {
			if _, streamed, _ := fc.transport(); streamed < 4 {
				return errorf("%s granted %d streamed renewals", fc.id, streamed)
			}
		}
		return nil
	})
	if streams, streamed, _ := old.transport(); streams != 0 || streamed != 0 {
		t.Fatalf("the older coordinator served %d streams, %d renewals", streams, streamed)
	}
	for _, fc := range c.coords[1:] {
		if _, _, unary := fc.transport(); unary != 0 {
			t.Errorf("%s serves the stream but got %d calls", fc.id, unary)
		}
	}
	// With the older coordinator alone able to grant, the lease rests on
	// its calls: the two others hang.
	c.coords[1].setHang(true)
	c.coords[2].setHang(true)
	defer c.coords[1].setHang(false)
	defer c.coords[2].setHang(false)
	if err := a.Check(); err != nil {
		t.Fatalf("Check with every coordinator answering: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, "the lease expires with one grant of three", func() error {
		if err := a.Check(); !errors.Is(err, ErrLeaseExpired) {
			return errorf("Check = %v", err)
		}
		return nil
	})
	c.coords[1].setHang(false)
	waitRegistered(t, a)
}

// TestDiscoversVoters: an agent configured with one coordinator learns the
// other voters from its grants and renews with them too (one grant of
// three is no lease).
func TestDiscoversVoters(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	a := startAgent(t, testConfig(c.coords[0].addr), Options{})
	waitRegistered(t, a)
	testutil.Eventually(t, 10*time.Second, "renewals by the discovered coordinators", func() error {
		for _, fc := range c.coords[1:] {
			if n, _ := fc.count(); n < 2 {
				return errorf("%s granted %d renewals", fc.id, n)
			}
		}
		return nil
	})
}

// TestLeaseBoundsOnInjectedClock checks the self-fencing instant exactly:
// the lease is valid until the majority-th latest of the voters' grants
// ends (its send time plus lease_ttl minus the margin), and that instant is
// strictly before any of those coordinators may attest (its receive time
// plus lease_ttl plus drift).
func TestLeaseBoundsOnInjectedClock(t *testing.T) {
	t0 := 100 * time.Second
	clk := &manualClock{t: t0}
	c := newFakeCluster(t, 3, testTTL, testDrift, clk)
	a := startAgent(t, testConfig(c.addrs()...), Options{Clock: clk})
	waitRegistered(t, a)
	testutil.Eventually(t, 10*time.Second, "every coordinator granted at t0", func() error {
		if l := a.Lease(); len(a.grants()) != 3 || l.Remaining != testTTL-testMargin {
			return errorf("lease %+v, grants %v", l, a.grants())
		}
		return nil
	})
	// Every renewal from now on hangs: the coordinators' last receive
	// times and the agent's last send times are all t0.
	c.setHang(3, true)
	deadline := t0 + testTTL - testMargin
	clk.set(deadline - time.Millisecond)
	if l := a.Lease(); !l.Valid || l.Remaining != time.Millisecond {
		t.Fatalf("lease 1ms before the deadline = %+v", l)
	}
	if err := a.Check(); err != nil {
		t.Fatalf("Check 1ms before the deadline = %v", err)
	}
	clk.set(deadline)
	if l := a.Lease(); l.Valid || l.Remaining != 0 || l.Fenced || l.Epoch != 1 {
		t.Fatalf("lease at the deadline = %+v", l)
	}
	if err := a.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check at the deadline = %v, want ErrLeaseExpired", err)
	}
	for _, fc := range c.coords {
		if at := fc.attestAt(); deadline >= at {
			t.Fatalf("agent deadline %s is not before %s's earliest attestation %s", deadline-t0, fc.id, at-t0)
		}
	}

	// One coordinator answers again, later: one grant of three is no
	// lease; a second one makes a majority again.
	clk.set(deadline + time.Second)
	c.coords[0].setHang(false)
	testutil.Eventually(t, 10*time.Second, "a grant from c1", func() error {
		if g := a.grants()["c1"]; g != testTTL-testMargin {
			return errorf("c1's grant has %s", g)
		}
		return nil
	})
	if l := a.Lease(); l.Valid {
		t.Fatalf("valid on one grant of three: %+v", l)
	}
	c.coords[1].setHang(false)
	testutil.Eventually(t, 10*time.Second, "renewed", func() error {
		if l := a.Lease(); !l.Valid || l.Remaining != testTTL-testMargin {
			return errorf("lease %+v", l)
		}
		return nil
	})
}

// grants returns what each voter's grant has left at this instant.
func (a *Agent) grants() map[string]time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st.holder.Live(a.clock.Now())
}

// TestOneCoordinatorDownKeepsTheLease: with one coordinator of three
// unreachable (its renewals hang until they time out), the lease never
// lapses; it rests on the other two.
func TestOneCoordinatorDownKeepsTheLease(t *testing.T) {
	const ttl, margin = 3 * time.Second, 500 * time.Millisecond
	c := newFakeCluster(t, 3, ttl, testDrift, nil)
	cfg := testConfig(c.addrs()...)
	cfg.LeaseSafetyMargin = margin
	a := startAgent(t, cfg, Options{})
	waitRegistered(t, a)
	c.coords[0].setHang(true)
	// Sample for two lease periods: validity never drops (each sample
	// shows a lease that lasts at least until the next renewal is due).
	end := time.Now().Add(2 * ttl)
	for time.Now().Before(end) {
		if l := a.Lease(); !l.Valid {
			t.Fatalf("lease lapsed with one coordinator of three down: %+v, grants %v", l, a.grants())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCoordinatorsUnreachableSelfFences cuts the agent off from every
// coordinator (renewals hang) on the real clock: valid turns false, and the
// instant it does is no later than the majority-th latest grant's send time
// plus lease_ttl minus the margin, strictly before any of those
// coordinators may attest.
func TestCoordinatorsUnreachableSelfFences(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	a := startAgent(t, testConfig(c.addrs()...), Options{})
	waitRegistered(t, a)
	testutil.Eventually(t, 10*time.Second, "renewals", func() error {
		if s := c.stats(); s.renewals < 6 {
			return errorf("%d renewals", s.renewals)
		}
		return nil
	})
	c.setHang(3, true)
	testutil.Eventually(t, 10*time.Second, "valid:false", func() error {
		if l := a.Lease(); l.Valid {
			return errorf("still valid: %+v", l)
		}
		return nil
	})
	a.mu.Lock()
	holder := a.st.holder
	now := a.clock.Now()
	live := holder.Live(now)
	a.mu.Unlock()
	// The deadline of each grant is at most its coordinator's earliest
	// attestation: send ≤ receive on one clock here.
	for _, fc := range c.coords {
		if left, ok := live[fc.id]; ok && now+left >= fc.attestAt() {
			t.Fatalf("%s's grant ends at %s, not before its earliest attestation %s", fc.id, now+left, fc.attestAt())
		}
	}
	if err := a.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check = %v, want ErrLeaseExpired", err)
	}
	// Reachable again: the same epoch is confirmed again.
	c.setHang(3, false)
	l := waitRegistered(t, a)
	if l.Epoch != 1 {
		t.Fatalf("epoch after reconnecting = %d, want 1", l.Epoch)
	}
}

// TestDefaultClockRunsThroughSuspend: without an injected clock the agent
// measures its lease on the boot clock, which counts a host suspend.
func TestDefaultClockRunsThroughSuspend(t *testing.T) {
	a, err := New(testConfig(closedAddr(t)), Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if a.clock != lease.BootClock {
		t.Fatalf("default clock %T, want lease.BootClock", a.clock)
	}
}

// TestFencedReregisters: a failover fences the broker; the agent reports
// fenced:true at once, waits while the recovery runs, then registers with a
// new epoch and reports the recovered WAL offset.
func TestFencedReregisters(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	epochs := make(chan Lease, 8)
	a := startAgentWith(t, testConfig(c.addrs()...), Options{}, func(a *Agent) {
		a.OnEpochChange(func(l Lease) { epochs <- l })
	})
	waitRegistered(t, a)
	select {
	case l := <-epochs:
		if l.Epoch != 1 {
			t.Fatalf("first epoch change = %+v", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no epoch change notification for the first registration")
	}

	c.failover() // epoch 2 fenced, recovery running
	testutil.Eventually(t, 10*time.Second, "fenced", func() error {
		if l := a.Lease(); !l.Fenced || l.Valid || l.Epoch != 1 {
			return errorf("lease %+v", l)
		}
		return nil
	})
	if err := a.Check(); !errors.Is(err, ErrFenced) {
		t.Fatalf("Check = %v, want ErrFenced", err)
	}
	body := getLease(t, a)
	if body["fenced"] != true || body["valid"] != false || body["remaining_ms"] != float64(0) {
		t.Fatalf("/v1/lease while fenced = %v", body)
	}
	// Registration is refused with RECOVERY_RUNNING and retried.
	before := c.stats().registers
	testutil.Eventually(t, 10*time.Second, "registration retried", func() error {
		if n := c.stats().registers; n < before+2 {
			return errorf("%d registrations", n)
		}
		return nil
	})
	if l := a.Lease(); !l.Fenced || l.Valid {
		t.Fatalf("lease while the recovery runs = %+v", l)
	}

	c.finishRecovery(16384)
	l := waitRegistered(t, a)
	if l.Epoch != 3 || l.Fenced || !l.Valid {
		t.Fatalf("lease after re-registration = %+v", l)
	}
	if got := a.RecoveredWALOffset(); got != 16384 {
		t.Fatalf("RecoveredWALOffset = %d, want 16384", got)
	}
	resp, err := http.Get("http://" + a.Addr() + "/v1/registration")
	if err != nil {
		t.Fatal(err)
	}
	var reg RegistrationJSON
	err = json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	if err != nil || reg != (RegistrationJSON{BrokerID: "b1", Registered: true, Epoch: 3, RecoveredWALOffset: 16384}) {
		t.Fatalf("/v1/registration = %+v, %v", reg, err)
	}
	select {
	case l := <-epochs:
		if l.Epoch != 3 {
			t.Fatalf("second epoch change = %+v", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no epoch change notification")
	}
}

// TestEpochExpiredReregisters: the cluster's epoch moved on without a fenced
// flag (EPOCH_EXPIRED); the agent registers again at once.
func TestEpochExpiredReregisters(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	a := startAgent(t, testConfig(c.addrs()...), Options{})
	waitRegistered(t, a)
	c.mu.Lock()
	c.epoch = 7
	c.nextEpoch = 8
	c.mu.Unlock()
	testutil.Eventually(t, 10*time.Second, "new epoch", func() error {
		if l := a.Lease(); l.Epoch != 8 || !l.Valid || l.Fenced {
			return errorf("lease %+v", l)
		}
		return nil
	})
}

func TestRegistrationWaitsForRecovery(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	c.recoveryRunning = true
	a := startAgent(t, testConfig(c.addrs()...), Options{})
	testutil.Eventually(t, 10*time.Second, "registration retried", func() error {
		if n := c.stats().registers; n < 3 {
			return errorf("%d registrations", n)
		}
		return nil
	})
	if l := a.Lease(); l.Valid || l.Epoch != 0 {
		t.Fatalf("lease while the recovery runs = %+v", l)
	}
	if err := a.Check(); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("Check = %v, want ErrNotRegistered", err)
	}
	c.finishRecovery(8192)
	l := waitRegistered(t, a)
	if l.Epoch != 1 || a.RecoveredWALOffset() != 8192 {
		t.Fatalf("lease %+v, recovered %d", l, a.RecoveredWALOffset())
	}
}

// TestRegistrationFollowsLeaderHint: the first configured coordinator is
// down, the second is a follower that names the leader; the agent registers
// with the leader.
func TestRegistrationFollowsLeaderHint(t *testing.T) {
	for _, inDetail := range []bool{false, true} {
		name := "trailer"
		if inDetail {
			name = "error_detail"
		}
		t.Run(name, func(t *testing.T) {
			c := newFakeCluster(t, 3, testTTL, testDrift, nil)
			c.hintInDetail = inDetail
			a := startAgent(t, testConfig(closedAddr(t), c.coords[1].addr), Options{})
			l := waitRegistered(t, a)
			if l.Epoch != 1 {
				t.Fatalf("lease %+v", l)
			}
			if _, hints := c.coords[1].count(); hints == 0 {
				t.Fatal("the follower was never asked to register")
			}
			if s := c.stats(); s.registers != 1 {
				t.Fatalf("%d registrations", s.registers)
			}
		})
	}
}

func getLease(t *testing.T, a *Agent) map[string]any {
	t.Helper()
	resp, err := http.Get("http://" + a.Addr() + "/v1/lease")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/lease: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body
}

func TestLeaseEndpointJSON(t *testing.T) {
	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	c.recoveryRunning = true
	a := startAgent(t, testConfig(c.addrs()...), Options{})

	check := func(body map[string]any) {
		t.Helper()
		keys := make([]string, 0, len(body))
		for k := range body {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"broker_id", "epoch", "fenced", "remaining_ms", "valid"}) {
			t.Fatalf("keys %v", keys)
		}
		if _, ok := body["broker_id"].(string); !ok {
			t.Fatalf("broker_id %T", body["broker_id"])
		}
		for _, k := range []string{"epoch", "remaining_ms"} {
			if n, ok := body[k].(float64); !ok || n < 0 || n != float64(int64(n)) {
				t.Fatalf("%s = %v (%T), want a non-negative integer", k, body[k], body[k])
			}
		}
		for _, k := range []string{"valid", "fenced"} {
			if _, ok := body[k].(bool); !ok {
				t.Fatalf("%s %T", k, body[k])
			}
		}
	}
	// Before registration.
	body := getLease(t, a)
	check(body)
	if body["broker_id"] != "b1" || body["epoch"] != float64(0) || body["valid"] != false || body["remaining_ms"] != float64(0) {
		t.Fatalf("before registration %v", body)
	}
	c.finishRecovery(-1)
	waitRegistered(t, a)
	testutil.Eventually(t, 5*time.Second, "valid in JSON", func() error {
		body = getLease(t, a)
		check(body)
		if body["epoch"] != float64(1) || body["valid"] != true || body["fenced"] != false {
			return errorf("%v", body)
		}
		if ms := body["remaining_ms"].(float64); ms <= 0 || ms > float64((testTTL-testMargin).Milliseconds()) {
			return errorf("remaining_ms %v", ms)
		}
		return nil
	})

	resp, err := http.Get("http://" + a.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ok\n" {
		t.Fatalf("/healthz: %s %q", resp.Status, b)
	}
	resp, err = http.Post("http://"+a.Addr()+"/v1/lease", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /v1/lease: %s", resp.Status)
	}
}

// TestGossipAndGracefulStop: the agent joins the pool as role "agent" with
// its endpoint, and leaves it on a graceful Stop; afterwards the lease is
// void.
func TestGossipAndGracefulStop(t *testing.T) {
	gc := gossip.DefaultConfig()
	gc.ClusterName = "demo"
	gc.NodeName = "coordinator/c1"
	gc.Meta = gossip.Meta{Role: gossip.RoleCoordinator, ID: "c1"}
	gc.BindAddr = "127.0.0.1:0"
	gc.ProbeInterval = 100 * time.Millisecond
	gc.ProbeTimeout = 50 * time.Millisecond
	gc.GossipInterval = 20 * time.Millisecond
	gc.RejoinInterval = 0
	coord, err := gossip.Start(gc)
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Shutdown()

	c := newFakeCluster(t, 3, testTTL, testDrift, nil)
	cfg := testConfig(c.addrs()...)
	cfg.Gossip.Join = []string{coord.Addr()}
	cfg.Gossip.ProbeInterval = gc.ProbeInterval
	cfg.Gossip.ProbeTimeout = gc.ProbeTimeout
	cfg.Gossip.GossipInterval = gc.GossipInterval
	a := startAgent(t, cfg, Options{})
	waitRegistered(t, a)

	member := func() (gossip.Member, bool) {
		for _, m := range coord.Members() {
			if m.Name == "agent/b1" {
				return m, true
			}
		}
		return gossip.Member{}, false
	}
	testutil.Eventually(t, 5*time.Second, "agent in the pool", func() error {
		m, ok := member()
		if !ok || m.State != gossip.StateAlive {
			return errorf("member %+v", m)
		}
		if m.Meta.Role != gossip.RoleAgent || m.Meta.ID != "b1" || m.Meta.AgentAddr != a.Addr() {
			return errorf("meta %+v, agent addr %s", m.Meta, a.Addr())
		}
		return nil
	})

	if err := a.Stop(true); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "agent left", func() error {
		if m, ok := member(); !ok || m.State != gossip.StateLeft {
			return errorf("member %+v", m)
		}
		return nil
	})
	if l := a.Lease(); l.Valid {
		t.Fatalf("lease after Stop = %+v", l)
	}
	if err := a.Check(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Check after Stop = %v", err)
	}
	if _, err := a.WaitRegistered(context.Background()); !errors.Is(err, ErrStopped) {
		t.Fatalf("WaitRegistered after Stop = %v", err)
	}
	if err := a.Stop(true); err != nil {
		t.Fatalf("second Stop = %v", err)
	}
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	cfg := testConfig()
	_, err := New(cfg, Options{})
	if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("New with no coordinators = %v", err)
	}
}

func TestStartFailsOnBusyListen(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := testConfig(closedAddr(t))
	cfg.Listen = busy.Addr().String()
	a, err := New(cfg, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); !errors.Is(err, ErrStart) {
		t.Fatalf("Start on a busy port = %v, want ErrStart", err)
	}
	if err := a.Stop(true); err != nil {
		t.Fatalf("Stop after a failed Start = %v", err)
	}
	if err := a.Check(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Check = %v", err)
	}
	if err := a.Start(); !errors.Is(err, ErrStart) {
		t.Fatalf("Start after Stop = %v", err)
	}
}

// TestRenewerBoundsAnAttemptWhoseConnectionHangs: a coordinator whose
// connection never becomes ready (it accepts and says nothing) costs one
// attempt its deadline, not the connection's 20 s timeout: the stream's
// opening is bounded too.
func TestRenewerBoundsAnAttemptWhoseConnectionHangs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent, until the test ends
		}
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := NewRenewer(RenewerOptions{Conn: func() (*grpc.ClientConn, error) { return conn, nil }, Transport: config.RenewalsStream})
	defer r.Close()
	for range 3 {
		start := time.Now()
		_, err := r.Renew(context.Background(), &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: 1}, 100*time.Millisecond)
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("renewal against a silent coordinator: %v, want DeadlineExceeded", err)
		}
		if took := time.Since(start); took > testutil.Deadline(2*time.Second) {
			t.Fatalf("an attempt bounded by 100ms took %v", took)
		}
	}
}
