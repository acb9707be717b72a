package fsm_test

import (
	"testing"

	waldenv1 "walden/proto/walden/v1"
)

func TestMaintenanceReasonAndTTL(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b1", On: true, Reason: "kernel upgrade", TtlMs: 90 * 60 * 1000})
	b := h.broker("b1")
	until := h.nowMs + 90*60*1000
	if !b.GetMaintenance() || b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_MAINTENANCE || b.GetMaintenanceReason() != "kernel upgrade" ||
		b.GetMaintenanceTtlMs() != 90*60*1000 || b.GetMaintenanceUntilUnixMs() != until {
		t.Fatalf("on: %v", b)
	}
	evs := h.s.Events("b1", 1)
	if evs[0].GetMessage() != "maintenance on for 1h30m: kernel upgrade" {
		t.Fatalf("event %q", evs[0].GetMessage())
	}
	// Set again (a new until): an expiry of the earlier setting changes nothing.
	h.nowMs += 1000
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b1", On: true, Reason: "longer", TtlMs: 2 * 3600 * 1000})
	n := len(h.s.Events("b1", 0))
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b1", On: false, Reason: "ttl ran out", IfUntilUnixMs: until})
	if b := h.broker("b1"); !b.GetMaintenance() || b.GetMaintenanceReason() != "longer" || len(h.s.Events("b1", 0)) != n {
		t.Fatalf("a stale expiry applied: %v", b)
	}
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b1", On: false, Reason: "ttl ran out", IfUntilUnixMs: h.broker("b1").GetMaintenanceUntilUnixMs()})
	b = h.broker("b1")
	if b.GetMaintenance() || b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_ALIVE || b.GetMaintenanceReason() != "" || b.GetMaintenanceUntilUnixMs() != 0 {
		t.Fatalf("off: %v", b)
	}
	if m := h.s.Events("b1", 1)[0].GetMessage(); m != "maintenance off: ttl ran out" {
		t.Fatalf("event %q", m)
	}
}
