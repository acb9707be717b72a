package detect

import (
	"fmt"
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

var voters = []string{"c1", "c2", "c3"}

func testPolicy() *waldenv1.Policy {
	return &waldenv1.Policy{
		FailureTimeoutMs:        5000,
		LeaseTtlMs:              3000,
		DriftMarginMs:           500,
		MaxConcurrentRecoveries: 4,
		MaxFailedFraction:       0.5,
		CooldownMs:              600000,
	}
}

func broker(id string, epoch uint64, obs ...string) *waldenv1.Broker {
	b := &waldenv1.Broker{BrokerId: id, Epoch: epoch, State: StateAlive, RecoveredWalOffset: -1}
	for i, st := range obs {
		if st == "" {
			continue
		}
		b.Observations = append(b.Observations, &waldenv1.Observation{ObserverId: voters[i], State: st})
		if st != StateAlive {
			b.State = StateSuspect
		}
	}
	return b
}

// step is one point of an observation history: at offset At from the
// leader's election, the committed brokers look like Brokers.
type step struct {
	At      time.Duration
	Brokers []*waldenv1.Broker
	// Leases maps a broker to the offset of its last renewal (absent: never
	// renewed under this leader).
	Leases  map[string]time.Duration
	Running int
	// NewLeader makes this step the first of a new leadership.
	NewLeader bool
	// Want are the broker ids declared failed at this step; Hold the hold
	// reason expected for a broker; Events the event kinds.
	Want   []string
	Hold   map[string]string
	Events []string
}

func runHistory(t *testing.T, p *waldenv1.Policy, steps []step) {
	t.Helper()
	origin := time.Unix(1_000_000, 0)
	leaderSince := origin
	var mem Memory
	ttl := time.Duration(p.GetLeaseTtlMs()) * time.Millisecond
	for i, s := range steps {
		now := origin.Add(s.At)
		if s.NewLeader {
			leaderSince, mem = now, Memory{}
		}
		expiry := map[string]time.Time{}
		for id, at := range s.Leases {
			from := origin.Add(at)
			if from.Before(leaderSince) {
				from = leaderSince
			}
			expiry[id] = from.Add(ttl)
		}
		d := Decide(Input{
			Now: now, NowUnixMs: now.UnixMilli(), LeaderSince: leaderSince, LeaderID: "c1", Term: 2,
			Policy: p, Voters: voters, LiveMembers: voters, Brokers: s.Brokers, LeaseExpiry: expiry,
			RunningRecoveries: s.Running, Memory: mem,
		})
		mem = d.Memory
		var got []string
		for _, df := range d.Declare {
			got = append(got, df.GetBrokerId())
			if df.GetEvidence().GetDecidedBy() != "c1" || len(df.GetLiveMembers()) != 3 {
				t.Errorf("step %d: evidence %v live %v", i, df.GetEvidence(), df.GetLiveMembers())
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(s.Want) {
			t.Fatalf("step %d (t=%v): declared %v, want %v (holds %v)", i, s.At, got, s.Want, d.Holds)
		}
		for id, h := range s.Hold {
			if d.Holds[id] != h {
				t.Fatalf("step %d (t=%v): hold of %s = %q, want %q (holds %v)", i, s.At, id, d.Holds[id], h, d.Holds)
			}
		}
		var kinds []string
		for _, e := range d.Events {
			kinds = append(kinds, e.GetKind())
		}
		if fmt.Sprint(kinds) != fmt.Sprint(s.Events) {
			t.Fatalf("step %d: events %v, want %v", i, kinds, s.Events)
		}
	}
}

func TestDecideHistories(t *testing.T) {
	const S, D, A = StateSuspect, StateDead, StateAlive
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	noLease := map[string]time.Duration{"b1": 0, "b2": 0, "b3": 0}
	tests := []struct {
		name string
		p    func(*waldenv1.Policy)
		hist []step
	}{
		{"quorum for failure_timeout, lease expired → declared once the timeout ran", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, D, "")}, Leases: noLease, Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(5.9), Brokers: []*waldenv1.Broker{broker("b1", 1, S, D, "")}, Leases: noLease, Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(6), Brokers: []*waldenv1.Broker{broker("b1", 1, S, D, "")}, Leases: noLease, Want: []string{"b1"}},
		}},
		{"one observer only → never", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, D, A, A)}, Leases: noLease, Hold: map[string]string{"b1": HoldQuorum}},
			{At: sec(60), Brokers: []*waldenv1.Broker{broker("b1", 1, D, A, A)}, Leases: noLease, Hold: map[string]string{"b1": HoldQuorum}},
		}},
		{"quorum interrupted restarts the clock", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease},
			{At: sec(4), Brokers: []*waldenv1.Broker{broker("b1", 1, S, A, "")}, Leases: noLease, Hold: map[string]string{"b1": HoldQuorum}},
			{At: sec(5), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease},
			{At: sec(9.9), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease, Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(10), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease, Want: []string{"b1"}},
		}},
		{"lease still valid holds the decision", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, S)}, Leases: map[string]time.Duration{"b1": sec(1)}},
			{At: sec(6), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, S)}, Leases: map[string]time.Duration{"b1": sec(4)}, Hold: map[string]string{"b1": HoldLease}},
			// expired at 7s, drift margin 0.5s
			{At: sec(7.4), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, S)}, Leases: map[string]time.Duration{"b1": sec(4)}, Hold: map[string]string{"b1": HoldLease}},
			{At: sec(7.5), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, S)}, Leases: map[string]time.Duration{"b1": sec(4)}, Want: []string{"b1"}},
		}},
		{"a new leader starts the clock at its election", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease},
			{At: sec(5), NewLeader: true, Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease, Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(9.9), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease, Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(10), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease, Want: []string{"b1"}},
		}},
		{"a new epoch (re-registration) restarts the clock", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease},
			{At: sec(4), Brokers: []*waldenv1.Broker{broker("b1", 2, S, S, "")}, Leases: noLease},
			{At: sec(8.9), Brokers: []*waldenv1.Broker{broker("b1", 2, S, S, "")}, Leases: noLease, Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(9), Brokers: []*waldenv1.Broker{broker("b1", 2, S, S, "")}, Leases: noLease, Want: []string{"b1"}},
		}},
		{"maintenance and fenced brokers are never declared", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{
				func() *waldenv1.Broker {
					b := broker("b1", 1, S, S, S)
					b.Maintenance = true
					b.State = StateMaintenance
					return b
				}(),
				func() *waldenv1.Broker {
					b := broker("b2", 2, S, S, S)
					b.Fenced = true
					b.State = StateFailed
					return b
				}(),
			}, Leases: noLease},
			{At: sec(30), Brokers: []*waldenv1.Broker{
				func() *waldenv1.Broker {
					b := broker("b1", 1, S, S, S)
					b.Maintenance = true
					b.State = StateMaintenance
					return b
				}(),
				func() *waldenv1.Broker {
					b := broker("b2", 2, S, S, S)
					b.Fenced = true
					b.State = StateFailed
					return b
				}(),
			}, Leases: noLease},
		}},
		{"more than max_failed_fraction suspected → freeze event once, unfreeze when it clears", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, ""), broker("b2", 1, S, S, ""), broker("b3", 1, A, A, A)}, Leases: noLease, Events: []string{EventFreeze}},
			{At: sec(10), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, ""), broker("b2", 1, S, S, ""), broker("b3", 1, A, A, A)}, Leases: noLease, Hold: map[string]string{"b1": HoldFrozen, "b2": HoldFrozen}},
			{At: sec(11), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, ""), broker("b2", 1, A, A, ""), broker("b3", 1, A, A, A)}, Leases: noLease, Events: []string{EventUnfreeze}, Want: []string{"b1"}},
		}},
		{"max_concurrent_recoveries", func(p *waldenv1.Policy) { p.MaxConcurrentRecoveries = 1 }, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, ""), broker("b2", 1, A, A, ""), broker("b3", 1, A, A, A)}, Leases: noLease, Running: 1},
			{At: sec(7), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, ""), broker("b2", 1, A, A, ""), broker("b3", 1, A, A, A)}, Leases: noLease, Running: 1, Hold: map[string]string{"b1": HoldConcurrency}},
			{At: sec(8), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, ""), broker("b2", 1, A, A, ""), broker("b3", 1, A, A, A)}, Leases: noLease, Running: 0, Want: []string{"b1"}},
		}},
		{"recovered within cooldown without ack → cooldown event once, then ack lets it through", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{func() *waldenv1.Broker { b := broker("b1", 3, S, S, ""); b.RecoveredUnixMs = 1_000_000_000; return b }()}, Leases: noLease},
			{At: sec(7), Brokers: []*waldenv1.Broker{func() *waldenv1.Broker { b := broker("b1", 3, S, S, ""); b.RecoveredUnixMs = 1_000_000_000; return b }()}, Leases: noLease, Hold: map[string]string{"b1": HoldCooldown}, Events: []string{EventCooldown}},
			{At: sec(8), Brokers: []*waldenv1.Broker{func() *waldenv1.Broker { b := broker("b1", 3, S, S, ""); b.RecoveredUnixMs = 1_000_000_000; return b }()}, Leases: noLease, Hold: map[string]string{"b1": HoldCooldown}},
			{At: sec(9), Brokers: []*waldenv1.Broker{func() *waldenv1.Broker {
				b := broker("b1", 3, S, S, "")
				b.RecoveredUnixMs, b.AckedUnixMs = 1_000_000_000, 1_000_008_500
				return b
			}()}, Leases: noLease, Want: []string{"b1"}},
		}},
		{"restart_grace extends the timeout of a broker that left gracefully", func(p *waldenv1.Policy) { p.RestartGraceMs = 10000 }, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{func() *waldenv1.Broker {
				b := broker("b1", 1, D, D, "")
				b.Observations[0].Reason, b.Observations[1].Reason = reasonLeft, reasonLeft
				return b
			}()}, Leases: noLease},
			{At: sec(10), Brokers: []*waldenv1.Broker{func() *waldenv1.Broker { b := broker("b1", 1, D, D, ""); b.LeftGracefully = true; return b }()}, Leases: noLease, Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(16), Brokers: []*waldenv1.Broker{func() *waldenv1.Broker { b := broker("b1", 1, D, D, ""); b.LeftGracefully = true; return b }()}, Leases: noLease, Want: []string{"b1"}},
		}},
		{"dry_run decides once per epoch", func(p *waldenv1.Policy) { p.DryRun = true }, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease},
			{At: sec(6), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease, Want: []string{"b1"}},
			{At: sec(7), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, "")}, Leases: noLease, Hold: map[string]string{"b1": HoldDryRunDone}},
		}},
		{"explicit suspicion_quorum 3 of 3", func(p *waldenv1.Policy) { p.SuspicionQuorum = 3 }, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, A)}, Leases: noLease, Hold: map[string]string{"b1": HoldQuorum}},
			{At: sec(10), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, S)}, Leases: noLease},
			{At: sec(15), Brokers: []*waldenv1.Broker{broker("b1", 1, S, S, S)}, Leases: noLease, Want: []string{"b1"}},
		}},
		{"observations of non-voters do not count", nil, []step{
			{At: sec(1), Brokers: []*waldenv1.Broker{func() *waldenv1.Broker {
				b := broker("b1", 1, S, "", "")
				b.Observations = append(b.Observations, &waldenv1.Observation{ObserverId: "c9", State: StateDead})
				return b
			}()}, Leases: noLease, Hold: map[string]string{"b1": HoldQuorum}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := testPolicy()
			if tt.p != nil {
				tt.p(p)
			}
			runHistory(t, p, tt.hist)
		})
	}
}

