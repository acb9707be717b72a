package lease

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Key names one broker epoch.
type Key struct {
	Broker string `json:"broker"`
	Epoch  uint64 `json:"epoch"`
}

func (k Key) String() string { return fmt.Sprintf("%s@%d", k.Broker, k.Epoch) }

// Errors of Grant.
var (
	// ErrQuiet is returned while a restarted coordinator waits out the
	// longest lease it may have granted before it stopped.
	ErrQuiet = errors.New("lease: coordinator restarted less than a lease ago")
	// ErrPromised is returned for an epoch this coordinator promised never
	// to grant again (it attested that its grant expired).
	ErrPromised = errors.New("lease: this coordinator attested the lease expired")
	// ErrStore is returned when the durable state could not be saved: the
	// coordinator grants and attests nothing it could not remember.
	ErrStore = errors.New("lease: cannot save the lease state")
	// ErrNoHorizon is returned until the coordinator has applied the
	// cluster's lease horizon (ClusterHorizon): the longest lease a former
	// incarnation of this member may have granted.
	ErrNoHorizon = errors.New("lease: the cluster's lease horizon is not applied here yet")
)

// QuietError is ErrQuiet with how long the coordinator still waits: a
// renewal sent after Remaining can be granted (Grant and GrantAt return
// it; errors.Is(err, ErrQuiet) holds).
type QuietError struct {
	Remaining time.Duration
}

func (e *QuietError) Error() string {
	return fmt.Sprintf("%v (%s more)", ErrQuiet, e.Remaining.Round(time.Millisecond))
}

func (e *QuietError) Unwrap() error { return ErrQuiet }

// Grantor is one coordinator's side of the quorum lease: it grants renewals
// from its own boot clock, tells when it may attest that its grant for a
// broker epoch expired, and keeps the promises that attesting makes. Its
// methods are safe for concurrent use.
//
// Rules (docs/safety.md):
//   - After a start, it neither grants nor attests until the longest TTL plus
//     drift it may have granted with before (from its Store) has passed: it
//     forgot those grants.
//   - Nor before it applied the cluster's lease horizon (ClusterHorizon),
//     the longest TTL plus drift the cluster ever used, and that has passed
//     since the start too: a member whose data dir was lost or replaced, or
//     that replaces a member under its name, does not know what the former
//     incarnation granted, and its own config file may say less.
//   - It may attest for k only when its last grant of k, if any, is over by
//     that grant's TTL plus drift on its own clock.
//   - Before it attests it promises, durably, to grant k nothing more; the
//     promise is lifted only by Withdrawn, once its withdrawal is committed.
//
// A grant waits for no disk: the store is written with only saveMu held,
// and a promise being written already refuses the grants of its key. (An
// fsync under the lock every grant takes held every renewal of the
// coordinator for as long as the disk took, which on a loaded host made
// other brokers' renewals late, hence more promises.)
type Grantor struct {
	// saveMu serializes the changes of the durable state: each is computed
	// from the state in force and written while it is held. It is taken
	// before mu.
	saveMu     sync.Mutex
	mu         sync.Mutex
	clock      Clock
	store      Store
	quietUntil time.Duration
	started    time.Duration
	// horizon is the cluster's lease horizon; horizonKnown is false until
	// ClusterHorizon was called.
	horizon      time.Duration
	horizonKnown bool
	durable      Durable
	// promising is the key whose promise is being written: refused as if
	// promised until the write ends.
	promising *Key
	grants    map[Key]granted
	seen      map[Key]time.Duration // first reading at which k was current here
	heard     map[Key]time.Duration // last renewal request of k, granted or not
}

type granted struct {
	at, ttl, drift time.Duration
}

// NewGrantor loads the durable state and starts the quiet period: the
// longest of the stored TTL plus drift and ttl plus drift (the policy in
// force now), from now.
func NewGrantor(clock Clock, store Store, ttl, drift time.Duration) (*Grantor, error) {
	d, err := store.Load()
	if err != nil {
		return nil, err
	}
	d.MaxTTL, d.MaxDrift = max(d.MaxTTL, ttl), max(d.MaxDrift, drift)
	g := &Grantor{clock: clock, store: store, durable: d,
		grants: map[Key]granted{}, seen: map[Key]time.Duration{}, heard: map[Key]time.Duration{}}
	g.started = clock.Now()
	g.quietUntil = g.started + d.MaxTTL + d.MaxDrift
	return g, nil
}

// ClusterHorizon tells the grantor the cluster's lease horizon, from the
// applied state (fsm.State.LeaseHorizon): the longest TTL plus drift the
// cluster's policy ever had. Until the first call it grants and attests
// nothing; the quiet period lasts at least the horizon from the start. A
// shorter horizon than one told before changes nothing.
func (g *Grantor) ClusterHorizon(h time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.horizonKnown && h <= g.horizon {
		return
	}
	g.horizon, g.horizonKnown = max(g.horizon, h), true
	g.quietUntil = max(g.quietUntil, g.started+g.horizon)
}

