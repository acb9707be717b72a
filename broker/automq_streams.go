package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"walden/automq/controller"
	"walden/automq/devcontroller"
	"walden/automq/metaview"
	"walden/automq/object"
	"walden/automq/protocol"
	"walden/config"
	"walden/producer"
)

// leadHow says why a broker opens a stream.
type leadHow int

const (
	// leadConfigured: one of the broker's streams, opened at start. When
	// another node holds it (STREAM_NOT_CLOSED and the controller names
	// that node), that node leads it now and the broker stops trying.
	leadConfigured leadHow = iota
	// leadTakeover: a stream of a node that is unreachable: the broker
	// leads it now and retries STREAM_NOT_CLOSED until the node's failover
	// closes it, as AutoMQ's new partition leaders do.
	leadTakeover
)

// lead opens stream id for this node, retrying with backoff, and adopts it
// once opened; it returns whether the broker leads the stream. The epoch it
// opens at is the stream's epoch at the controller plus one (AutoMQ opens a
// partition's streams at the partition's leader epoch, which the
// controller raised); an open this node made whose answer was lost is made
// again at the same epoch.
func (b *AutomqBroker) lead(ctx context.Context, id uint64, how leadHow, from int32) bool {
	log := b.log.With("stream_id", id)
	backoff := b.cfg.Automq.OpenBackoff
	began := time.Now()
	notClosed := 0
	for ctx.Err() == nil {
		if b.leads(id) {
			return true
		}
		st, ok, err := b.meta.Stream(ctx, int64(id))
		switch {
		case err != nil:
			log.Warn("cannot read the stream's metadata; retrying", "err", err)
		case !ok:
			log.Warn("the controller has no such stream; retrying", "backoff", b.cfg.Automq.OpenMaxBackoff)
			backoff = b.cfg.Automq.OpenMaxBackoff
		default:
			epoch := st.Epoch + 1
			if st.State == devcontroller.StreamOpened && st.Owner == b.node {
				epoch = st.Epoch // this node opened it; the answer was lost
			}
			res, err := b.ctl.OpenStreams(ctx, b.node, b.epoch, []controller.OpenStream{{StreamID: int64(id), StreamEpoch: epoch}})
			switch {
			case err == nil:
				if notClosed > 0 {
					log.Info("stream opened after its failover closed it", "stream_epoch", epoch, "not_closed_answers", notClosed,
						"waited_ms", time.Since(began).Milliseconds())
				}
				return b.adopt(ctx, id, epoch, res[0].StartOffset, res[0].NextOffset, log)
			case errors.Is(err, protocol.ErrStreamNotClosed):
				notClosed++
				if how == leadConfigured && st.Owner != b.node && st.Owner >= 0 {
					log.Info("another node leads this stream now; this broker does not open it", "owner_node", st.Owner,
						"stream_epoch", st.Epoch)
					return false
				}
				if notClosed == 1 {
					log.Info("the stream is still opened by its old leader (STREAM_NOT_CLOSED): retrying until its failover closes it",
						"owner_node", st.Owner, "from_node", from, "stream_epoch", epoch)
				}
			case errors.Is(err, protocol.ErrStreamFenced):
				// Another open raised the epoch meanwhile: read it again.
				log.Info("the stream's epoch moved (STREAM_FENCED); reading it again", "stream_epoch", epoch)
				backoff = b.cfg.Automq.OpenBackoff
				continue
			case errors.Is(err, controller.ErrOutcomeUnknown):
				log.Warn("the open's answer was lost; opening again", "stream_epoch", epoch, "err", err)
				continue
			default:
				log.Warn("open stream failed; retrying", "stream_epoch", epoch, "err", err)
			}
		}
		if !sleepFor(ctx, backoff) {
			break
		}
		backoff = min(2*backoff, b.cfg.Automq.OpenMaxBackoff)
	}
	return false
}

// leads reports whether the broker serves stream id.
func (b *AutomqBroker) leads(id uint64) bool {
	b.walMu.RLock()
	defer b.walMu.RUnlock()
	_, ok := b.streams[id]
	return ok
}

// adopt serves a stream the controller opened for this node at next: it
// first learns each idempotent producer's last batch from the stream's
// newest committed records (a retry of a batch the old leader wrote to its
// WAL, which the failover committed, is then answered as stored).
func (b *AutomqBroker) adopt(ctx context.Context, id uint64, epoch, start, next int64, log *slog.Logger) bool {
	for ctx.Err() == nil {
		began := time.Now()
		table, segs, err := b.producerState(ctx, int64(id), next)
		if err != nil {
			log.Warn("cannot read the stream's producers from its committed objects; retrying", "err", err)
			if !sleepFor(ctx, 500*time.Millisecond) {
				return false
			}
			continue
		}
		producers := table.Len()
		s := &ownedStream{id: id, epoch: uint64(epoch), next: uint64(next), producers: table}
		s.committed.Store(uint64(next))
		b.walMu.Lock()
		b.streams[id] = s
		b.walMu.Unlock()
		log.Info("stream opened", "stream_epoch", epoch, "start_offset", start, "next_offset", next, "producers", producers,
			"objects_read", segs, "producers_ms", time.Since(began).Milliseconds())
		return true
	}
	return false
}

