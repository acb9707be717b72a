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
	"testing"
	"time"

	"walden/config"
	"walden/gossip"
)

const (
	testTTL    = 300 * time.Millisecond
	testMargin = 50 * time.Millisecond
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

// manualClock is a monotonic clock that moves only when the test says so.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func TestRegistersAndRenews(t *testing.T) {
	f := newFakeLeader(testTTL, testDrift)
	a := startAgent(t, testConfig(serveAgent(t, f)), Options{})
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
	// Several renewals of epoch 1 (one every ttl/3) and no second
	// registration.
	eventually(t, 5*time.Second, "renewals", func() error {
		if s := f.stats(); s.renewals < 4 {
			return errorf("%d renewals", s.renewals)
		}
		return nil
	})
	s := f.stats()
	if s.registers != 1 || s.epoch != 1 {
		t.Fatalf("fake saw %+v, want one registration and epoch 1", s)
	}
	if err := a.Check(); err != nil {
		// The lease can lapse on a machine that stalls longer than
		// ttl-margin; only ErrLeaseExpired is acceptable then.
		if !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("Check = %v", err)
		}
	}
	f.mu.Lock()
	req := f.lastRegister
	f.mu.Unlock()
	if req.GetBrokerId() != "b1" || req.GetAgentAddr() != a.Addr() || req.GetWal().GetPath() != "/var/lib/broker/b1.wal" ||
		req.GetWal().GetVolumeId() != "vol-b1" || req.GetGossipName() != "agent/b1" {
		t.Fatalf("RegisterRequest = %v (agent addr %s)", req, a.Addr())
	}
}

// TestLeaseBoundsOnInjectedClock checks the self-fencing instant exactly: the
// lease is valid until the send time of the last successful renewal plus
// lease_ttl minus the margin, and that instant is strictly before the
// leader's earliest expiry (its receive time plus lease_ttl plus drift).
func TestLeaseBoundsOnInjectedClock(t *testing.T) {
	clk := &manualClock{t: time.Now()}
	t0 := clk.Now()
	f := newFakeLeader(testTTL, testDrift)
	f.clock = clk
	a := startAgent(t, testConfig(serveAgent(t, f)), Options{Clock: clk})
	l := waitRegistered(t, a)
	// Every renewal from now on hangs: the leader's last receive time and
	// the agent's last send time are both t0 (the clock has not moved).
	f.setHang(true)
	if l.Remaining != testTTL-testMargin {
		t.Fatalf("remaining at t0 = %s, want %s", l.Remaining, testTTL-testMargin)
	}
	deadline := t0.Add(testTTL - testMargin)

	clk.set(deadline.Add(-time.Millisecond))
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
	if exp := f.leaderExpiry(); !deadline.Before(exp) {
		t.Fatalf("agent deadline %s is not before the leader's expiry %s", deadline.Sub(t0), exp.Sub(t0))
	}

	// A renewal sent later confirms the lease again from its send time.
	clk.set(deadline.Add(time.Second))
	f.setHang(false)
	eventually(t, 5*time.Second, "renewed", func() error {
		if l := a.Lease(); !l.Valid || l.Remaining != testTTL-testMargin {
			return errorf("lease %+v", l)
		}
		return nil
	})
}

// TestCoordinatorUnreachableSelfFences cuts the agent off (renewals hang) on
// the real clock: valid turns false, and the instant it does is no later
// than the last successful send plus lease_ttl minus the margin, which is
// strictly before the leader's earliest expiry.
func TestCoordinatorUnreachableSelfFences(t *testing.T) {
	f := newFakeLeader(testTTL, testDrift)
	a := startAgent(t, testConfig(serveAgent(t, f)), Options{})
	waitRegistered(t, a)
	eventually(t, 5*time.Second, "renewals", func() error {
		if s := f.stats(); s.renewals < 3 {
			return errorf("%d renewals", s.renewals)
		}
		return nil
	})
	f.setHang(true)
	eventually(t, 5*time.Second, "valid:false", func() error {
		if l := a.Lease(); l.Valid {
			return errorf("still valid: %+v", l)
		}
		return nil
	})
	a.mu.Lock()
	sent, ttl := a.st.confirmedSent, a.st.confirmedTTL
	a.mu.Unlock()
	deadline := sent.Add(ttl - testMargin)
	recv := f.stats().lastRecv
	if sent.After(recv) {
		t.Fatalf("last confirmed send %s after the leader's last receive %s", sent, recv)
	}
	if !deadline.Before(f.leaderExpiry()) {
		t.Fatalf("deadline %s not before leader expiry %s", deadline, f.leaderExpiry())
	}
	a.mu.Lock()
	atDeadline := a.leaseLocked(deadline)
	justBefore := a.leaseLocked(deadline.Add(-time.Nanosecond))
	atLeaderExpiry := a.leaseLocked(f.leaderExpiry())
	a.mu.Unlock()
	if atDeadline.Valid || !justBefore.Valid || atLeaderExpiry.Valid {
		t.Fatalf("lease at deadline %+v, 1ns before %+v, at leader expiry %+v", atDeadline, justBefore, atLeaderExpiry)
	}
	if err := a.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check = %v, want ErrLeaseExpired", err)
	}
	// Reachable again: the same epoch is confirmed again.
	f.setHang(false)
	l := waitRegistered(t, a)
	if l.Epoch != 1 {
		t.Fatalf("epoch after reconnecting = %d, want 1", l.Epoch)
	}
}

