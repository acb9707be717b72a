package detect

import (
	"context"
	"sync"
	"testing"
	"time"

	"walden/lease"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// decisionRecorder is a DecisionMetrics that keeps what it was told.
type decisionRecorder struct {
	mu      sync.Mutex
	decided map[string]int // "outcome/reason"
	holds   map[string]int
	frozen  bool
	resets  int // SetHolds(nil)
}

func (r *decisionRecorder) Decided(outcome, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.decided == nil {
		r.decided = map[string]int{}
	}
	r.decided[outcome+"/"+reason]++
}

func (r *decisionRecorder) SetHolds(held map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if held == nil {
		r.resets++
	}
	r.holds = held
}

func (r *decisionRecorder) SetFrozen(f bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frozen = f
}

// TestDeciderReportsMetrics: the decider reports the gate that holds a
// suspect broker, the decision once it is made, and clears its holds when
// it stops leading.
func TestDeciderReportsMetrics(t *testing.T) {
	st := newClusterState(t, nil)
	epoch := st.register(t, "b1")
	clk := &lease.ManualClock{T: time.Hour}
	cl := &fakeCluster{leader: true, term: 3}
	st.term = 3
	seed := policy.Defaults()
	seed.FailureTimeoutMs, seed.LeaseTtlMs, seed.DriftMarginMs = 1500, 600, 200
	rec := &decisionRecorder{}
	d := NewDecider(DeciderConfig{NodeID: "c1", Seed: seed, Clock: clk, Metrics: rec}, cl, st, st.propose)
	ctx := context.Background()
	d.Tick(ctx) // seeds the policy
	for _, id := range []string{"c2", "c3"} {
		st.must(t, &waldenv1.Command{ProposerId: id, Op: &waldenv1.Command_ObserveBroker{ObserveBroker: &waldenv1.ObserveBroker{
			ObserverId: id, BrokerId: "b1", Epoch: epoch, ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, UnheardForMs: 500}}})
	}
	d.Tick(ctx)
	clk.Advance(2 * time.Second)
	d.Tick(ctx)
	rec.mu.Lock()
	held := rec.holds[HoldLease]
	rec.mu.Unlock()
	if held != 1 || len(rec.decided) != 0 {
		t.Fatalf("holds %v decided %v, want b1 held by the lease gate", rec.holds, rec.decided)
	}
	for _, id := range []string{"c2", "c3"} {
		cur := mine(st.broker("b1"), id)
		st.must(t, &waldenv1.Command{ProposerId: id, Op: &waldenv1.Command_ObserveBroker{ObserveBroker: &waldenv1.ObserveBroker{
			ObserverId: id, BrokerId: "b1", Epoch: epoch, ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, UnheardForMs: 1500, LeaseExpired: true, ExpectedIndex: cur.GetIndex()}}})
	}
	d.Tick(ctx)
	rec.mu.Lock()
	decided, holds := rec.decided["failed_over/automatic"], len(rec.holds)
	rec.mu.Unlock()
	if decided != 1 || holds != 0 {
		t.Fatalf("decided %v holds %v, want one automatic failover and no hold", rec.decided, rec.holds)
	}
	cl.mu.Lock()
	cl.leader = false
	cl.mu.Unlock()
	d.Tick(ctx)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.resets == 0 || rec.holds != nil || rec.frozen {
		t.Fatalf("after losing leadership: holds %v (resets %d) frozen %t", rec.holds, rec.resets, rec.frozen)
	}
}
