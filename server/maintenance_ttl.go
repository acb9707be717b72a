package server

import (
	"context"
	"log/slog"
	"time"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
)

// maxMaintenanceTTL bounds `waldenctl maintenance on --ttl`.
const maxMaintenanceTTL = time.Duration(fsm.MaxMaintenanceTTLMs) * time.Millisecond

// maintenanceExpiry ends a broker's maintenance once its TTL ran out. Only
// the leader acts, and it counts each TTL on its own monotonic clock from
// when it first saw that maintenance setting: a leader change restarts the
// count, so a maintenance may last longer than asked, never shorter (while
// in maintenance a broker is not failed over automatically, so ending it
// early would be the unsafe side). The proposal names the setting it ends
// (if_until_unix_ms), so a maintenance set again meanwhile stays.
type maintenanceExpiry struct {
	leader  func() bool
	brokers func() []*waldenv1.Broker
	propose func(ctx context.Context, cmd *waldenv1.Command) error
	logger  *slog.Logger
	// seen is when this leader first saw each broker's current setting.
	seen map[string]seenSetting
}

type seenSetting struct {
	until int64
	at    time.Time
}

func newMaintenanceExpiry(d *serviceDeps) *maintenanceExpiry {
	brokers := d.state.Brokers
	// It only reads: the copy the state shares until it changes spares a
	// copy of every broker every second.
	if v, ok := d.state.(interface{ BrokersView() []*waldenv1.Broker }); ok {
		brokers = v.BrokersView
	}
	return &maintenanceExpiry{
		leader:  func() bool { l, _ := d.isLeader(); return l },
		brokers: brokers,
		propose: func(ctx context.Context, cmd *waldenv1.Command) error { _, err := d.propose(ctx, cmd); return err },
		logger:  d.logger.With("component", "maintenance"),
		seen:    map[string]seenSetting{},
	}
}

func (m *maintenanceExpiry) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.tick(ctx, time.Now())
		}
	}
}

func (m *maintenanceExpiry) tick(ctx context.Context, now time.Time) {
	if !m.leader() {
		clear(m.seen) // a later leadership counts afresh
		return
	}
	current := map[string]bool{}
	for _, b := range m.brokers() {
		id := b.GetBrokerId()
		if !b.GetMaintenance() || b.GetMaintenanceTtlMs() <= 0 {
			continue
		}
		current[id] = true
		s, ok := m.seen[id]
		if !ok || s.until != b.GetMaintenanceUntilUnixMs() {
			m.seen[id] = seenSetting{until: b.GetMaintenanceUntilUnixMs(), at: now}
			continue
		}
		ttl := time.Duration(b.GetMaintenanceTtlMs()) * time.Millisecond
		if now.Sub(s.at) < ttl {
			continue
		}
		err := m.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_SetMaintenance{SetMaintenance: &waldenv1.SetMaintenance{
			BrokerId: id, On: false, Actor: "maintenance ttl", Reason: "its ttl of " + ttl.String() + " ran out",
			IfUntilUnixMs: b.GetMaintenanceUntilUnixMs()}}})
		if err != nil {
			m.logger.WarnContext(ctx, "ending maintenance after its ttl failed; retrying", "broker_id", id, "err", err)
			continue
		}
		m.logger.InfoContext(ctx, "maintenance ended: its ttl ran out", "broker_id", id, "ttl", ttl)
		delete(m.seen, id)
	}
	for id := range m.seen {
		if !current[id] {
			delete(m.seen, id)
		}
	}
}
