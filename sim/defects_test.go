package sim

import (
	"testing"
	"time"
)

// TestSimulateFindsLeaderLeaseDefects replays the seeds at which the
// simulation finds the defects of the leader-held lease: each must still
// break the invariant it broke.
func TestSimulateFindsLeaderLeaseDefects(t *testing.T) {
	cases := []struct {
		profile string
		seed    uint64
		kind    string
	}{
		{"manual-failover-after-election", 2, KindAckAfterRead},
		{"config-files-differ", 26, KindAckAfterRead},
		{"runtime-policy-changes", 48, KindAckAfterRead},
		{"host-suspend", 1, KindAckAfterRead},
		{"leader-changes-and-stalls", 11, KindTerm},
		{"leader-changes-and-stalls", 2, KindLapse},
		{"degraded-network", 2, KindLapse},
	}
	profiles := map[string]Faults{}
	for _, p := range Profiles() {
		profiles[p.Name] = p.Faults
	}
	for _, c := range cases {
		w := NewWorld(c.seed, Config{Duration: 10 * time.Minute, RateBound: 0.001, Faults: profiles[c.profile]})
		v := w.Run()
		if len(v) == 0 || v[0].Kind != c.kind {
			t.Errorf("%s seed %d: got %v, want a %s violation", c.profile, c.seed, v, c.kind)
		}
	}
}
