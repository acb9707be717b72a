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

// obs describes one voter's observation in a history: its state, whether it
// attests the lease expired (state suffix "!"), and the silence it reported.
// Observations with the same text keep their raft index across steps (they
// are the same committed observation); a changed text is a new one.
type obs string

// broker builds a broker at epoch with the voters' observations in order
// (empty: none), e.g. broker("b1", 1, "suspect!2.5", "dead", "").
func broker(id string, epoch uint64, o ...obs) *waldenv1.Broker {
	b := &waldenv1.Broker{BrokerId: id, Epoch: epoch, BrokerState: waldenv1.BrokerState_BROKER_STATE_ALIVE, RecoveredWalOffset: -1}
	for i, s := range o {
		if s == "" {
			continue
		}
		var state string
		var unheard float64
		expired := false
		text := string(s)
		for j, r := range text {
			if r == '!' || (r >= '0' && r <= '9') {
				state = text[:j]
				rest := text[j:]
				if rest[0] == '!' {
					expired, rest = true, rest[1:]
				}
				if rest != "" {
					fmt.Sscan(rest, &unheard)
				}
				break
			}
		}
		if state == "" {
			state = text
		}
		b.Observations = append(b.Observations, &waldenv1.Observation{ObserverId: voters[i], ObservationState: observationState(state), Epoch: epoch,
			LeaseExpired: expired, UnheardForMs: int64(unheard * 1000), Index: indexOf(id, voters[i], epoch, text)})
		if observationState(state) != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
			b.BrokerState = waldenv1.BrokerState_BROKER_STATE_SUSPECT
		}
	}
	return b
}

// observationState is the observation state named s ("suspect"), or a value no
// walden knows for a name that is none.
func observationState(s string) waldenv1.ObservationState {
	if v, ok := waldenv1.Parse[waldenv1.ObservationState](s); ok {
		return v
	}
	return waldenv1.ObservationState(999)
}

var indexes = map[string]uint64{}

// indexOf gives each distinct observation text of an observer a raft index
// of its own, stable across the steps of a test.
func indexOf(broker, observer string, epoch uint64, text string) uint64 {
	k := fmt.Sprintf("%s/%s/%d/%s", broker, observer, epoch, text)
	if i, ok := indexes[k]; ok {
		return i
	}
	indexes[k] = uint64(len(indexes) + 1)
	return indexes[k]
}

