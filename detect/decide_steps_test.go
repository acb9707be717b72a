package detect

import (
	"testing"
	"time"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
)

// stepInput is the input the step tests judge at: the leader elected at
// origin, now 10s later, every observation first seen at the election.
func stepInput(p *waldenv1.Policy) (Input, seenAll) {
	origin := time.Unix(3_000_000, 0)
	return Input{Now: origin.Add(10 * time.Second), NowUnixMs: origin.Add(10 * time.Second).UnixMilli(), LeaderSince: origin,
		LeaderID: "c1", Term: 3, Policy: p, Voters: voters, LiveMembers: voters}, seenAll(origin)
}

// seenAll is a Seen map that says every observation was first seen at t.
type seenAll time.Time

func (s seenAll) of(b *waldenv1.Broker) map[uint64]time.Time {
	m := map[uint64]time.Time{}
	for _, o := range b.GetObservations() {
		m[o.GetIndex()] = time.Time(s)
	}
	return m
}

func TestGateBroker(t *testing.T) {
	with := func(b *waldenv1.Broker, f func(*waldenv1.Broker)) *waldenv1.Broker { f(b); return b }
	requested := func(b *waldenv1.Broker) {
		b.FailoverRequested = &waldenv1.FailoverRequested{Epoch: b.GetEpoch(), Reason: "disk"}
	}
	tests := []struct {
		name                string
		b                   *waldenv1.Broker
		grace               bool
		eligible, suspected bool
		want                string // "manual", "ready", a Hold* reason, or "" for nothing
	}{
		{"alive: eligible, nothing to say", broker("g1", 1, "alive", "alive", "alive"), false, true, false, ""},
		{"no observations at all", broker("g2", 1), false, true, false, ""},
		{"fenced: not looked at", with(broker("g3", 1, "dead!20", "dead!20", ""), func(b *waldenv1.Broker) { b.Fenced = true }), false, false, false, ""},
		{"maintenance: not eligible", with(broker("g4", 1, "dead!20", "dead!20", ""), func(b *waldenv1.Broker) { b.Maintenance = true }), false, false, false, ""},
		{"recovering: not eligible", with(broker("g5", 1, "dead!20", "dead!20", ""), func(b *waldenv1.Broker) {
			b.BrokerState = waldenv1.BrokerState_BROKER_STATE_RECOVERING
		}), false, false, false, ""},
		{"one suspect of two needed", broker("g6", 1, "dead!20", "alive", ""), false, true, false, HoldQuorum},
		{"a quorum, silent 5s of 5s: ready", broker("g7", 1, "suspect!", "dead!", ""), false, true, true, "ready"},
		{"a quorum, silent 14s of 5s+10s grace: timeout", with(broker("g8", 1, "dead!4", "dead!4", ""), func(b *waldenv1.Broker) { b.LeftGracefully = true }), true, true, true, HoldTimeout},
		{"a quorum, silent 15s of 5s+10s grace: ready", with(broker("g9", 1, "dead!5", "dead!5", ""), func(b *waldenv1.Broker) { b.LeftGracefully = true }), true, true, true, "ready"},
		{"the second longest silence decides: 10s of 5s, ready", broker("g10", 1, "dead!20", "suspect!", "alive"), false, true, true, "ready"},
		{"silent long enough, one attestation of two: lease", broker("g11", 1, "dead!20", "dead20", ""), false, true, true, HoldLease},
		{"manual, one attestation of two: lease", with(broker("g12", 1, "alive!", "alive", ""), requested), false, false, false, HoldLease},
		{"manual, two attestations, in maintenance: declared", with(broker("g13", 1, "alive!", "alive!", ""), func(b *waldenv1.Broker) {
			requested(b)
			b.Maintenance = true
		}), false, false, false, "manual"},
		{"manual request of an older epoch: judged as automatic", with(broker("g14", 2, "alive!", "alive!", ""), func(b *waldenv1.Broker) {
			b.FailoverRequested = &waldenv1.FailoverRequested{Epoch: 1}
		}), false, true, false, ""},
		{"observations of an older epoch: none", with(broker("g15", 1, "dead!20", "dead!20", ""), func(b *waldenv1.Broker) { b.Epoch = 2 }), false, true, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := testPolicy()
			if tt.grace {
				p.RestartGraceMs = 10000
			}
			in, at := stepInput(p)
			v := gateBroker(in, at.of(tt.b), tt.b)
			got := ""
			switch {
			case v.manual != nil:
				got = "manual"
				if !v.manual.GetEvidence().GetManual() || v.ready != nil || v.hold != nil {
					t.Errorf("manual verdict %+v", v)
				}
			case v.ready != nil:
				got = "ready"
				if v.hold != nil || v.ready.silentFor < v.ready.timeout || v.ready.attested < 2 {
					t.Errorf("ready verdict %+v", v.ready)
				}
			case v.hold != nil:
				got = v.hold.reason
				if v.hold.broker != tt.b.GetBrokerId() || v.hold.detail == "" {
					t.Errorf("hold %+v", v.hold)
				}
			}
			if got != tt.want || v.eligible != tt.eligible || v.suspected != tt.suspected {
				t.Fatalf("verdict %s eligible %v suspected %v, want %s %v %v (%+v)", got, v.eligible, v.suspected, tt.want, tt.eligible, tt.suspected, v.hold)
			}
		})
	}
}

