package raftnode

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
)

// LinearizableRead returns once this member's state machine reflects every
// entry committed before the call (raft ReadIndex, then waiting for the
// applied index to reach the read index). It fails fast with ErrNoLeader.
func (n *Node) LinearizableRead(ctx context.Context) error {
	if n.stopped() {
		return ErrStopped
	}
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
