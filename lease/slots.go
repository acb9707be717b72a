package lease

import "time"

// MaxRenewalSlot bounds a coordinator's renewal slot (config
// renewals.slot).
const MaxRenewalSlot = time.Second

// Slots is a coordinator's renewal slots: instants on its monotonic clock,
// one slot apart, at which it asks the agents to renew, so that renewals
// arrive together and one wake-up of the coordinator answers many of them
// (docs/scale.md, "Renewal slots"). A grant tells the agent how long after
// it to renew (RenewIn): at the last slot boundary no later than a third
// of the lease after the grant, where the agent would renew anyway. The
// agent renews no later than it would without the request (NextRenewal),
// so slots change when renewals arrive, never how long a grant lasts or
// what the coordinator decides (docs/safety.md). The zero value and a nil
// *Slots are off. Its methods are safe for concurrent use.
type Slots struct {
	slot time.Duration
	base time.Time
}

// NewSlots returns the renewal slots of one slot each, counted from now;
// a slot of 0 turns them off.
func NewSlots(slot time.Duration) *Slots {
	return &Slots{slot: max(slot, 0), base: time.Now()}
}

// Slot is the slot length, 0 when off.
func (s *Slots) Slot() time.Duration {
	if s == nil {
		return 0
	}
	return s.slot
}

// RenewIn returns how long after now the agent holding a grant of ttl
// made at now should renew: the time to the last slot boundary at or
// before now + ttl/3, a duration in (ttl/3 − slot, ttl/3]. The slots are
// stretched, if needed, so that a whole number of them fills ttl/3: an
// agent then renews every third of the lease, as it would without slots,
// once its first renewal fell on a boundary. It returns 0 (no request)
// when the slots are off or ttl/3 holds fewer than two slots.
func (s *Slots) RenewIn(now time.Time, ttl time.Duration) time.Duration {
	period := ttl / 3
	if s == nil || s.slot <= 0 || period < 2*s.slot {
		return 0
	}
	n := (period + s.slot/2) / s.slot // slots per period, rounded: at least 2
	slot := period / n
	at := now.Sub(s.base) + period
	return period - at%slot
}

// NextRenewal returns how long an agent waits, now, before renewing again
// with a coordinator that granted a lease of ttl, elapsed after the agent
// sent the renewal: a third of ttl after it sent it, or sooner when the
// coordinator asked for its next renewal renewIn after the grant (0: no
// request). The request is followed only when it is sooner and at least a
// sixth of ttl, so a coordinator can make an agent renew earlier, up to
// twice as often, never later.
func NextRenewal(ttl, elapsed, renewIn time.Duration) time.Duration {
	wait := ttl/3 - elapsed
	if renewIn >= ttl/6 && renewIn < wait {
		return renewIn
	}
	return wait
}