func TestNextFreeze(t *testing.T) {
	now := time.Unix(4_000_000, 0)
	hold := FreezeHold(testPolicy()) // 10s
	none := waldenv1.EventKind_EVENT_KIND_UNSPECIFIED
	freeze, unfreeze := waldenv1.EventKind_EVENT_KIND_FREEZE, waldenv1.EventKind_EVENT_KIND_UNFREEZE
	tests := []struct {
		name       string
		prev       freezeState
		c          counts
		want       freezeState
		wantChange waldenv1.EventKind
	}{
		{"calm, not frozen: calm from now", freezeState{}, counts{10, 0}, freezeState{CalmSince: now}, none},
		{"one suspected of one: never freezes", freezeState{}, counts{1, 1}, freezeState{CalmSince: now}, none},
		{"2 of 3 above 0.5: freezes", freezeState{}, counts{3, 2}, freezeState{Frozen: true}, freeze},
		{"2 of 4 at 0.5: not above, not calm", freezeState{CalmSince: now.Add(-time.Hour)}, counts{4, 2}, freezeState{}, none},
		{"frozen, over: stays, calm forgotten", freezeState{Frozen: true, CalmSince: now.Add(-time.Hour)}, counts{3, 3}, freezeState{Frozen: true}, none},
		{"frozen, calm just now: stays", freezeState{Frozen: true}, counts{3, 1}, freezeState{Frozen: true, CalmSince: now}, none},
		{"frozen, calm for less than the hold: stays", freezeState{Frozen: true, CalmSince: now.Add(-hold + time.Millisecond)}, counts{3, 1},
			freezeState{Frozen: true, CalmSince: now.Add(-hold + time.Millisecond)}, none},
		{"frozen, calm for the hold: lifts", freezeState{Frozen: true, CalmSince: now.Add(-hold)}, counts{3, 1}, freezeState{CalmSince: now.Add(-hold)}, unfreeze},
		{"frozen, 2 of 5 between half and the threshold: stays", freezeState{Frozen: true, CalmSince: now.Add(-time.Hour)}, counts{5, 2}, freezeState{Frozen: true}, none},
		{"frozen, 2 of 8 at half the threshold: calm", freezeState{Frozen: true, CalmSince: now.Add(-hold)}, counts{8, 2}, freezeState{CalmSince: now.Add(-hold)}, unfreeze},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nextFreeze(testPolicy(), tt.prev, tt.c, now)
			if got.state != tt.want || got.change != tt.wantChange {
				t.Fatalf("nextFreeze = %+v %v, want %+v %v", got.state, got.change, tt.want, tt.wantChange)
			}
			if got.change != none {
				// The event carries the counts, the fraction and (lifting
				// the freeze) the hold; its message is rendered from them.
				ev := freezeEvent(got.change, "c1", testPolicy(), tt.c)
				d := ev.GetDetail()
				hold, resume := int64(0), 0.0
				if got.change == unfreeze {
					hold, resume = 2*testPolicy().GetFailureTimeoutMs(), FreezeResumeFraction
				}
				if ev.GetEventKind() != got.change || ev.GetActor() != "c1" || d.GetSuspected() != uint32(tt.c.suspected) ||
					d.GetEligible() != uint32(tt.c.total) || d.GetMaxFailedFraction() != 0.5 || d.GetDurationMs() != hold ||
					d.GetResumeFraction() != resume || ev.GetMessage() == "" || ev.GetMessage() != fsm.EventMessage(ev) {
					t.Fatalf("event %v", ev)
				}
			}
		})
	}
}