func TestDecideEvidence(t *testing.T) {
	origin := time.Unix(2_000_000, 0)
	p := testPolicy()
	in := Input{
		Now: origin.Add(10 * time.Second), LeaderSince: origin, LeaderID: "c2", Term: 7, Policy: p,
		Voters: voters, LiveMembers: []string{"c1", "c2"},
		Brokers: []*waldenv1.Broker{broker("b1", 4, StateDead, StateSuspect, StateAlive)},
		Memory:  Memory{QuorumSince: map[string]Since{"b1": {Epoch: 4, At: origin.Add(2 * time.Second)}}},
	}
	d := Decide(in)
	if len(d.Declare) != 1 {
		t.Fatalf("declared %v, holds %v", d.Declare, d.Holds)
	}
	df := d.Declare[0]
	ev := df.GetEvidence()
	if df.GetEpoch() != 4 || ev.GetSuspicionQuorum() != 2 || ev.GetSuspectForMs() != 8000 || ev.GetLeaseExpiredForMs() != 7000 ||
		ev.GetFailureTimeoutMs() != 5000 || len(ev.GetObservations()) != 2 || ev.GetBrokersTotal() != 1 || ev.GetDecidedBy() != "c2" {
		t.Fatalf("evidence %v", ev)
	}
	// Decide does not alias its input.
	ev.GetObservations()[0].State = "x"
	if in.Brokers[0].GetObservations()[0].GetState() != StateDead {
		t.Fatal("evidence aliases the input observations")
	}
}

