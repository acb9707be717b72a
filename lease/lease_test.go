package lease

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var three = Voters{IDs: []string{"c1", "c2", "c3"}, Index: 10}

func TestHolderNeedsAMajorityOfLiveGrants(t *testing.T) {
	h := NewHolder(500 * time.Millisecond)
	h.SetEpoch(7)
	if ok, _ := h.Valid(0); ok {
		t.Fatal("valid with no grant")
	}
	h.Granted(Grant{Coordinator: "c1", Epoch: 7, Sent: 0, TTL: 3 * time.Second}, three)
	if ok, _ := h.Valid(time.Millisecond); ok {
		t.Fatal("valid with one grant of three")
	}
	h.Granted(Grant{Coordinator: "c2", Epoch: 7, Sent: time.Second, TTL: 3 * time.Second}, three)
	// Deadlines: c1 2.5s, c2 3.5s: the majority-th latest is 2.5s.
	if ok, rem := h.Valid(2*time.Second + 499*time.Millisecond); !ok || rem != time.Millisecond {
		t.Fatalf("valid 1ms before the second deadline: %v %v", ok, rem)
	}
	if ok, _ := h.Valid(2500 * time.Millisecond); ok {
		t.Fatal("valid at the deadline")
	}
	h.Granted(Grant{Coordinator: "c3", Epoch: 7, Sent: 2 * time.Second, TTL: 3 * time.Second}, three)
	if ok, rem := h.Valid(3 * time.Second); !ok || rem != 500*time.Millisecond {
		t.Fatalf("c2 and c3 live at 3s: %v %v", ok, rem)
	}
	// A grant of another epoch counts for nothing; an older send of the
	// same coordinator does not replace a newer one.
	h.Granted(Grant{Coordinator: "c1", Epoch: 6, Sent: 3 * time.Second, TTL: time.Hour}, three)
	h.Granted(Grant{Coordinator: "c3", Epoch: 7, Sent: 0, TTL: time.Hour}, three)
	if ok, _ := h.Valid(3600 * time.Millisecond); ok {
		t.Fatal("an old grant or another epoch's grant extended the lease")
	}
	// A non-voter's grant does not count.
	h.Granted(Grant{Coordinator: "c9", Epoch: 7, Sent: 3 * time.Second, TTL: time.Hour}, three)
	if ok, _ := h.Valid(3600 * time.Millisecond); ok {
		t.Fatal("a non-voter's grant counted")
	}
	h.SetEpoch(8)
	if ok, _ := h.Valid(3 * time.Second); ok {
		t.Fatal("valid after a new epoch without grants")
	}
}

func TestHolderFollowsTheNewestConfiguration(t *testing.T) {
	h := NewHolder(0)
	h.SetEpoch(1)
	h.Granted(Grant{Coordinator: "c1", Epoch: 1, TTL: time.Second}, three)
	h.Granted(Grant{Coordinator: "c2", Epoch: 1, TTL: time.Second}, Voters{IDs: []string{"c1", "c2", "c3", "c4", "c5"}, Index: 20})
	if ok, _ := h.Valid(0); ok {
		t.Fatal("two grants of five voters made a majority")
	}
	// An older configuration reported later does not replace the newer.
	h.Granted(Grant{Coordinator: "c2", Epoch: 1, TTL: time.Second}, three)
	if got := h.Voters().Index; got != 20 {
		t.Fatalf("voters index %d, want 20", got)
	}
}