// producerState reads the newest committed records of stream id below next,
// up to automq.producer_scan_bytes of objects, and returns each producer's
// last batch.
func (b *AutomqBroker) producerState(ctx context.Context, id, next int64) (*producer.Table, int, error) {
	table := producer.NewTable(nil)
	objs, err := b.meta.Committed(ctx)
	if err != nil {
		return nil, 0, err
	}
	segs := metaview.AllSegments(objs, id)
	first := len(segs)
	var bytes int64
	for first > 0 && bytes < b.cfg.Automq.ProducerScanBytes {
		first--
		bytes += segs[first].Object.Size
	}
	for _, seg := range segs[first:] {
		if seg.StartOffset >= next {
			break
		}
		var bad error
		err := b.objs.ReadSegment(ctx, seg, seg.StartOffset, func(r object.Record) bool {
			h, err := producer.HeaderOf(r.Payload)
			if err != nil {
				bad = fmt.Errorf("stream %d offset %d: %w", id, r.BaseOffset, err)
				return false
			}
			if h.ID != 0 {
				table.Record(h.ID, h.Sequence, uint32(r.Count), uint64(r.BaseOffset))
			}
			return true
		})
		if err == nil {
			err = bad
		}
		if err != nil {
			return nil, 0, err
		}
	}
	return table, len(segs) - first, nil
}

// openedBefore reports whether the controller shows any of streams opened
// at least once (it has ranges).
func (b *AutomqBroker) openedBefore(ctx context.Context, streams []uint64) bool {
	ss, err := b.meta.Streams(ctx)
	if err != nil {
		return false
	}
	for _, s := range ss {
		if slices.Contains(streams, uint64(s.StreamID)) && len(s.Ranges) > 0 {
			return true
		}
	}
	return false
}

// watchNode takes over t's streams when node t.NodeID stops answering, as
// the KRaft controller moves the partitions of a broker whose heartbeats
// stopped: the node's data API is probed with TCP connects; once it has
// answered at least once — or the streams were opened before, by anyone
// (this broker started after the node died) — and then not for
// takeover_after, this broker leads t's streams (lead with leadTakeover).
// A node that never answered and whose streams were never opened is still
// starting: its streams stay its own. If the node answers again before the
// streams opened, the broker gives them back. It returns once it leads all
// of them.
func (b *AutomqBroker) watchNode(ctx context.Context, t config.BrokerAutomqTakeover) {
	after := b.cfg.Automq.TakeoverAfter
	interval := max(min(250*time.Millisecond, after/4), 20*time.Millisecond)
	log := b.log.With("from_node", t.NodeID, "from_addr", t.Addr)
	var lastUp time.Time
	began := time.Now()
	var leading context.CancelFunc
	done := make(chan struct{}, len(t.Streams))
	opened := 0
	defer func() {
		if leading != nil {
			leading()
		}
	}()
	for ctx.Err() == nil && opened < len(t.Streams) {
		d := net.Dialer{Timeout: min(interval, 500*time.Millisecond)}
		conn, err := d.DialContext(ctx, "tcp", t.Addr)
		now := time.Now()
		if err == nil {
			_ = conn.Close()
			lastUp = now
			if leading != nil {
				leading()
				leading = nil
				log.Info("the node answers again: its streams stay with it")
			}
		} else if lastUp.IsZero() && b.openedBefore(ctx, t.Streams) {
			lastUp = began
		}
		if err != nil && !lastUp.IsZero() && leading == nil && now.Sub(lastUp) >= after {
			lctx, cancel := context.WithCancel(ctx)
			leading = cancel
			log.Info("the node has not answered for takeover_after: this broker leads its streams now, as the controller moves "+
				"the partitions of a dead broker; opening them", "streams", t.Streams, "silent_ms", now.Sub(lastUp).Milliseconds())
			for _, id := range t.Streams {
				go func() {
					if b.lead(lctx, id, leadTakeover, t.NodeID) {
						done <- struct{}{}
					}
				}()
			}
		}
		select {
		case <-ctx.Done():
		case <-done:
			opened++
		case <-time.After(interval):
		}
	}
}