func TestQuorum(t *testing.T) {
	for _, c := range []struct {
		q      uint32
		voters int
		want   int
	}{{0, 3, 2}, {0, 5, 3}, {0, 1, 1}, {3, 3, 3}, {1, 5, 1}} {
		if got := Quorum(&waldenv1.Policy{SuspicionQuorum: c.q}, c.voters); got != c.want {
			t.Errorf("Quorum(%d, %d) = %d, want %d", c.q, c.voters, got, c.want)
		}
	}
}

func TestLeaseTable(t *testing.T) {
	t0 := time.Unix(3_000_000, 0)
	lt := NewLeaseTable(t0)
	ttl := 3 * time.Second
	if got := lt.ExpiresAt("b1", 1, ttl); !got.Equal(t0.Add(ttl)) {
		t.Fatalf("unknown broker expires %v", got)
	}
	lt.Renew("b1", 1, t0.Add(2*time.Second), ttl)
	if got := lt.Remaining("b1", 1, ttl, t0.Add(4*time.Second)); got != time.Second {
		t.Fatalf("remaining %v", got)
	}
	// Another epoch does not inherit the renewal.
	if got := lt.ExpiresAt("b1", 2, ttl); !got.Equal(t0.Add(ttl)) {
		t.Fatalf("epoch 2 expires %v", got)
	}
	// A renewal older than the recorded one is ignored.
	lt.Renew("b1", 1, t0.Add(time.Second), ttl)
	if got := lt.ExpiresAt("b1", 1, ttl); !got.Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("stale renewal moved expiry to %v", got)
	}
	// A new leadership grants a full TTL from its start.
	lt.Reset(t0.Add(10 * time.Second))
	if got := lt.ExpiresAt("b1", 1, ttl); !got.Equal(t0.Add(13 * time.Second)) {
		t.Fatalf("after reset expires %v", got)
	}
	// A lease granted with a longer ttl keeps it when lease_ttl is cut.
	lt.Renew("b1", 1, t0.Add(20*time.Second), 10*time.Second)
	if got := lt.ExpiresAt("b1", 1, time.Second); !got.Equal(t0.Add(30 * time.Second)) {
		t.Fatalf("after a ttl cut expires %v", got)
	}
}