func TestAdmit(t *testing.T) {
	in, _ := stepInput(testPolicy())
	recovered := func(agoMs, ackedAgoMs int64, blocked bool) *waldenv1.Broker {
		b := broker("a1", 2)
		b.RecoveredUnixMs = in.NowUnixMs - agoMs
		if ackedAgoMs >= 0 {
			b.AckedUnixMs = in.NowUnixMs - ackedAgoMs
		}
		b.CooldownBlocked = blocked
		return b
	}
	tests := []struct {
		name      string
		b         *waldenv1.Broker
		dryRun    bool
		st        admissionState
		want      string // "admitted" or a Hold* reason
		wantEvent bool
	}{
		{"nothing in the way", broker("a1", 2), false, admissionState{running: 3}, "admitted", false},
		{"frozen before anything else", recovered(1000, -1, false), false, admissionState{frozen: true, running: 4}, HoldFrozen, false},
		{"recovered 1s ago, no ack: cooldown with its event", recovered(1000, -1, false), false, admissionState{}, HoldCooldown, true},
		{"cooldown recorded at this epoch: no second event", recovered(1000, -1, false), false, admissionState{cooldownRecorded: true}, HoldCooldown, false},
		{"cooldown already blocked in the state: no event", recovered(1000, -1, true), false, admissionState{}, HoldCooldown, false},
		{"acknowledged since the recovery", recovered(1000, 500, false), false, admissionState{}, "admitted", false},
		{"recovered longer ago than the cooldown", recovered(600000, -1, false), false, admissionState{}, "admitted", false},
		{"max_concurrent_recoveries reached", broker("a1", 2), false, admissionState{running: 4}, HoldConcurrency, false},
		{"dry run ignores the running recoveries", broker("a1", 2), true, admissionState{running: 4}, "admitted", false},
		{"dry run decided at this epoch", broker("a1", 2), true, admissionState{dryRunDone: true}, HoldDryRunDone, false},
		{"a dry-run record without dry_run does not hold", broker("a1", 2), false, admissionState{dryRunDone: true}, "admitted", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := in
			in.Policy = testPolicy()
			in.Policy.DryRun = tt.dryRun
			a := admit(in, candidate{b: tt.b}, tt.st, counts{total: 5, suspected: 1})
			got := "admitted"
			if a.hold != nil {
				got = a.hold.reason
				if a.admitted || a.hold.detail == "" || a.hold.broker != "a1" {
					t.Fatalf("admission %+v", a)
				}
			}
			if got != tt.want || (a.event != nil) != tt.wantEvent || a.cooldown != (tt.want == HoldCooldown) {
				t.Fatalf("admission %s event %v cooldown %v, want %s event %v", got, a.event, a.cooldown, tt.want, tt.wantEvent)
			}
			// The cooldown event carries the broker's epoch, how long ago
			// it was recovered and the cooldown; its message is rendered
			// from them.
			if e := a.event; e != nil && (e.GetEventKind() != waldenv1.EventKind_EVENT_KIND_COOLDOWN || e.GetBrokerId() != "a1" ||
				e.GetDetail().GetEpoch() != tt.b.GetEpoch() || e.GetDetail().GetDurationMs() != 1000 || e.GetDetail().GetCooldownMs() != 600000 ||
				e.GetMessage() != "broker a1 looks failed again 1s after its recovery, within cooldown 10m0s: automatic failover waits for `waldenctl ack a1`") {
				t.Fatalf("event %v", e)
			}
		})
	}
}