// TestFencedReregisters: a failover fences the broker while it is cut off
// from nothing; the agent reports fenced:true at once, waits while the
// recovery runs, then registers with a new epoch and reports the recovered
// WAL offset.
func TestFencedReregisters(t *testing.T) {
	f := newFakeLeader(testTTL, testDrift)
	epochs := make(chan Lease, 8)
	a := startAgentWith(t, testConfig(serveAgent(t, f)), Options{}, func(a *Agent) {
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

	f.failover() // epoch 2 fenced, recovery running
	eventually(t, 5*time.Second, "fenced", func() error {
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
	before := f.stats().registers
	eventually(t, 5*time.Second, "registration retried", func() error {
		if n := f.stats().registers; n < before+2 {
			return errorf("%d registrations", n)
		}
		return nil
	})
	if l := a.Lease(); !l.Fenced || l.Valid {
		t.Fatalf("lease while the recovery runs = %+v", l)
	}

	f.finishRecovery(16384)
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

// TestEpochExpiredReregisters: the leader's epoch moved on without a fenced
// flag (EPOCH_EXPIRED); the agent registers again at once.
func TestEpochExpiredReregisters(t *testing.T) {
	f := newFakeLeader(testTTL, testDrift)
	a := startAgent(t, testConfig(serveAgent(t, f)), Options{})
	waitRegistered(t, a)
	f.mu.Lock()
	f.epoch = 7
	f.nextEpoch = 8
	f.mu.Unlock()
	eventually(t, 5*time.Second, "new epoch", func() error {
		if l := a.Lease(); l.Epoch != 8 || !l.Valid || l.Fenced {
			return errorf("lease %+v", l)
		}
		return nil
	})
}

func TestRegistrationWaitsForRecovery(t *testing.T) {
	f := newFakeLeader(testTTL, testDrift)
	f.recoveryRunning = true
	a := startAgent(t, testConfig(serveAgent(t, f)), Options{})
	eventually(t, 5*time.Second, "registration retried", func() error {
		if n := f.stats().registers; n < 3 {
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
	f.finishRecovery(8192)
	l := waitRegistered(t, a)
	if l.Epoch != 1 || a.RecoveredWALOffset() != 8192 {
		t.Fatalf("lease %+v, recovered %d", l, a.RecoveredWALOffset())
	}
}

// TestFollowsLeaderHint: the first coordinator is down, the second is a
// follower that names the leader; the agent registers and renews with the
// leader.
func TestFollowsLeaderHint(t *testing.T) {
	for _, inDetail := range []bool{false, true} {
		name := "trailer"
		if inDetail {
			name = "error_detail"
		}
		t.Run(name, func(t *testing.T) {
			f := newFakeLeader(testTTL, testDrift)
			leader := serveAgent(t, f)
			follower := &fakeFollower{leaderAddr: leader, inDetail: inDetail}
			a := startAgent(t, testConfig(closedAddr(t), serveAgent(t, follower)), Options{})
			l := waitRegistered(t, a)
			if l.Epoch != 1 {
				t.Fatalf("lease %+v", l)
			}
			if follower.count() == 0 {
				t.Fatal("the follower was never asked")
			}
			// Renewals go straight to the leader from now on (the
			// follower is asked again only after a renewal failed).
			asked := follower.count()
			eventually(t, 5*time.Second, "renewals", func() error {
				if s := f.stats(); s.renewals < 4 {
					return errorf("%d renewals", s.renewals)
				}
				return nil
			})
			if extra, renewals := follower.count()-asked, f.stats().renewals; extra >= renewals {
				t.Fatalf("follower asked %d times after registration, for %d renewals", extra, renewals)
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
	f := newFakeLeader(testTTL, testDrift)
	f.recoveryRunning = true
	a := startAgent(t, testConfig(serveAgent(t, f)), Options{})

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
	f.finishRecovery(-1)
	waitRegistered(t, a)
	eventually(t, 5*time.Second, "valid in JSON", func() error {
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

	f := newFakeLeader(testTTL, testDrift)
	cfg := testConfig(serveAgent(t, f))
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
	eventually(t, 5*time.Second, "agent in the pool", func() error {
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
	eventually(t, 5*time.Second, "agent left", func() error {
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
