package fsm_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// TestLeaseHorizonOnlyGrows: the horizon is the longest lease_ttl +
// drift_margin the effective policy ever had; cutting lease_ttl does not
// shorten it (grants made with the longer TTL may still run), and a
// snapshot keeps it.
func TestLeaseHorizonOnlyGrows(t *testing.T) {
	h := newHarness(t)
	if ms, seeded := h.s.LeaseHorizon(); ms != 0 || seeded {
		t.Fatalf("before the seed: horizon %d ms, seeded %t", ms, seeded)
	}
	seed := policy.Defaults()
	h.ok(&waldenv1.SeedPolicy{Policy: seed, SeededBy: "c1"})
	base := seed.GetLeaseTtlMs() + seed.GetDriftMarginMs()
	if ms, seeded := h.s.LeaseHorizon(); ms != base || !seeded {
		t.Fatalf("after the seed: horizon %d ms, seeded %t; want %d ms", ms, seeded, base)
	}
	h.ok(&waldenv1.SetPolicy{Set: map[string]string{"lease_ttl": "4s", "failure_timeout": "20s"}, Actor: "operator"})
	want := int64(4000) + seed.GetDriftMarginMs()
	if ms, _ := h.s.LeaseHorizon(); ms != want {
		t.Fatalf("after lease_ttl 4s: horizon %d ms, want %d", ms, want)
	}
	h.ok(&waldenv1.SetPolicy{Unset: []string{"lease_ttl"}, Actor: "operator"})
	if ms, _ := h.s.LeaseHorizon(); ms != want {
		t.Fatalf("after lease_ttl went back: horizon %d ms, want %d still", ms, want)
	}
	r, err := h.s.Renewal("b1", h.register("b1"))
	if err != nil {
		t.Fatal(err)
	}
	if r.LeaseHorizonMs != want {
		t.Fatalf("Renewal.LeaseHorizonMs = %d, want %d", r.LeaseHorizonMs, want)
	}

	data, err := h.s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	restored := fsm.New("demo")
	if err := restored.Restore(data); err != nil {
		t.Fatal(err)
	}
	if ms, _ := restored.LeaseHorizon(); ms != want {
		t.Fatalf("restored horizon %d ms, want %d", ms, want)
	}
}

// TestMemberIncarnation: a member's incarnation is the index of the change
// that added it; promotion keeps it, and a member removed and added again
// under its name is a new incarnation, which the voters of a renewal carry.
func TestMemberIncarnation(t *testing.T) {
	h := newHarness(t)
	incarnation := func(id string) uint64 {
		for _, m := range h.s.Members() {
			if m.GetId() == id {
				return m.GetIncarnation()
			}
		}
		t.Fatalf("no member %s", id)
		return 0
	}
	first := incarnation("c3")
	if first != 3 {
		t.Fatalf("c3 added at index 3 has incarnation %d", first)
	}
	h.index++
	if err := h.s.ApplyConfChange(h.index, remove(rid("c3")), nil, nil); err != nil {
		t.Fatal(err)
	}
	h.index++
	added := h.index
	if err := h.s.ApplyConfChange(added, addLearner(rid("c3")), memberCtx("c3"), nil); err != nil {
		t.Fatal(err)
	}
	h.index++
	if err := h.s.ApplyConfChange(h.index, addVoter(rid("c3")), nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := incarnation("c3"); got != added {
		t.Fatalf("c3 added again at index %d, promoted after: incarnation %d", added, got)
	}
	r, err := h.s.Renewal("b1", h.register("b1"))
	if err != nil {
		t.Fatal(err)
	}
	want := []*waldenv1.Voter{
		{Id: "c1", AdminAddr: memberCtx("c1").GetMember().GetAdminAddr(), Incarnation: 1},
		{Id: "c2", AdminAddr: memberCtx("c2").GetMember().GetAdminAddr(), Incarnation: 2},
		{Id: "c3", AdminAddr: memberCtx("c3").GetMember().GetAdminAddr(), Incarnation: added},
	}
	if len(r.Voters) != len(want) {
		t.Fatalf("voters %v", r.Voters)
	}
	for i := range want {
		if !proto.Equal(r.Voters[i], want[i]) {
			t.Fatalf("voter %d = %v, want %v", i, r.Voters[i], want[i])
		}
	}
}
