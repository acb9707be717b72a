package fsm_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// TestBrokersViewSharedUntilAChange: the registry copy BrokersView returns
// is the same until an entry changes the state, then a new one shows the
// change; it always equals Brokers.
func TestBrokersViewSharedUntilAChange(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	h.register("b2")
	v1 := h.s.BrokersView()
	if v2 := h.s.BrokersView(); len(v1) != 2 || &v1[0] != &v2[0] {
		t.Fatalf("two reads without a change gave two copies")
	}
	same := func(view []*waldenv1.Broker) {
		t.Helper()
		all := h.s.Brokers()
		if len(all) != len(view) {
			t.Fatalf("view of %d brokers, registry of %d", len(view), len(all))
		}
		for i := range all {
			if !proto.Equal(all[i], view[i]) {
				t.Fatalf("view %v, registry %v", view[i], all[i])
			}
		}
	}
	same(v1)
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", State: "suspect", Reason: "probe"})
	v3 := h.s.BrokersView()
	if &v3[0] == &v1[0] {
		t.Fatal("the view did not change with the state")
	}
	same(v3)
	if len(v1[0].GetObservations()) != 0 {
		t.Fatal("the earlier view changed under its readers")
	}
	// A refused entry changes nothing: the view stays.
	h.refuse(&waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "nope", State: "suspect", Epoch: 1}, refusal.ErrUnknownNode)
	if v4 := h.s.BrokersView(); &v4[0] != &v3[0] {
		t.Fatal("a refused entry made a new view")
	}
}
