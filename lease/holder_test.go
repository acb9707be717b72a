package lease

import (
	"testing"
	"time"
)

// TestHolderForgetsVotersAtANewEpoch (issue 21): an agent that lived
// through a restore registers with a cluster whose configuration's index is
// below the old one's and whose members are other incarnations: the new
// epoch's grants count, from the configuration they name.
func TestHolderForgetsVotersAtANewEpoch(t *testing.T) {
	h := NewHolder(0)
	h.SetEpoch(7)
	old := Voters{IDs: []string{"c1", "c2", "c3"}, Incarnations: []uint64{5, 6, 90}, Index: 900}
	h.Granted(Grant{Coordinator: "c1", Epoch: 7, Sent: time.Second, TTL: 3 * time.Second}, old)
	restored := Voters{IDs: []string{"c1", "c2", "c3"}, Index: 412}
	h.SetEpoch(1_000_031)
	for _, c := range []string{"c1", "c2"} {
		h.Granted(Grant{Coordinator: c, Epoch: 1_000_031, Sent: 10 * time.Second, TTL: 3 * time.Second}, restored)
	}
	if ok, _ := h.Valid(11 * time.Second); !ok {
		t.Fatalf("two of three grants of the restored cluster do not make a lease: voters %+v", h.Voters())
	}
}
