package broker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

// How the broker learns that streams were closed.
const (
	// watchProgress is the progress notice interval the broker asks of its
	// watch; three of them without an answer make polling the way again.
	watchProgress = time.Second
	// pollEvery: while the watch answers, maintain still lists the closed
	// streams every pollEvery rounds (a fallback that costs little).
	pollEvery = 20
)

// watchClosedStreams follows the catalog's streams through the
// coordinators' Watch until ctx ends: every stream it sees closed (in the
// first snapshot too) that the broker wants — a configured one, or any with
// takeover — is handed to the serving loop at once (openClosed). A
// coordinator without Watch leaves the broker on polling (maintain).
func (b *Broker) watchClosedStreams(ctx context.Context) {
	want := map[uint64]bool{}
	for _, id := range b.cfg.Streams {
		want[id] = true
	}
	req := &waldenv1.WatchRequest{Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_STREAM},
		ProgressIntervalMs: uint32(watchProgress.Milliseconds())}
	err := b.coords.Watch(ctx, req, func(resp *waldenv1.WatchResponse) error {
		b.watchSeen.Store(time.Now().UnixNano())
		var ids []uint64
		for _, c := range resp.GetChanges() {
			st := c.GetStream()
			if st.GetState() == "closed" && (b.cfg.Takeover || want[st.GetStreamId()]) {
				ids = append(ids, st.GetStreamId())
			}
		}
		if len(ids) == 0 {
			return nil
		}
		b.closedMu.Lock()
		for _, id := range ids {
			b.closed[id] = true
		}
		b.closedMu.Unlock()
		select {
		case b.reopen <- struct{}{}:
		default:
		}
		return nil
	})
	b.watchSeen.Store(0)
	if err != nil && ctx.Err() == nil {
		b.log.Warn("cannot watch the coordinators' state; learning of closed streams by polling only", "err", err)
	}
}

// watchHealthy reports whether the watch answered lately.
func (b *Broker) watchHealthy() bool {
	seen := b.watchSeen.Load()
	return seen != 0 && time.Since(time.Unix(0, seen)) < 3*watchProgress
}

// openClosed opens the streams the watch saw closed that inc does not
// hold, all at once (the coordinators commit the opens together).
func (b *Broker) openClosed(ctx context.Context, inc *incarnation, log *slog.Logger) {
	b.closedMu.Lock()
	ids := make([]uint64, 0, len(b.closed))
	for id := range b.closed {
		ids = append(ids, id)
	}
	clear(b.closed)
	b.closedMu.Unlock()
	var wg sync.WaitGroup
	for _, id := range ids {
		b.walMu.RLock()
		_, have := inc.streams[id]
		b.walMu.RUnlock()
		if !have && !inc.isFenced(b) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.openStream(ctx, inc, id, log)
			}()
		}
	}
	wg.Wait()
}
