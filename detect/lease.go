package detect

import (
	"sync"
	"time"
)

// LeaseTable is the leader's memory of broker lease renewals, on the
// leader's monotonic clock. It is not replicated: a member that becomes
// leader calls Reset, which grants every lease a full TTL from that moment
// (a lease can only get longer by a leader change, never shorter).
//
// A lease belongs to one broker epoch: a renewal for another epoch replaces
// the entry. Its methods are safe for concurrent use.
type LeaseTable struct {
	mu          sync.Mutex
	leaderSince time.Time
	renewed     map[string]lease
	// declaring holds, per broker, the epoch for which a failover decision
	// was proposed: renewals of that epoch are refused from then on, so
	// that no agent is granted a lease while the decision is in flight.
	declaring map[string]uint64
}

type lease struct {
	epoch uint64
	at    time.Time
	// ttl is the lease granted with that renewal: a later cut of lease_ttl
	// must not shorten a lease the agent already holds.
	ttl time.Duration
}

// NewLeaseTable returns an empty table whose leadership starts at since.
func NewLeaseTable(since time.Time) *LeaseTable {
	return &LeaseTable{leaderSince: since, renewed: map[string]lease{}, declaring: map[string]uint64{}}
}

// Reset starts a new leadership at now: every lease is treated as renewed
// no earlier than now. Decisions of an earlier leadership are applied
// before a renewal of the new one passes its linearizable read, so their
// marks are dropped.
func (t *LeaseTable) Reset(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.leaderSince = now
	clear(t.declaring)
}

// LeaderSince returns the start of the current leadership.
func (t *LeaseTable) LeaderSince() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.leaderSince
}

// Renew records a renewal (or a registration) of broker at epoch at the
// leader's time at, granting ttl. It reports false, and records nothing,
// when a failover decision of broker at epoch is in flight or made (see
// BeginDeclare): the renewal must then be refused.
func (t *LeaseTable) Renew(broker string, epoch uint64, at time.Time, ttl time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.declaring[broker]; ok && e == epoch {
		return false
	}
	if cur, ok := t.renewed[broker]; ok && cur.epoch == epoch && cur.at.After(at) {
		return true
	}
	t.renewed[broker] = lease{epoch: epoch, at: at, ttl: ttl}
	return true
}

// BeginDeclare is called before a failover decision of broker at epoch is
// proposed. Atomically with the renewals, it checks that the lease expired
// at least margin before now, and if so refuses every later renewal of that
// epoch (a renewal that passed its epoch check before the decision applied
// would otherwise let the fenced broker acknowledge writes). It reports
// whether the decision may be proposed.
func (t *LeaseTable) BeginDeclare(broker string, epoch uint64, ttl, margin time.Duration, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Sub(t.expiresAtLocked(broker, epoch, ttl)) < margin {
		return false
	}
	t.declaring[broker] = epoch
	return true
}

// ForceDeclare is BeginDeclare for a manual failover, which does not wait
// for the lease to expire: it refuses every later renewal of broker at epoch
// at once and returns how long the lease may still be valid at now (zero or
// negative once expired). The recovery must not read the broker's WAL before
// that, plus the drift margin, has passed.
func (t *LeaseTable) ForceDeclare(broker string, epoch uint64, ttl time.Duration, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.declaring[broker] = epoch
	return t.expiresAtLocked(broker, epoch, ttl).Sub(now)
}

// AbortDeclare lifts the refusal of BeginDeclare after the decision was
// refused by the state machine (it will not apply).
func (t *LeaseTable) AbortDeclare(broker string, epoch uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.declaring[broker]; ok && e == epoch {
		delete(t.declaring, broker)
	}
}

// Forget drops a broker's entry.
func (t *LeaseTable) Forget(broker string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.renewed, broker)
}

// ExpiresAt returns when the lease of broker at epoch expires under the
// current ttl: its last renewal at that epoch plus the longer of the ttl it
// was granted and ttl, or the start of the leadership plus ttl, whichever is
// later.
func (t *LeaseTable) ExpiresAt(broker string, epoch uint64, ttl time.Duration) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.expiresAtLocked(broker, epoch, ttl)
}

func (t *LeaseTable) expiresAtLocked(broker string, epoch uint64, ttl time.Duration) time.Time {
	exp := t.leaderSince.Add(ttl)
	if l, ok := t.renewed[broker]; ok && l.epoch == epoch {
		if e := l.at.Add(max(l.ttl, ttl)); e.After(exp) {
			exp = e
		}
	}
	return exp
}

// Remaining returns how long the lease of broker at epoch has left at now
// (negative once expired).
func (t *LeaseTable) Remaining(broker string, epoch uint64, ttl time.Duration, now time.Time) time.Duration {
	return t.ExpiresAt(broker, epoch, ttl).Sub(now)
}