// QuietFor returns how long the quiet period after the start still lasts,
// as known now (the cluster's horizon may lengthen it).
func (g *Grantor) QuietFor() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(g.quietUntil-g.clock.Now(), 0)
}

// Grant grants a renewal of k for ttl, with drift the allowance this
// coordinator will add before it attests. It records the request as heard
// even when it refuses.
func (g *Grantor) Grant(k Key, ttl, drift time.Duration) error {
	return g.grant(k, ttl, drift, nil)
}

// GrantAt is Grant with a boot-clock reading the caller took: one reading
// for a batch of renewals instead of one each. The reading must be taken
// after every renewal it is used for was received, so after the agent sent
// it; it is then no later than the moment of the grant, and a grant taken
// from it is over on this coordinator's clock no later than one taken at
// that moment, never before the agent stops counting it (docs/safety.md,
// "One boot-clock reading per batch"). A reading older than one used
// before for k counts as that one: the last grant's start never moves
// back.
func (g *Grantor) GrantAt(k Key, ttl, drift, now time.Duration) error {
	return g.grant(k, ttl, drift, &now)
}

// grant grants at *at, or at a reading taken under the lock when at is
// nil. A grant with a longer TTL or drift than any before raises the
// stored high-water mark first, holding saveMu too (once per policy
// raise).
func (g *Grantor) grant(k Key, ttl, drift time.Duration, at *time.Duration) error {
	g.mu.Lock()
	if ttl > g.durable.MaxTTL || drift > g.durable.MaxDrift {
		g.mu.Unlock()
		g.saveMu.Lock()
		defer g.saveMu.Unlock()
		g.mu.Lock()
	}
	defer g.mu.Unlock()
	if at != nil {
		return g.grantLocked(k, ttl, drift, *at)
	}
	return g.grantLocked(k, ttl, drift, g.clock.Now())
}

// grantLocked grants k at now; mu is held, and saveMu too when the grant
// raises the high-water mark.
func (g *Grantor) grantLocked(k Key, ttl, drift, now time.Duration) error {
	if last, ok := g.heard[k]; ok && last > now {
		now = last
	}
	if gr, ok := g.grants[k]; ok && gr.at > now {
		now = gr.at
	}
	g.heard[k] = now
	if _, ok := g.seen[k]; !ok {
		g.seen[k] = now
	}
	if !g.horizonKnown {
		return ErrNoHorizon
	}
	if now < g.quietUntil {
		return &QuietError{Remaining: g.quietUntil - now}
	}
	if g.promisedLocked(k) {
		return ErrPromised
	}
	if ttl > g.durable.MaxTTL || drift > g.durable.MaxDrift {
		next := g.durable
		next.MaxTTL, next.MaxDrift = max(next.MaxTTL, ttl), max(next.MaxDrift, drift)
		if err := g.store.Save(next); err != nil {
			return fmt.Errorf("%w: %w", ErrStore, err)
		}
		g.durable = next
	}
	g.grants[k] = granted{at: now, ttl: ttl, drift: drift}
	return nil
}

// Seen records that k is the current epoch of its broker here (a
// registration applied); the attestation clock of an epoch never granted
// starts at the first such reading.
func (g *Grantor) Seen(k Key) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.seen[k]; !ok {
		g.seen[k] = g.clock.Now()
	}
}

// MayAttest reports whether this coordinator may attest now that no grant
// of its for k is live: the quiet period is over and its last grant of k,
// if any, ended more than that grant's drift ago. It is the safety
// condition only; ShouldAttest adds the liveness condition.
func (g *Grantor) MayAttest(k Key) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mayAttestLocked(k, g.clock.Now())
}

func (g *Grantor) mayAttestLocked(k Key, now time.Duration) bool {
	if !g.horizonKnown || now < g.quietUntil {
		return false
	}
	if gr, ok := g.grants[k]; ok {
		return now > gr.at+gr.ttl+gr.drift
	}
	return true
}

// Clock is the clock the grantor reads.
func (g *Grantor) Clock() Clock { return g.clock }

// ShouldAttest reports whether this coordinator should attest for k now:
// it may (MayAttest), and it has not heard a renewal of k for ttl + drift
// (counted from when it first saw k current if it never heard one). A
// requested failover does not wait for silence.
func (g *Grantor) ShouldAttest(k Key, ttl, drift time.Duration, failoverRequested bool) bool {
	return g.ShouldAttestAt(k, ttl, drift, failoverRequested, g.clock.Now())
}

