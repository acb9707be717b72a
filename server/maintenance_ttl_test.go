package server

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"walden/config"
	waldenv1 "walden/proto/walden/v1"
)

func TestMaintenanceExpiry(t *testing.T) {
	leader := true
	brokers := []*waldenv1.Broker{
		{BrokerId: "b1", Maintenance: true, MaintenanceTtlMs: 60_000, MaintenanceUntilUnixMs: 1000},
		{BrokerId: "b2", Maintenance: true}, // no ttl: until turned off
	}
	var proposed []*waldenv1.SetMaintenance
	m := &maintenanceExpiry{
		leader:  func() bool { return leader },
		brokers: func() []*waldenv1.Broker { return brokers },
		propose: func(_ context.Context, cmd *waldenv1.Command) error {
			proposed = append(proposed, cmd.GetSetMaintenance())
			return nil
		},
		logger: slog.New(slog.DiscardHandler),
		seen:   map[string]seenSetting{},
	}
	ctx := context.Background()
	t0 := time.Now()
	m.tick(ctx, t0)                     // first seen now
	m.tick(ctx, t0.Add(59*time.Second)) // not yet
	leader = false                      // leadership lost: the count starts again
	m.tick(ctx, t0.Add(61*time.Second))
	leader = true
	m.tick(ctx, t0.Add(62*time.Second))
	m.tick(ctx, t0.Add(121*time.Second))
	if len(proposed) != 0 {
		t.Fatalf("ended early: %v", proposed)
	}
	// Set again meanwhile: counted from when this leader saw the new setting.
	brokers[0] = &waldenv1.Broker{BrokerId: "b1", Maintenance: true, MaintenanceTtlMs: 60_000, MaintenanceUntilUnixMs: 5000}
	m.tick(ctx, t0.Add(122*time.Second))
	m.tick(ctx, t0.Add(181*time.Second))
	if len(proposed) != 0 {
		t.Fatalf("ended early after a new setting: %v", proposed)
	}
	m.tick(ctx, t0.Add(182*time.Second))
	if len(proposed) != 1 || proposed[0].GetBrokerId() != "b1" || proposed[0].GetOn() || proposed[0].GetIfUntilUnixMs() != 5000 {
		t.Fatalf("proposed %v", proposed)
	}
}

func TestMaintenanceOnAgainKeepsWhatIsLeftOfItsTTL(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	for _, tc := range []struct {
		b    *waldenv1.Broker
		want int64
	}{
		{&waldenv1.Broker{Maintenance: true, MaintenanceTtlMs: 60_000, MaintenanceUntilUnixMs: 1_030_000}, 30_000},
		{&waldenv1.Broker{Maintenance: true, MaintenanceTtlMs: 60_000, MaintenanceUntilUnixMs: 999_000}, 1}, // ran out, not yet ended
		{&waldenv1.Broker{Maintenance: true}, 0},
		{&waldenv1.Broker{}, 0},
		{nil, 0},
	} {
		if got := keptTTL(tc.b, now); got != tc.want {
			t.Errorf("keptTTL(%v) = %d, want %d", tc.b, got, tc.want)
		}
	}
}

// TestReloadSaysWhatAChangedKeyDoes: a changed policy section is not a
// key that "takes effect at the next start" (it never does: it seeds a new
// cluster only); other keys are.
func TestReloadSaysWhatAChangedKeyDoes(t *testing.T) {
	running := config.DefaultServerConfig()
	next := config.DefaultServerConfig()
	next.Policy.FailureTimeout = 9 * time.Second
	next.Raft.ElectionTicks = 20
	next.Log.Level = "warn"
	keys, policy := changedKeys(running, next)
	if fmt.Sprint(keys) != "[raft]" || !policy {
		t.Fatalf("restart keys %v, policy changed %v", keys, policy)
	}
}
