package detect

import (
	"context"
	"sync"
	"testing"
	"time"

	"walden/fencing"
	waldenv1 "walden/proto/walden/v1"
)

// TestRenewalDuringDecisionRefused: a renewal that reaches the leader while
// the failover decision of its epoch is in flight (it passed its epoch check
// before the decision applied) must not be granted, or the fenced broker
// would acknowledge writes for a lease_ttl while its WAL is recovered.
func TestRenewalDuringDecisionRefused(t *testing.T) {
	st := &fakeState{brokers: map[string]*waldenv1.Broker{"b1": {BrokerId: "b1", Epoch: 1, State: StateSuspect,
		Observations: []*waldenv1.Observation{{ObserverId: "c2", State: StateSuspect}, {ObserverId: "c3", State: StateDead}}}}}
	var mu sync.Mutex
	now := time.Unix(6_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	p := &waldenv1.Policy{FailureTimeoutMs: 1500, LeaseTtlMs: 600, DriftMarginMs: 200, MaxConcurrentRecoveries: 4, MaxFailedFraction: 0.5, CooldownMs: 60000}
	ttl := 600 * time.Millisecond
	leases := NewLeaseTable(clock())
	var inFlight []bool
	var refuse error
	propose := func(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
		if df := cmd.GetDeclareFailed(); df != nil {
			// The agent's renewal arrives between the decision and its apply.
			inFlight = append(inFlight, leases.Renew(df.GetBrokerId(), df.GetEpoch(), clock(), ttl))
			if refuse != nil {
				err := refuse
				refuse = nil
				return nil, err
			}
		}
		return st.propose(ctx, cmd)
	}
	d := NewDecider(DeciderConfig{NodeID: "c1", Now: clock}, &fakeCluster{leader: true, term: 1}, st, func() *waldenv1.Policy { return p }, leases, propose)
	ctx := context.Background()

	// First decision refused by the state machine: renewals of the epoch
	// are granted again afterwards.
	refuse = fencing.ErrMaintenance
	d.Tick(ctx)
	advance(1600 * time.Millisecond)
	d.Tick(ctx)
	if len(inFlight) != 1 || inFlight[0] {
		t.Fatalf("renewals during the decision: %v, want one refused", inFlight)
	}
	if !leases.Renew("b1", 1, clock(), ttl) {
		t.Fatal("renewal refused after the decision was refused by the state machine")
	}
	// The lease was just renewed: no decision until it expired again.
	d.Tick(ctx)
	if len(inFlight) != 1 {
		t.Fatalf("decided with a fresh lease")
	}
	advance(900 * time.Millisecond)
	d.Tick(ctx)
	if len(inFlight) != 2 || inFlight[1] {
		t.Fatalf("renewals during the decision: %v, want the second refused", inFlight)
	}
	if st.Brokers()[0].GetEpoch() != 2 {
		t.Fatalf("broker epoch %d, want 2 (declared)", st.Brokers()[0].GetEpoch())
	}
	// The epoch stays refused after the decision applied.
	if leases.Renew("b1", 1, clock(), ttl) {
		t.Fatal("renewal of the fenced epoch granted after the decision")
	}
	if !leases.Renew("b1", 2, clock(), ttl) {
		t.Fatal("renewal of the new epoch refused")
	}
}

// TestForceDeclareRefusesRenewalsAndReportsTheLease checks the manual
// failover's hold on the lease table: from the call on, renewals of the
// epoch are refused, and the answer is how long the lease may still run.
func TestForceDeclareRefusesRenewalsAndReportsTheLease(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lt := NewLeaseTable(t0)
	ttl := 3 * time.Second
	if !lt.Renew("b1", 4, t0.Add(10*time.Second), ttl) {
		t.Fatal("renewal before the decision refused")
	}
	if rem := lt.ForceDeclare("b1", 4, ttl, t0.Add(11*time.Second)); rem != 2*time.Second {
		t.Fatalf("remaining lease = %s, want 2s", rem)
	}
	if lt.Renew("b1", 4, t0.Add(12*time.Second), ttl) {
		t.Fatal("renewal of the epoch accepted after a manual failover began")
	}
	if !lt.Renew("b2", 1, t0.Add(12*time.Second), ttl) {
		t.Fatal("another broker's renewal refused")
	}
	lt.AbortDeclare("b1", 4)
	if !lt.Renew("b1", 4, t0.Add(13*time.Second), ttl) {
		t.Fatal("renewal still refused after the decision was refused")
	}
}
