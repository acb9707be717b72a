package server

import (
	"strings"
	"testing"

	waldenv1 "walden/proto/walden/v1"
)

func TestHoldsOf(t *testing.T) {
	suspect := []*waldenv1.Observation{{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, Epoch: 4}}
	got := holdsOf([]*waldenv1.Broker{
		{BrokerId: "b1", Epoch: 4, Observations: suspect, Hold: "lease", HoldDetail: "1 of 3 coordinators attest its lease expired, 2 needed", LeaseViewOf: "c1"},
		{BrokerId: "b2", Epoch: 4, Observations: suspect, Maintenance: true},
		{BrokerId: "b3", Epoch: 4, Observations: suspect, LeaseViewOf: "c1"},
		{BrokerId: "b4", Epoch: 4, Observations: []*waldenv1.Observation{{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_ALIVE, Epoch: 4}}},
		{BrokerId: "b5", Epoch: 5, Observations: suspect, Fenced: true},
	})
	if len(got) != 3 || !strings.HasPrefix(got["b1"][0], "lease: 1 of 3") || !strings.Contains(got["b2"][0], "maintenance") ||
		!strings.Contains(got["b3"][0], "next round") {
		t.Fatalf("holds %v", got)
	}
}
