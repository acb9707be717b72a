package fsm_test

import (
	"fmt"
	"testing"

	waldenv1 "walden/proto/walden/v1"
)

// BenchmarkBrokersViewAfterAChange is what the failure detector pays to
// read the registry while a fleet of 5,000 brokers keeps changing (one
// observation applied before each read), as while it registers.
func BenchmarkBrokersViewAfterAChange(b *testing.B) {
	h := newHarness(b)
	h.viewUnchecked = true
	const n = 5000
	for i := range n {
		id := fmt.Sprintf("b%05d", i)
		h.ok(&waldenv1.RegisterBroker{BrokerId: id, AgentAddr: "127.0.0.1:1",
			Wal: &waldenv1.WalLocation{VolumeId: "vol-" + id, Path: "/wal/" + id}})
		for _, c := range []string{"c1", "c2", "c3"} {
			h.ok(&waldenv1.ObserveBroker{BrokerId: id, ObserverId: c, ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_ALIVE})
		}
	}
	states := []waldenv1.ObservationState{waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, waldenv1.ObservationState_OBSERVATION_STATE_ALIVE}
	h.s.BrokersView() // the first read copies the registry whole
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		h.ok(&waldenv1.ObserveBroker{BrokerId: fmt.Sprintf("b%05d", i%n), ObserverId: "c1", ObservationState: states[i/n%2]})
		if len(h.s.BrokersView()) != n {
			b.Fatal("brokers missing from the view")
		}
	}
}