func TestGrantorQuietAfterStart(t *testing.T) {
	clk := &ManualClock{T: time.Hour}
	st := &MemStore{}
	g, err := NewGrantor(clk, st, 3*time.Second, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{"b1", 4}
	// Nothing before the cluster's horizon is known.
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); !errors.Is(err, ErrNoHorizon) {
		t.Fatalf("grant before the cluster's horizon is applied: %v", err)
	}
	g.ClusterHorizon(3500 * time.Millisecond)
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); !errors.Is(err, ErrQuiet) {
		t.Fatalf("grant during the quiet period: %v", err)
	}
	if g.MayAttest(k) {
		t.Fatal("may attest during the quiet period")
	}
	// The refusal says how long the quiet lasts still.
	clk.Advance(1200 * time.Millisecond)
	var q *QuietError
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); !errors.As(err, &q) || q.Remaining != 2300*time.Millisecond {
		t.Fatalf("grant 1.2s into a 3.5s quiet period: %v, want 2.3s more", err)
	}
	clk.Advance(2300*time.Millisecond - time.Nanosecond)
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); !errors.As(err, &q) || q.Remaining != time.Nanosecond {
		t.Fatalf("grant a nanosecond before the quiet period ends: %v", err)
	}
	clk.Advance(time.Nanosecond)
	if err := g.Grant(k, 20*time.Second, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The 20s grant raised the stored high-water mark: a restart now waits
	// 20.5s, not the 3.5s of the policy in force.
	g2, err := NewGrantor(clk, st, 3*time.Second, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	g2.ClusterHorizon(3500 * time.Millisecond)
	if q := g2.QuietFor(); q != 20500*time.Millisecond {
		t.Fatalf("quiet for %s after a restart, want 20.5s", q)
	}
}

func TestGrantorAttestsOnlyAfterItsGrantAndDrift(t *testing.T) {
	clk := &ManualClock{}
	g, _ := NewGrantor(clk, &MemStore{}, time.Second, 100*time.Millisecond)
	g.ClusterHorizon(1100 * time.Millisecond)
	clk.Advance(1100 * time.Millisecond)
	k := Key{"b1", 1}
	if err := g.Grant(k, time.Second, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	clk.Advance(1100 * time.Millisecond)
	if g.MayAttest(k) {
		t.Fatal("may attest exactly at grant + ttl + drift")
	}
	if err := g.Promise(k); err == nil {
		t.Fatal("promised while a grant may be live")
	}
	// A reading taken before the call, as an observer hands one over: an
	// older one than grant + ttl + drift attests nothing, however late
	// the call.
	before := clk.Now()
	clk.Advance(time.Nanosecond)
	if g.ShouldAttestAt(k, time.Second, 100*time.Millisecond, false, before) {
		t.Fatal("attested with a reading from before grant + ttl + drift")
	}
	if !g.MayAttest(k) || !g.ShouldAttest(k, time.Second, 100*time.Millisecond, false) ||
		!g.ShouldAttestAt(k, time.Second, 100*time.Millisecond, false, clk.Now()) {
		t.Fatal("may not attest after grant + ttl + drift")
	}
	if err := g.Promise(k); err != nil {
		t.Fatal(err)
	}
	if err := g.Grant(k, time.Second, 0); !errors.Is(err, ErrPromised) {
		t.Fatalf("granted after promising: %v", err)
	}
	// A renewal heard just now: no longer should attest (the broker talks).
	if g.ShouldAttest(k, time.Second, 100*time.Millisecond, false) {
		t.Fatal("should attest right after a renewal was heard")
	}
	if !g.ShouldAttest(k, time.Second, 100*time.Millisecond, true) {
		t.Fatal("a requested failover waits for silence")
	}
	if err := g.Withdrawn(k); err != nil {
		t.Fatal(err)
	}
	if err := g.Grant(k, time.Second, 0); err != nil {
		t.Fatalf("grant after withdrawal: %v", err)
	}
}

// A grant taken from a reading of the batch it came in (GrantAt) lasts, on
// the coordinator's clock, from that reading: the attestation waits for
// reading + ttl + drift. A reading older than the last grant's does not
// move the grant's start back, and a reading inside the quiet period is
// refused even when the clock is past it.
func TestGrantorGrantAtBatchReading(t *testing.T) {
	clk := &ManualClock{}
	g, _ := NewGrantor(clk, &MemStore{}, time.Second, 100*time.Millisecond)
	g.ClusterHorizon(1100 * time.Millisecond)
	k := Key{"b1", 1}
	clk.Advance(1200 * time.Millisecond)
	if err := g.GrantAt(k, time.Second, 100*time.Millisecond, 1000*time.Millisecond); !errors.Is(err, ErrQuiet) {
		t.Fatalf("grant at a reading inside the quiet period: %v", err)
	}
	batch := clk.T // read once for the batch
	clk.Advance(40 * time.Millisecond)
	if err := g.GrantAt(k, time.Second, 100*time.Millisecond, batch); err != nil {
		t.Fatal(err)
	}
	if rem, _ := g.Remaining(k); rem != time.Second-40*time.Millisecond {
		t.Fatalf("remaining %s, want the ttl from the batch's reading (960ms)", rem)
	}
	clk.T = batch + 1100*time.Millisecond
	if g.MayAttest(k) {
		t.Fatal("may attest at the batch's reading + ttl + drift")
	}
	clk.Advance(time.Nanosecond)
	if !g.MayAttest(k) {
		t.Fatal("may not attest after the batch's reading + ttl + drift")
	}
	// A later batch grants at a later reading; then a batch read before it
	// is handled: the grant keeps the later start.
	later := clk.T
	if err := g.GrantAt(k, time.Second, 100*time.Millisecond, later); err != nil {
		t.Fatal(err)
	}
	if err := g.GrantAt(k, time.Second, 100*time.Millisecond, later-500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if rem, _ := g.Remaining(k); rem != time.Second {
		t.Fatalf("remaining %s after an older reading: the grant's start moved back", rem)
	}
	if at, _ := g.Heard(k); at != later {
		t.Fatalf("heard at %s, want %s (never moved back)", at, later)
	}
	clk.T = later + 1100*time.Millisecond
	if g.MayAttest(k) {
		t.Fatal("may attest before the later grant is over")
	}
}

func TestGrantorPromiseSurvivesRestartAndSaveFailure(t *testing.T) {
	dir := t.TempDir()
	fs := FileStore{Path: filepath.Join(dir, "lease-state.json")}
	clk := &ManualClock{}
	g, err := NewGrantor(clk, fs, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	g.ClusterHorizon(time.Second)
	clk.Advance(2 * time.Second)
	k := Key{"b1", 3}
	if err := g.Promise(k); err != nil {
		t.Fatal(err)
	}
	g2, err := NewGrantor(clk, fs, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	g2.ClusterHorizon(time.Second)
	clk.Advance(2 * time.Second)
	if err := g2.Grant(k, time.Second, 0); !errors.Is(err, ErrPromised) {
		t.Fatalf("a restarted coordinator forgot its promise: %v", err)
	}
	if err := g2.Retire("b1", 4); err != nil {
		t.Fatal(err)
	}
	if p := g2.Promises(); len(p) != 0 {
		t.Fatalf("promises of a retired epoch kept: %v", p)
	}

	ms := &MemStore{Err: errors.New("no space left on device")}
	g3, _ := NewGrantor(clk, ms, time.Second, 0)
	g3.ClusterHorizon(time.Second)
	clk.Advance(2 * time.Second)
	if err := g3.Promise(Key{"b2", 1}); !errors.Is(err, ErrStore) {
		t.Fatalf("promise without durable state: %v", err)
	}
	if err := g3.Grant(Key{"b2", 1}, 5*time.Second, 0); !errors.Is(err, ErrStore) {
		t.Fatalf("grant above the stored TTL without durable state: %v", err)
	}
}

func TestFileStoreRefusesDamage(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lease-state.json")
	if err := os.WriteFile(p, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (FileStore{Path: p}).Load(); !errors.Is(err, ErrCorruptStore) {
		t.Fatalf("damaged file: %v", err)
	}
}

func TestRequiredDrift(t *testing.T) {
	for _, c := range []struct {
		ttl, want time.Duration
	}{
		{3 * time.Second, 7 * time.Millisecond},
		{20 * time.Second, 41 * time.Millisecond},
		{300 * time.Millisecond, time.Millisecond},
	} {
		if got := RequiredDrift(c.ttl); got != c.want {
			t.Errorf("RequiredDrift(%s) = %s, want %s", c.ttl, got, c.want)
		}
		// The inequality the value stands for.
		ttl, d := float64(c.ttl), float64(RequiredDrift(c.ttl))
		if ttl/(1-MaxRateError) > (ttl+d)/(1+MaxRateError) {
			t.Errorf("RequiredDrift(%s) does not cover the rate bound", c.ttl)
		}
	}
	if CheckDrift(3*time.Second, 6*time.Millisecond) == nil {
		t.Error("6ms accepted for 3s")
	}
}

func TestBootClockAdvances(t *testing.T) {
	a := BootClock.Now()
	time.Sleep(2 * time.Millisecond)
	if b := BootClock.Now(); b <= a {
		t.Fatalf("boot clock did not advance: %v then %v", a, b)
	}
}

// TestGrantorWaitsOutTheClusterHorizon: a member that starts without its
// lease state (an empty data dir, a replacement under its name) and whose
// config file says lease_ttl 3s waits out the cluster's horizon of 10.5s,
// the longest lease a former incarnation may have granted, before it
// grants or attests.
func TestGrantorWaitsOutTheClusterHorizon(t *testing.T) {
	clk := &ManualClock{T: time.Hour}
	g, err := NewGrantor(clk, &MemStore{}, 3*time.Second, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{"b1", 7}
	clk.Advance(4 * time.Second) // past the config file's 3.5s
	if g.MayAttest(k) {
		t.Fatal("may attest before the cluster's horizon is known")
	}
	g.ClusterHorizon(10500 * time.Millisecond)
	g.ClusterHorizon(3500 * time.Millisecond) // a shorter one changes nothing
	if q := g.QuietFor(); q != 6500*time.Millisecond {
		t.Fatalf("quiet for %s more, want 6.5s (10.5s from the start)", q)
	}
	clk.Advance(6500*time.Millisecond - time.Nanosecond)
	if g.MayAttest(k) {
		t.Fatal("may attest 1ns before the horizon")
	}
	if err := g.Grant(k, 3*time.Second, 500*time.Millisecond); !errors.Is(err, ErrQuiet) {
		t.Fatalf("grant 1ns before the horizon: %v", err)
	}
	clk.Advance(time.Nanosecond)
	if !g.MayAttest(k) {
		t.Fatal("may not attest once the horizon passed")
	}
}

// TestHolderCountsGrantsByIncarnation: c3 is replaced under its name (a
// new incarnation). The old incarnation's grant, still live, does not count
// for the new one: with c1's grant alone the lease is not valid.
func TestHolderCountsGrantsByIncarnation(t *testing.T) {
	h := NewHolder(0)
	h.SetEpoch(1)
	old := Voters{IDs: []string{"c1", "c2", "c3"}, Incarnations: []uint64{1, 2, 3}, Index: 3}
	h.Granted(Grant{Coordinator: "c3", Epoch: 1, Sent: 0, TTL: 10 * time.Second}, old)
	h.Granted(Grant{Coordinator: "c1", Epoch: 1, Sent: 0, TTL: 10 * time.Second}, old)
	if ok, _ := h.Valid(time.Second); !ok {
		t.Fatal("c1 and c3 of the same configuration: not valid")
	}
	replaced := Voters{IDs: []string{"c1", "c2", "c3"}, Incarnations: []uint64{1, 2, 40}, Index: 41}
	h.Granted(Grant{Coordinator: "c1", Epoch: 1, Sent: time.Second, TTL: 10 * time.Second}, replaced)
	if ok, _ := h.Valid(2 * time.Second); ok {
		t.Fatalf("valid on c1's grant and the grant of c3's former incarnation: %v", h.Live(2*time.Second))
	}
	if _, ok := h.Live(2 * time.Second)["c3"]; ok {
		t.Fatal("the former incarnation's grant is listed as c3's")
	}
	h.Granted(Grant{Coordinator: "c3", Epoch: 1, Sent: 2 * time.Second, TTL: 10 * time.Second}, replaced)
	if ok, _ := h.Valid(3 * time.Second); !ok {
		t.Fatal("c1 and the new c3: not valid")
	}
}

// A reading is shared only by the renewals that arrived before it was
// taken: a renewal that arrives after the last reading gets a new one.
func TestReadingsAreTakenAfterArrival(t *testing.T) {
	clk := &ManualClock{T: time.Second}
	r := NewReadings(clk)
	a, b := r.Arrived(), r.Arrived()
	clk.Advance(time.Millisecond)
	if got := r.For(a); got != 1001*time.Millisecond {
		t.Fatalf("reading for a: %v", got)
	}
	clk.Advance(time.Millisecond)
	// b arrived before a's reading: it shares it.
	if got := r.For(b); got != 1001*time.Millisecond {
		t.Fatalf("reading for b, arrived before a's reading: %v, want a's", got)
	}
	c := r.Arrived()
	if got := r.For(c); got != 1002*time.Millisecond {
		t.Fatalf("reading for c, arrived after a's reading: %v, want a new one", got)
	}
	if r.Taken() != 2 {
		t.Fatalf("%d readings for 3 renewals, want 2", r.Taken())
	}
	// Concurrent arrivals and grants: every reading a grant gets was taken
	// after its arrival (the clock only moves forward here, so the reading
	// is at least the clock's value when the renewal arrived).
	var mu sync.Mutex
	mono := ClockFunc(func() time.Duration { mu.Lock(); defer mu.Unlock(); clk.Advance(time.Microsecond); return clk.T })
	r = NewReadings(mono)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				at := mono.Now()
				tk := r.Arrived()
				if got := r.For(tk); got < at {
					t.Errorf("reading %v before the renewal arrived at %v", got, at)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestReadingIsNotSharedBackwards: a renewal that arrives while a reading
// is being taken — after the clock was read, before the reading is the
// last — must not share it: that reading lies before its arrival, and a
// grant started from it would end, on the coordinator's side, before the
// agent's lease (docs/safety.md, "One boot-clock reading per batch").
func TestReadingIsNotSharedBackwards(t *testing.T) {
	var r *Readings
	var now time.Duration
	var during Ticket
	var duringAt time.Duration
	clock := ClockFunc(func() time.Duration {
		now += time.Millisecond
		read := now
		if during == 0 {
			// A renewal arrives just after the clock was read.
			now += time.Millisecond
			duringAt = now
			during = r.Arrived()
		}
		return read
	})
	r = NewReadings(clock)
	first := r.Arrived()
	shared := r.For(first)
	if got := r.For(during); got < duringAt {
		t.Fatalf("the renewal that arrived at %v, during the reading of %v, was given %v: a reading from before it arrived", duringAt, shared, got)
	}
}

// gatedStore is a store whose Save waits until the test lets it go.
type gatedStore struct {
	MemStore
	entered chan struct{}
	release chan error
}

func (s *gatedStore) Save(d Durable) error {
	s.entered <- struct{}{}
	if err := <-s.release; err != nil {
		return err
	}
	return s.MemStore.Save(d)
}

// A promise being written refuses its key's grants and holds no other
// grant: the grants of other brokers go on while the disk writes; a write
// that fails leaves the key grantable again.
func TestPromiseWriteHoldsNoOtherGrant(t *testing.T) {
	clk := &ManualClock{}
	st := &gatedStore{entered: make(chan struct{}), release: make(chan error)}
	g, err := NewGrantor(clk, st, time.Second, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	g.ClusterHorizon(1100 * time.Millisecond)
	clk.Advance(1200 * time.Millisecond)
	k, other := Key{"b1", 1}, Key{"b2", 1}
	for _, fail := range []bool{false, true} {
		k.Epoch++
		done := make(chan error, 1)
		go func() { done <- g.Promise(k) }()
		<-st.entered // the promise is being written
		if err := g.Grant(other, time.Second, 100*time.Millisecond); err != nil {
			t.Fatalf("grant of another broker during a promise's write: %v", err)
		}
		if err := g.Grant(k, time.Second, 100*time.Millisecond); !errors.Is(err, ErrPromised) {
			t.Fatalf("grant of the key being promised: %v, want ErrPromised", err)
		}
		var werr error
		if fail {
			werr = errors.New("disk full")
		}
		st.release <- werr
		err := <-done
		switch {
		case !fail && (err != nil || !g.Promised(k)):
			t.Fatalf("promise: %v, promised %v", err, g.Promised(k))
		case fail && (!errors.Is(err, ErrStore) || g.Promised(k)):
			t.Fatalf("failed promise: %v, promised %v", err, g.Promised(k))
		case fail:
			if err := g.Grant(k, time.Second, 100*time.Millisecond); err != nil {
				t.Fatalf("grant after a promise that failed to be written: %v", err)
			}
		}
	}
}