// ShouldAttestAt is ShouldAttest with a reading of the grantor's clock the
// caller took before the call (an observer's, taken once for all it
// decides about k in one round). A reading earlier than the call only
// makes this coordinator's grants and the renewals it heard look younger:
// it may delay an attestation, never bring one forward while a grant of
// its may be live.
func (g *Grantor) ShouldAttestAt(k Key, ttl, drift time.Duration, failoverRequested bool, now time.Duration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.mayAttestLocked(k, now) {
		return false
	}
	if failoverRequested {
		return true
	}
	last, ok := g.heard[k]
	if !ok {
		if last, ok = g.seen[k]; !ok {
			g.seen[k] = now
			return false
		}
	}
	return now > last+ttl+drift
}

// Heard returns the boot-clock reading of the last renewal request of k
// this coordinator received (granted or not).
func (g *Grantor) Heard(k Key) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.heard[k]
	return at, ok
}

// HeardWithin reports whether a renewal of k was heard within d.
func (g *Grantor) HeardWithin(k Key, d time.Duration) bool {
	return g.HeardWithinAt(k, d, g.clock.Now())
}

// HeardWithinAt reports whether a renewal of k was heard within d of now,
// a reading of the grantor's clock the caller took (one for many keys: a
// reading each would be a system call each). A renewal heard after now
// was heard within d.
func (g *Grantor) HeardWithinAt(k Key, d, now time.Duration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	last, ok := g.heard[k]
	return ok && now-last < d
}

// Promise durably promises to grant k nothing more; the attestation may be
// proposed once it returns nil. It refuses (without promising) when the
// attestation is not allowed now.
//
// From the check that allows it, k is refused every grant: during the
// write (the grants of other keys go on), and for good once it is written.
func (g *Grantor) Promise(k Key) error {
	g.saveMu.Lock()
	defer g.saveMu.Unlock()
	g.mu.Lock()
	if !g.mayAttestLocked(k, g.clock.Now()) {
		g.mu.Unlock()
		return fmt.Errorf("lease: %s: a grant of this coordinator may still be live", k)
	}
	if g.promisedLocked(k) {
		g.mu.Unlock()
		return nil
	}
	next := g.durable
	next.Promises = append(slices.Clone(next.Promises), k)
	g.promising = &k
	g.mu.Unlock()
	err := g.store.Save(next)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.promising = nil
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStore, err)
	}
	g.durable = next
	return nil
}

// Promised reports whether this coordinator promised not to grant k.
func (g *Grantor) Promised(k Key) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.promisedLocked(k)
}

func (g *Grantor) promisedLocked(k Key) bool {
	return (g.promising != nil && *g.promising == k) || slices.Contains(g.durable.Promises, k)
}

// Withdrawn lifts the promise for k: call it only once the withdrawal of
// the attestation is committed and applied here, so that no decision can
// count the attestation any more.
func (g *Grantor) Withdrawn(k Key) error {
	return g.dropPromises(func(p Key) bool { return p == k })
}

// Retire forgets everything about the epochs of broker other than current
// (0: every epoch of broker): a fenced or re-registered epoch is never
// granted again anyway, so its promise is no longer needed.
func (g *Grantor) Retire(broker string, current uint64) error {
	g.mu.Lock()
	for k := range g.grants {
		if k.Broker == broker && k.Epoch != current {
			delete(g.grants, k)
		}
	}
	for _, m := range []map[Key]time.Duration{g.seen, g.heard} {
		for k := range m {
			if k.Broker == broker && k.Epoch != current {
				delete(m, k)
			}
		}
	}
	g.mu.Unlock()
	return g.dropPromises(func(p Key) bool { return p.Broker == broker && p.Epoch != current })
}

// dropPromises lifts the promises drop selects. Until the write ends they
// still refuse their keys' grants.
func (g *Grantor) dropPromises(drop func(Key) bool) error {
	g.saveMu.Lock()
	defer g.saveMu.Unlock()
	g.mu.Lock()
	if !slices.ContainsFunc(g.durable.Promises, drop) {
		g.mu.Unlock()
		return nil
	}
	next := g.durable
	next.Promises = slices.DeleteFunc(slices.Clone(next.Promises), drop)
	g.mu.Unlock()
	if err := g.store.Save(next); err != nil {
		return fmt.Errorf("%w: %w", ErrStore, err)
	}
	g.mu.Lock()
	g.durable = next
	g.mu.Unlock()
	return nil
}

// Remaining returns how long this coordinator's last grant of k has left
// (negative once over; ok false when it never granted k).
func (g *Grantor) Remaining(k Key) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gr, ok := g.grants[k]
	if !ok {
		return 0, false
	}
	return gr.at + gr.ttl - g.clock.Now(), true
}

// Promises returns the promised keys, sorted (status and tests).
func (g *Grantor) Promises() []Key {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := slices.Clone(g.durable.Promises)
	slices.SortFunc(out, func(a, b Key) int {
		if c := strings.Compare(a.Broker, b.Broker); c != 0 {
			return c
		}
		return cmp.Compare(a.Epoch, b.Epoch)
	})
	return out
}
