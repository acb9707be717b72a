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
	return &LeaseTable{leaderSince: since, renewed: map[string]lease{}}
}

// Reset starts a new leadership at now: every lease is treated as renewed
// no earlier than now.
func (t *LeaseTable) Reset(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.leaderSince = now
}

// LeaderSince returns the start of the current leadership.
func (t *LeaseTable) LeaderSince() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.leaderSince
}

// Renew records a renewal (or a registration) of broker at epoch at the
// leader's time at, granting ttl.
func (t *LeaseTable) Renew(broker string, epoch uint64, at time.Time, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.renewed[broker]; ok && cur.epoch == epoch && cur.at.After(at) {
		return
	}
	t.renewed[broker] = lease{epoch: epoch, at: at, ttl: ttl}
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