// step is one point of an observation history: at offset At from the
// leader's election, the committed brokers look like Brokers.
type step struct {
	At      time.Duration
	Brokers []*waldenv1.Broker
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
	for i, s := range steps {
		now := origin.Add(s.At)
		if s.NewLeader {
			leaderSince, mem = now, Memory{}
		}
		d := Decide(Input{
			Now: now, NowUnixMs: now.UnixMilli(), LeaderSince: leaderSince, LeaderID: "c1", Term: 2,
			Policy: p, Voters: voters, LiveMembers: voters, Brokers: s.Brokers,
			RunningRecoveries: s.Running, Memory: mem,
		})
		mem = d.Memory
		var got []string
		for _, df := range d.Declare {
			got = append(got, df.GetBrokerId())
			if df.GetEvidence().GetDecidedBy() != "c1" || len(df.GetLiveMembers()) != 3 || df.GetTerm() != 2 || df.GetEvidence().GetTerm() != 2 {
				t.Errorf("step %d: decision %v", i, df)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(s.Want) {
			t.Fatalf("step %d (t=%v): declared %v, want %v (holds %v %v)", i, s.At, got, s.Want, d.Holds, d.HoldDetails)
		}
		for id, h := range s.Hold {
			if d.Holds[id] != h {
				t.Fatalf("step %d (t=%v): hold of %s = %q, want %q (holds %v)", i, s.At, id, d.Holds[id], h, d.HoldDetails)
			}
			if d.HoldDetails[id] == "" {
				t.Fatalf("step %d: hold of %s without a detail", i, id)
			}
		}
		var kinds []string
		for _, e := range d.Events {
			kinds = append(kinds, e.GetEventKind().Name())
		}
		if fmt.Sprint(kinds) != fmt.Sprint(s.Events) {
			t.Fatalf("step %d: events %v, want %v", i, kinds, s.Events)
		}
	}
}

func TestDecideHistories(t *testing.T) {
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	bs := func(b ...*waldenv1.Broker) []*waldenv1.Broker { return b }
	tests := []struct {
		name string
		p    func(*waldenv1.Policy)
		hist []step
	}{
		{"silence counted from the last contact: suspects that reported 2.5s of silence are declared 2.5s later", nil, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!2.5", "dead!2.5", "")), Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(3.4), Brokers: bs(broker("b1", 1, "suspect!2.5", "dead!2.5", "")), Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(3.5), Brokers: bs(broker("b1", 1, "suspect!2.5", "dead!2.5", "")), Want: []string{"b1"}},
		}},
		{"the quorum-th longest silence decides", nil, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!4", "suspect!1", "dead!0.5")), Hold: map[string]string{"b1": HoldTimeout}},
			// c1 silent 4+t, c2 1+t, c3 0.5+t: the second longest is c2's.
			{At: sec(4.9), Brokers: bs(broker("b1", 1, "suspect!4", "suspect!1", "dead!0.5")), Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(5), Brokers: bs(broker("b1", 1, "suspect!4", "suspect!1", "dead!0.5")), Want: []string{"b1"}},
		}},
		{"without a majority of attestations the lease holds the decision", nil, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!3", "suspect3", "alive"))},
			{At: sec(30), Brokers: bs(broker("b1", 1, "suspect!3", "suspect3", "alive")), Hold: map[string]string{"b1": HoldLease}},
			// c2 attests in a new observation that reports its whole silence.
			{At: sec(31), Brokers: bs(broker("b1", 1, "suspect!3", "suspect!33", "alive")), Want: []string{"b1"}},
		}},
		{"one observer only → never", nil, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "dead!9", "alive", "alive")), Hold: map[string]string{"b1": HoldQuorum}},
			{At: sec(60), Brokers: bs(broker("b1", 1, "dead!9", "alive", "alive")), Hold: map[string]string{"b1": HoldQuorum}},
		}},
		{"an observer heard again replaces its observation: the silence restarts", nil, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!3", "suspect!3", ""))},
			{At: sec(2), Brokers: bs(broker("b1", 1, "suspect!3", "alive", "")), Hold: map[string]string{"b1": HoldQuorum}},
			{At: sec(3), Brokers: bs(broker("b1", 1, "suspect!3", "suspect!2.5", ""))},
			{At: sec(5.4), Brokers: bs(broker("b1", 1, "suspect!3", "suspect!2.5", "")), Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(5.5), Brokers: bs(broker("b1", 1, "suspect!3", "suspect!2.5", "")), Want: []string{"b1"}},
		}},
		{"a new leader judges silence from no earlier than its election", nil, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!2.5", "suspect!2.5", ""))},
			{At: sec(3), NewLeader: true, Brokers: bs(broker("b1", 1, "suspect!2.5", "suspect!2.5", "")), Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(5.4), Brokers: bs(broker("b1", 1, "suspect!2.5", "suspect!2.5", "")), Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(5.5), Brokers: bs(broker("b1", 1, "suspect!2.5", "suspect!2.5", "")), Want: []string{"b1"}},
		}},
		{"observations of an older epoch do not count", nil, []step{
			{At: sec(1), Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 1, "suspect!9", "suspect!9", "")
				b.Epoch = 2
				return b
			}())},
		}},
		{"maintenance and fenced brokers are never declared automatically", nil, []step{
			{At: sec(30), Brokers: bs(
				func() *waldenv1.Broker {
					b := broker("b1", 1, "suspect!9", "suspect!9", "suspect!9")
					b.Maintenance, b.BrokerState = true, waldenv1.BrokerState_BROKER_STATE_MAINTENANCE
					return b
				}(),
				func() *waldenv1.Broker {
					b := broker("b2", 2, "suspect!9", "suspect!9", "suspect!9")
					b.Fenced, b.BrokerState = true, waldenv1.BrokerState_BROKER_STATE_FAILED
					return b
				}(),
			)},
		}},
		{"a manual request is declared once a majority attests, gates or not", func(p *waldenv1.Policy) { p.MaxConcurrentRecoveries = 1 }, []step{
			{At: sec(1), Running: 1, Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 1, "alive!", "alive", "alive")
				b.FailoverRequested = &waldenv1.FailoverRequested{Epoch: 1, Reason: "disk"}
				b.Maintenance = true
				return b
			}()), Hold: map[string]string{"b1": HoldLease}},
			{At: sec(4), Running: 1, Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 1, "alive!", "alive!", "alive")
				b.FailoverRequested = &waldenv1.FailoverRequested{Epoch: 1, Reason: "disk"}
				b.Maintenance = true
				return b
			}()), Want: []string{"b1"}},
		}},
		{"freeze above max_failed_fraction; resume only well below it, after the hold", nil, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1, "suspect!9", "suspect!9", ""), broker("b3", 1, "alive", "alive", "alive")), Events: []string{"freeze"}},
			{At: sec(2), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1, "suspect!9", "suspect!9", ""), broker("b3", 1, "alive", "alive", "alive")), Hold: map[string]string{"b1": HoldFrozen, "b2": HoldFrozen}},
			// 1 of 3 suspected: calm, but the freeze holds for 2 failure
			// timeouts.
			{At: sec(3), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1, "alive", "alive", ""), broker("b3", 1, "alive", "alive", "alive")), Hold: map[string]string{"b1": HoldFrozen}},
			{At: sec(12.9), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1, "alive", "alive", ""), broker("b3", 1, "alive", "alive", "alive")), Hold: map[string]string{"b1": HoldFrozen}},
			{At: sec(13), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1, "alive", "alive", ""), broker("b3", 1, "alive", "alive", "alive")), Events: []string{"unfreeze"}, Want: []string{"b1"}},
		}},
		{"a count hovering at the threshold keeps the freeze", nil, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1, "suspect!9", "suspect!9", ""), broker("b3", 1, "suspect!9", "suspect!9", ""), broker("b4", 1), broker("b5", 1)), Events: []string{"freeze"}},
			// 2 of 5 is not above 0.5×5, but above half of it: no resume.
			{At: sec(30), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1, "suspect!9", "suspect!9", ""), broker("b3", 1, "alive", "alive", ""), broker("b4", 1), broker("b5", 1)), Hold: map[string]string{"b1": HoldFrozen}},
		}},
		{"max_concurrent_recoveries", func(p *waldenv1.Policy) { p.MaxConcurrentRecoveries = 1 }, []step{
			{At: sec(1), Running: 1, Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1), broker("b3", 1)), Hold: map[string]string{"b1": HoldConcurrency}},
			{At: sec(2), Running: 0, Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", ""), broker("b2", 1), broker("b3", 1)), Want: []string{"b1"}},
		}},
		{"recovered within cooldown without ack → cooldown event once, then ack lets it through", nil, []step{
			{At: sec(1), Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 3, "suspect!9", "suspect!9", "")
				b.RecoveredUnixMs = 1_000_000_000
				return b
			}()), Hold: map[string]string{"b1": HoldCooldown}, Events: []string{"cooldown"}},
			{At: sec(2), Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 3, "suspect!9", "suspect!9", "")
				b.RecoveredUnixMs = 1_000_000_000
				return b
			}()), Hold: map[string]string{"b1": HoldCooldown}},
			{At: sec(3), Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 3, "suspect!9", "suspect!9", "")
				b.RecoveredUnixMs, b.AckedUnixMs = 1_000_000_000, 1_000_002_500
				return b
			}()), Want: []string{"b1"}},
		}},
		{"restart_grace extends the timeout of a broker that left gracefully", func(p *waldenv1.Policy) { p.RestartGraceMs = 10000 }, []step{
			{At: sec(1), Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 1, "dead!1", "dead!1", "")
				b.LeftGracefully = true
				return b
			}()), Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(14.9), Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 1, "dead!1", "dead!1", "")
				b.LeftGracefully = true
				return b
			}()), Hold: map[string]string{"b1": HoldTimeout}},
			{At: sec(15), Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 1, "dead!1", "dead!1", "")
				b.LeftGracefully = true
				return b
			}()), Want: []string{"b1"}},
		}},
		{"dry_run decides once per epoch", func(p *waldenv1.Policy) { p.DryRun = true }, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", "")), Want: []string{"b1"}},
			{At: sec(2), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", "")), Hold: map[string]string{"b1": HoldDryRunDone}},
		}},
		{"explicit suspicion_quorum 3 of 3", func(p *waldenv1.Policy) { p.SuspicionQuorum = 3 }, []step{
			{At: sec(1), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", "alive")), Hold: map[string]string{"b1": HoldQuorum}},
			{At: sec(2), Brokers: bs(broker("b1", 1, "suspect!9", "suspect!9", "suspect9")), Want: []string{"b1"}},
		}},
		{"observations of non-voters do not count", nil, []step{
			{At: sec(1), Brokers: bs(func() *waldenv1.Broker {
				b := broker("b1", 1, "suspect!9", "", "")
				b.Observations = append(b.Observations, &waldenv1.Observation{ObserverId: "c9", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD, Epoch: 1, LeaseExpired: true, UnheardForMs: 9000})
				return b
			}()), Hold: map[string]string{"b1": HoldQuorum}},
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
	b := broker("b1", 4, "dead!6", "suspect!5.5", "alive")
	in := Input{
		Now: origin.Add(10 * time.Second), LeaderSince: origin, LeaderID: "c2", Term: 7, Policy: p,
		Voters: voters, LiveMembers: []string{"c1", "c2"}, Brokers: []*waldenv1.Broker{b},
		Memory: Memory{Seen: map[uint64]time.Time{b.Observations[0].GetIndex(): origin.Add(9 * time.Second),
			b.Observations[1].GetIndex(): origin.Add(9 * time.Second)}},
	}
	d := Decide(in)
	if len(d.Declare) != 1 {
		t.Fatalf("declared %v, holds %v", d.Declare, d.HoldDetails)
	}
	df := d.Declare[0]
	ev := df.GetEvidence()
	if df.GetEpoch() != 4 || df.GetTerm() != 7 || ev.GetSuspicionQuorum() != 2 || ev.GetSuspectForMs() != 6500 ||
		ev.GetFailureTimeoutMs() != 5000 || len(ev.GetObservations()) != 3 || ev.GetBrokersTotal() != 1 || ev.GetDecidedBy() != "c2" {
		t.Fatalf("evidence %v", ev)
	}
	// Each observer's silence as the leader judged it: reported + 1s.
	if got := ev.GetObservations()[0].GetUnheardForMs(); got != 7000 {
		t.Fatalf("c1's silence in the evidence = %dms, want 7000", got)
	}
	// Decide does not alias its input.
	ev.GetObservations()[0].ObservationState = waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT
	if in.Brokers[0].GetObservations()[0].GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_DEAD {
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
