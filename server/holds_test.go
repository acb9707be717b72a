package server

import (
	"strings"
	"testing"

	waldenv1 "walden/proto/walden/v1"
)

func TestHoldReasons(t *testing.T) {
	const now = int64(1_700_000_100_000)
	p := &waldenv1.Policy{FailureTimeoutMs: 5000, MaxConcurrentRecoveries: 1, MaxFailedFraction: 0.5, DriftMarginMs: 500, CooldownMs: 600_000}
	obs := func(states ...string) []*waldenv1.Observation {
		var out []*waldenv1.Observation
		for i, s := range states {
			out = append(out, &waldenv1.Observation{ObserverId: []string{"c1", "c2", "c3"}[i], State: s, SinceUnixMs: now - int64(4000-i*1000)})
		}
		return out
	}
	brokers := []*waldenv1.Broker{
		{BrokerId: "b1", State: "suspect", Observations: obs("dead", "alive", "alive")},
		{BrokerId: "b2", State: "suspect", LeaseRemainingMs: 1500, Observations: obs("dead", "suspect", "alive")},
		{BrokerId: "b3", State: "maintenance", Maintenance: true, Observations: obs("dead")},
		{BrokerId: "b4", State: "alive", Observations: obs("alive", "alive", "alive")},
		{BrokerId: "b5", State: "recovering", Fenced: true, Observations: obs("dead", "dead", "dead")},
		{BrokerId: "b6", State: "alive"},
		{BrokerId: "b7", State: "alive"},
	}
	got := holdReasons(holdInput{Policy: p, Voters: []string{"c1", "c2", "c3"}, Brokers: brokers, RunningRecoveries: 1, NowUnixMs: now})
	check := func(id string, want ...string) {
		t.Helper()
		all := strings.Join(got[id], " | ")
		if len(got[id]) != len(want) {
			t.Errorf("%s: %q, want %d reasons", id, all, len(want))
		}
		for _, w := range want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: %q lacks %q", id, all, w)
			}
		}
	}
	check("b1", "suspected by 1 of the 2 coordinators needed", "1 recoveries are running")
	// The quorum formed when c2 began to suspect, 3s ago.
	check("b2", "suspected by a quorum for 3s of failure_timeout 5s (about 2s to go)", "lease is valid for 1.5s more", "1 recoveries are running")
	check("b3", "in maintenance")
	for _, id := range []string{"b4", "b5", "b6", "b7"} {
		if r, ok := got[id]; ok {
			t.Errorf("%s: %v", id, r)
		}
	}

	// Everything holds: the leader decides next.
	got = holdReasons(holdInput{Policy: p, Voters: []string{"c1", "c2", "c3"}, NowUnixMs: now + 10_000,
		Brokers: []*waldenv1.Broker{brokers[1], brokers[3], brokers[5], brokers[6]}})
	b2 := got["b2"]
	if len(b2) != 1 || !strings.Contains(b2[0], "lease") {
		t.Errorf("b2 later: %v", b2)
	}
	brokers[1].LeaseRemainingMs = 0
	got = holdReasons(holdInput{Policy: p, Voters: []string{"c1", "c2", "c3"}, NowUnixMs: now + 10_000,
		Brokers: []*waldenv1.Broker{brokers[1], brokers[3], brokers[5], brokers[6]}})
	if r := got["b2"]; len(r) != 1 || !strings.Contains(r[0], "every condition holds") {
		t.Errorf("b2 ready: %v", r)
	}
	// Two of four brokers suspected by a quorum: more than half? No; three of four: frozen.
	brokers[0].Observations = obs("dead", "dead", "alive")
	brokers[3].Observations = obs("dead", "dead", "dead")
	got = holdReasons(holdInput{Policy: p, Voters: []string{"c1", "c2", "c3"}, NowUnixMs: now + 10_000,
		Brokers: []*waldenv1.Broker{brokers[0], brokers[1], brokers[3], brokers[5]}})
	if r := strings.Join(got["b1"], " | "); !strings.Contains(r, "frozen: 3 of 4 brokers") {
		t.Errorf("freeze: %v", got)
	}
}
