package lease

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestSlotsRenewIn: a grant asks for the renewal at the last slot boundary
// no later than a third of the lease after it, so that grants made at
// different moments of one slot ask for the same moment, and an agent that
// follows the requests renews every third of the lease once it is on a
// boundary, with the slot adjusted to fill the third whole.
func TestSlotsRenewIn(t *testing.T) {
	for _, tc := range []struct {
		ttl, slot, eff time.Duration // eff: the slot after adjustment
	}{
		{3 * time.Second, 100 * time.Millisecond, 100 * time.Millisecond},
		{2 * time.Second, 100 * time.Millisecond, 2 * time.Second / 3 / 7}, // 666.67ms: 7 slots of 95.2ms
		{600 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		{3 * time.Second, 400 * time.Millisecond, time.Second / 3},
		{3 * time.Second, 500 * time.Millisecond, 500 * time.Millisecond},
	} {
		s := NewSlots(tc.slot)
		period := tc.ttl / 3
		r := rand.New(rand.NewPCG(1, uint64(tc.ttl+tc.slot)))
		targets := map[time.Duration]bool{}
		for range 1000 {
			now := s.base.Add(time.Duration(r.Int64N(int64(time.Hour))))
			in := s.RenewIn(now, tc.ttl)
			if in <= period-tc.eff || in > period {
				t.Fatalf("ttl %v, slot %v: RenewIn %v, want in (%v, %v]", tc.ttl, tc.slot, in, period-tc.eff, period)
			}
			if at := now.Add(in).Sub(s.base); at%tc.eff != 0 {
				t.Fatalf("ttl %v, slot %v: renewal at %v is %v past a boundary of %v", tc.ttl, tc.slot, at, at%tc.eff, tc.eff)
			}
			if in < tc.ttl/6 || NextRenewal(tc.ttl, 0, in) != in {
				t.Fatalf("ttl %v, slot %v: an agent does not follow RenewIn %v", tc.ttl, tc.slot, in)
			}
		}
		// Grants made across one slot ask for the same moment.
		start := s.base.Add(time.Duration(r.Int64N(int64(time.Hour))) / tc.eff * tc.eff)
		for d := time.Duration(0); d < tc.eff; d += tc.eff / 10 {
			targets[start.Add(d).Add(s.RenewIn(start.Add(d), tc.ttl)).Sub(s.base)] = true
		}
		if len(targets) != 1 {
			t.Fatalf("ttl %v, slot %v: grants within one slot ask for %d different moments", tc.ttl, tc.slot, len(targets))
		}
		// An agent following the requests, its renewals arriving 0–2ms
		// after it sends them, renews every third of the lease after the
		// first (within the rounding of period/n to the nanosecond).
		now := start.Add(37 * time.Millisecond)
		var last time.Time
		for i := range 20 {
			sent := now.Add(s.RenewIn(now, tc.ttl))
			now = sent.Add(time.Duration(r.Int64N(int64(2 * time.Millisecond))))
			if i > 1 {
				if d := sent.Sub(last) - period; d < -time.Microsecond || d > 0 {
					t.Fatalf("ttl %v, slot %v: renewal %d came %v after the one before, want %v", tc.ttl, tc.slot, i, sent.Sub(last), period)
				}
			}
			last = sent
		}
	}
}

// TestSlotsOff: no request when the slots are off, nil, or too long for a
// third of the lease to hold two of them.
func TestSlotsOff(t *testing.T) {
	now := time.Now()
	var nilSlots *Slots
	for _, tc := range []struct {
		s   *Slots
		ttl time.Duration
	}{
		{NewSlots(0), 3 * time.Second},
		{NewSlots(-time.Second), 3 * time.Second},
		{nilSlots, 3 * time.Second},
		{NewSlots(501 * time.Millisecond), 3 * time.Second},
		{NewSlots(100 * time.Millisecond), 500 * time.Millisecond},
		{NewSlots(time.Millisecond), 0},
	} {
		if in := tc.s.RenewIn(now, tc.ttl); in != 0 {
			t.Errorf("slot %v, ttl %v: RenewIn %v, want 0", tc.s.Slot(), tc.ttl, in)
		}
	}
}

// TestNextRenewal: an agent renews a third of the lease after it sent the
// renewal, or sooner at the coordinator's request, never later and never
// sooner than a sixth of the lease.
func TestNextRenewal(t *testing.T) {
	const ttl = 3 * time.Second
	for _, tc := range []struct {
		elapsed, renewIn, want time.Duration
	}{
		{10 * time.Millisecond, 0, 990 * time.Millisecond},                                      // no request
		{10 * time.Millisecond, 900 * time.Millisecond, 900 * time.Millisecond},                 // sooner: followed
		{10 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond},                 // a sixth: followed
		{10 * time.Millisecond, 499 * time.Millisecond, 990 * time.Millisecond},                 // too soon: ignored
		{10 * time.Millisecond, 995 * time.Millisecond, 990 * time.Millisecond},                 // later: ignored
		{600 * time.Millisecond, 800 * time.Millisecond, 400 * time.Millisecond},                // a slow answer: own schedule
		{1200 * time.Millisecond, 900 * time.Millisecond, -200 * time.Millisecond},              // overdue: now
		{10 * time.Millisecond, time.Duration(1<<62) * time.Nanosecond, 990 * time.Millisecond}, // absurd: ignored
	} {
		if got := NextRenewal(ttl, tc.elapsed, tc.renewIn); got != tc.want {
			t.Errorf("NextRenewal(%v, %v, %v) = %v, want %v", ttl, tc.elapsed, tc.renewIn, got, tc.want)
		}
	}
}
