package fsm

import (
	"fmt"

	waldenv1 "walden/proto/walden/v1"
)

// setMaintenance records a maintenance change on b and reports whether it
// applied: not when its if_until_unix_ms no longer matches (the
// maintenance was set again since).
func (s *State) setMaintenance(b *waldenv1.Broker, op *waldenv1.SetMaintenance) bool {
	if op.GetIfUntilUnixMs() != 0 && b.GetMaintenanceUntilUnixMs() != op.GetIfUntilUnixMs() {
		return false
	}
	b.Maintenance = op.GetOn()
	if !op.GetOn() {
		b.MaintenanceReason, b.MaintenanceTtlMs, b.MaintenanceUntilUnixMs = "", 0, 0
		return true
	}
	b.MaintenanceReason = op.GetReason()
	b.MaintenanceTtlMs = max(op.GetTtlMs(), 0)
	b.MaintenanceUntilUnixMs = 0
	if b.MaintenanceTtlMs > 0 {
		b.MaintenanceUntilUnixMs = s.now() + b.MaintenanceTtlMs
	}
	return true
}

// msText writes a duration in milliseconds as 2h30m, 45s or 1500ms.
func msText(ms int64) string {
	if ms%1000 != 0 || ms < 1000 {
		return fmt.Sprintf("%dms", ms)
	}
	sec := ms / 1000
	out := ""
	if h := sec / 3600; h > 0 {
		out += fmt.Sprintf("%dh", h)
	}
	if m := sec % 3600 / 60; m > 0 {
		out += fmt.Sprintf("%dm", m)
	}
	if sec%60 > 0 || out == "" {
		out += fmt.Sprintf("%ds", sec%60)
	}
	return out
}
