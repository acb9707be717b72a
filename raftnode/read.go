package raftnode

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
)

// readRound is one ReadIndex round that every LinearizableRead waiting for
// it shares, as etcd batches its linearizable reads: a caller joins the
// round that has not started yet, runReads starts it, and the callers that
// arrive while it runs join the next one. A round starts after every one
// of its callers called, so its read index covers everything committed
// before each of them.
type readRound struct {
	done chan struct{} // closed once err is set
	err  error
	// ctx ends the round when its last caller gave up, or the node stops.
	ctx    context.Context
	cancel context.CancelFunc
	// waiters and started are guarded by Node.readMu.
	waiters int
	started bool
}

func newReadRound(parent context.Context) *readRound {
	ctx, cancel := context.WithCancel(parent)
	return &readRound{done: make(chan struct{}), ctx: ctx, cancel: cancel}
}

// LinearizableRead returns once this member's state machine reflects every
// entry committed before the call (raft ReadIndex, then waiting for the
// applied index to reach the read index). It fails fast with ErrNoLeader.
// Concurrent calls share one ReadIndex round (see readRound).
func (n *Node) LinearizableRead(ctx context.Context) error {
	if n.stopped() {
		return ErrStopped
	}
	if n.leader.Load() == raft.None {
		return ErrNoLeader
	}
	n.readMu.Lock()
	r := n.readNext
	r.waiters++
	n.readMu.Unlock()
	select {
	case n.readSignal <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		n.leaveRead(r)
		return fmt.Errorf("raftnode: read index: %w", ctx.Err())
	case <-n.donec:
		return ErrStopped
	}
}

// leaveRead takes a caller that gave up off its round; a started round
// that nobody waits for any more is abandoned.
func (n *Node) leaveRead(r *readRound) {
	n.readMu.Lock()
	defer n.readMu.Unlock()
	r.waiters--
	if r.started && r.waiters == 0 {
		r.cancel()
	}
}

// runReads starts the read rounds one after the other, each once a caller
// waits for it, until the node stops.
func (n *Node) runReads() {
	ctx, cancel := n.readCtx, n.readCancel
	defer cancel()
	go func() {
		select {
		case <-n.stopc:
		case <-n.donec:
		}
		cancel()
	}()
	for {
		select {
		case <-n.readSignal:
		case <-ctx.Done():
			return
		}
		n.readMu.Lock()
		r := n.readNext
		if r.waiters == 0 { // every caller gave up before it started
			n.readMu.Unlock()
			continue
		}
		r.started = true
		callers := r.waiters
		n.readNext = newReadRound(ctx)
		n.readMu.Unlock()

		r.err = n.readIndex(r.ctx)
		r.cancel()
		n.metrics.readRounds.Inc()
		n.metrics.linearizableReads.Add(float64(callers))
		close(r.done)
	}
}

// readIndex runs one ReadIndex round: it asks raft for a read index and
// waits until this member applied up to it.
func (n *Node) readIndex(ctx context.Context) error {
	if n.leader.Load() == raft.None {
		return ErrNoLeader
	}
	rctx := make([]byte, 8)
	binary.BigEndian.PutUint64(rctx, n.reqIDs.Next())
	ch := make(chan uint64, 1)
	n.readMu.Lock()
	n.reads[string(rctx)] = ch
	n.readMu.Unlock()
	defer func() {
		n.readMu.Lock()
		delete(n.reads, string(rctx))
		n.readMu.Unlock()
	}()

	// raft drops a read index request it cannot serve yet (for example a
	// leader that has not committed an entry of its term); ask again every
	// election timeout.
	retry := time.NewTicker(n.electionTimeout())
	defer retry.Stop()
	for {
		if err := n.raft.ReadIndex(ctx, rctx); err != nil {
			return n.raftError("read index", err)
		}
		select {
		case index := <-ch:
			select {
			case <-n.applyWait.Wait(index):
				return nil
			case <-ctx.Done():
				return fmt.Errorf("raftnode: read index: wait for applied index %d: %w", index, ctx.Err())
			case <-n.donec:
				return ErrStopped
			}
		case <-retry.C:
			if n.leader.Load() == raft.None {
				return ErrNoLeader
			}
		case <-ctx.Done():
			return fmt.Errorf("raftnode: read index: %w", ctx.Err())
		case <-n.donec:
			return ErrStopped
		}
	}
}

func (n *Node) deliverReadState(rs raft.ReadState) {
	n.readMu.Lock()
	ch, ok := n.reads[string(rs.RequestCtx)]
	n.readMu.Unlock()
	if ok {
		select {
		case ch <- rs.Index:
		default:
		}
	}
}
