package detect

import (
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

func TestJudge(t *testing.T) {
	s := time.Second
	const (
		none    = waldenv1.ObservationState_OBSERVATION_STATE_UNSPECIFIED
		alive   = waldenv1.ObservationState_OBSERVATION_STATE_ALIVE
		suspect = waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT
		dead    = waldenv1.ObservationState_OBSERVATION_STATE_DEAD
	)
	// The epoch first seen at 100s, judged at 110s, probes every second,
	// suspect after 3 failures.
	base := sightings{now: 110 * s, first: 100 * s}
	with := func(f func(*sightings)) sightings { c := base; f(&c); return c }
	tests := []struct {
		name    string
		s       sightings
		state   waldenv1.ObservationState
		reason  string
		unheard time.Duration
	}{
		{"nothing yet: silent since the first sight", base, none, "", 10 * s},
		{"the last probe answered", with(func(x *sightings) { x.probeOK, x.lastOK = true, 109*s }), alive, "probe ok", 1 * s},
		{"two failures after an answer: the committed view stands", with(func(x *sightings) {
			x.probeOK, x.lastOK, x.failures, x.lastErr = true, 107*s, 2, "connection refused"
		}), none, "", 3 * s},
		{"three failures: suspect", with(func(x *sightings) {
			x.probeOK, x.lastOK, x.failures, x.lastErr = true, 106*s, 3, "connection refused"
		}), suspect, "3 probes failed in a row (connection refused)", 4 * s},
		{"three failures, never answered: suspect since the first sight", with(func(x *sightings) { x.failures, x.lastErr = 3, "host unreachable" }),
			suspect, "3 probes failed in a row (host unreachable)", 10 * s},
		{"three failures, a renewal 2s ago: alive", with(func(x *sightings) {
			x.failures, x.renewedAt, x.renewalHeard = 3, 108*s, true
		}), alive, "lease renewals heard", 2 * s},
		{"three failures, a renewal 3s ago: suspect", with(func(x *sightings) {
			x.failures, x.lastErr, x.renewedAt, x.renewalHeard = 3, "HTTP 503", 107*s, true
		}), suspect, "3 probes failed in a row (HTTP 503)", 3 * s},
		{"gossip dead after the last answer", with(func(x *sightings) {
			x.probeOK, x.lastOK, x.gossip, x.gossipHeard = true, 109*s, gossipVerdict{GossipDead, 109500 * time.Millisecond}, true
		}), dead, "gossip: dead", 1 * s},
		{"gossip left: restart grace applies", with(func(x *sightings) {
			x.gossip, x.gossipHeard = gossipVerdict{GossipLeft, 105 * s}, true
		}), dead, reasonLeft, 10 * s},
		{"gossip dead before an answered probe: the probe wins", with(func(x *sightings) {
			x.probeOK, x.lastOK, x.gossip, x.gossipHeard = true, 109*s, gossipVerdict{GossipDead, 108 * s}, true
		}), alive, "probe ok", 1 * s},
		{"gossip dead, renewals heard lately: alive", with(func(x *sightings) {
			x.gossip, x.gossipHeard, x.renewedAt, x.renewalHeard = gossipVerdict{GossipDead, 109 * s}, true, 109*s, true
		}), alive, "lease renewals heard", 1 * s},
		{"gossip alive says nothing", with(func(x *sightings) {
			x.failures, x.lastErr, x.gossip, x.gossipHeard = 3, "connection refused", gossipVerdict{GossipAlive, 109 * s}, true
		}), suspect, "3 probes failed in a row (connection refused)", 10 * s},
		{"a clock before the first sight: no negative silence", with(func(x *sightings) { x.now = 99 * s }), none, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := judge(tt.s, 3, time.Second)
			if got.state != tt.state || got.reason != tt.reason || got.unheard != tt.unheard {
				t.Fatalf("judge = %v %q %v, want %v %q %v", got.state.Name(), got.reason, got.unheard, tt.state.Name(), tt.reason, tt.unheard)
			}
		})
	}
}

func TestSettle(t *testing.T) {
	alive := waldenv1.ObservationState_OBSERVATION_STATE_ALIVE
	suspect := waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT
	committed := &waldenv1.Observation{ObservationState: suspect, LeaseExpired: true, Index: 7}
	tests := []struct {
		name               string
		v                  judgement
		committed          *waldenv1.Observation
		attested, withdraw bool
		want               waldenv1.ObservationState
		reason             string
		ok                 bool
	}{
		{"nothing to say, nothing committed", judgement{}, nil, false, false, 0, "", false},
		{"nothing to say but an attestation: alive, no probe answered", judgement{}, nil, true, false, alive, "no probe answered yet", true},
		{"a new view", judgement{state: alive, reason: "probe ok"}, nil, false, false, alive, "probe ok", true},
		{"the committed view again", judgement{state: suspect, reason: "x"}, committed, true, false, suspect, "x", false},
		{"the committed view, attestation withdrawn", judgement{state: suspect, reason: "x"}, committed, false, true, suspect, "x", true},
		{"nothing to say: the committed state stands", judgement{}, committed, true, false, suspect, "", false},
		{"nothing to say, the attestation changed: the committed state with it", judgement{}, committed, false, false, suspect, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, reason, ok := settle(tt.v, tt.committed, tt.attested, tt.withdraw)
			if ok != tt.ok || (ok && (state != tt.want || reason != tt.reason)) {
				t.Fatalf("settle = %v %q %v, want %v %q %v", state.Name(), reason, ok, tt.want.Name(), tt.reason, tt.ok)
			}
		})
	}
}
