package raftnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// Propose replicates cmd and returns the state machine's result once the
// entry is applied on this member, or the state machine's error for it. It
// sets request_id and proposer_id, and proposed_unix_ms when zero, on a copy
// of cmd. It fails fast with ErrNoLeader when no leader is known; otherwise
// it waits for the outcome or ctx (callers set a deadline: a proposal lost
// with a leader change is never answered).
func (n *Node) Propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	start := time.Now()
	out, err := n.propose(ctx, cmd)
	if err != nil {
		n.metrics.proposalsFailed.Inc()
		return nil, err
	}
	n.metrics.proposalsCommitted.Inc()
	n.metrics.proposalDuration.Observe(time.Since(start).Seconds())
	return out.result, out.err
}

// propose returns the outcome of applying cmd (which may be the state
// machine's refusal), or an error when cmd was not applied (or its fate is
// unknown).
func (n *Node) propose(ctx context.Context, cmd *waldenv1.Command) (applied, error) {
	if cmd == nil {
		return applied{}, errors.New("raftnode: propose: nil command")
	}
	if n.stopped() {
		return applied{}, ErrStopped
	}
	if n.leader.Load() == raft.None {
		return applied{}, ErrNoLeader
	}
	cmd = proto.Clone(cmd).(*waldenv1.Command)
	cmd.RequestId = n.reqIDs.Next()
	cmd.ProposerId = n.cfg.NodeID
	if cmd.ProposedUnixMs == 0 {
		cmd.ProposedUnixMs = time.Now().UnixMilli()
	}
	if n.cfg.PrepareProposal != nil {
		n.cfg.PrepareProposal(cmd)
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		return applied{}, fmt.Errorf("raftnode: propose: marshal command: %w", err)
	}
	ch := n.wait.Register(cmd.GetRequestId())
	if ch == nil {
		return applied{}, fmt.Errorf("raftnode: propose: request id %x already pending", cmd.GetRequestId())
	}
	defer n.wait.Cancel(cmd.GetRequestId())
	if n.leader.Load() == n.id && n.transferring.Load() == 0 {
		// On the leader, queue the entry: runProposals steps everything
		// queued in one proposal message, which raft appends and sends to
		// the followers as one batch instead of one append message per
		// proposal and follower.
		n.queueProposal(ctx, data)
	} else if n.forwardProposals.Load() {
		n.forwardProposal(raftpb.EntryNormal, data)
	} else if err := n.raft.Propose(ctx, data); err != nil {
		// Elsewhere (and during a leadership transfer), propose one by
		// one: raft forwards to the leader and reports a refusal.
		return applied{}, n.raftError("propose", err)
	}
	select {
	case a := <-ch:
		if errors.Is(a.err, ErrStopped) {
			return applied{}, ErrStopped
		}
		return a, nil
	case <-ctx.Done():
		return applied{}, fmt.Errorf("raftnode: propose: %w", ctx.Err())
	case <-n.donec:
		return applied{}, ErrStopped
	}
}

// maxProposalBatch bounds the entries stepped into raft at once.
const maxProposalBatch = 1024

// queuedProposal is a proposal waiting for runProposals; ctx is its
// proposer's.
type queuedProposal struct {
	ctx  context.Context
	data []byte
}

func (n *Node) queueProposal(ctx context.Context, data []byte) {
	n.propMu.Lock()
	n.propQueue = append(n.propQueue, queuedProposal{ctx: ctx, data: data})
	n.propMu.Unlock()
	select {
	case n.propSignal <- struct{}{}:
	default:
	}
}

// runProposals steps the queued proposals into raft, as many as are queued
// (up to maxProposalBatch) in one MsgProp. Proposals queue up while raft
// takes the previous batch, so the batches grow with the load.
//
// raft.Node.Step does not report a dropped proposal the way Propose does. A
// batch is queued only while this member leads and no transfer runs; should
// leadership change before raft takes it, raft forwards it to the new leader
// or drops it, and its proposers wait for their deadline, as do those of a
// proposal lost with a leader change after raft took it.
func (n *Node) runProposals() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.stopc:
		case <-n.donec:
		}
		cancel()
	}()
	var batch []queuedProposal
	for {
		select {
		case <-n.propSignal:
		case <-ctx.Done():
			return
		}
		for {
			n.propMu.Lock()
			k := min(len(n.propQueue), maxProposalBatch)
			batch = append(batch[:0], n.propQueue[:k]...)
			rest := copy(n.propQueue, n.propQueue[k:])
			clear(n.propQueue[rest:])
			n.propQueue = n.propQueue[:rest]
			n.propMu.Unlock()
			if len(batch) == 0 {
				break
			}
			// A proposer that gave up before its entry reached raft is not
			// proposed for (as raft.Node.Propose with an expired ctx).
			ents := make([]*raftpb.Entry, 0, len(batch))
			for _, q := range batch {
				if q.ctx.Err() == nil {
					ents = append(ents, &raftpb.Entry{Type: raftpb.EntryNormal.Enum(), Data: q.data})
				}
			}
			clear(batch)
			if len(ents) == 0 {
				continue
			}
			msg := &raftpb.Message{Type: raftpb.MsgProp.Enum(), From: new(n.id), Entries: ents}
			if err := n.raft.Step(ctx, msg); err != nil {
				return // stopped
			}
		}
	}
}

// forwardProposal sends an entry of type typ to the leader as raft forwards
// a follower's proposal (a MsgProp without a term), for the time raft.Node
// takes no proposals from this member (forwardProposals). Like any
// forwarded proposal it may be lost; its proposer waits for its deadline.
func (n *Node) forwardProposal(typ raftpb.EntryType, data []byte) {
	leader := n.leader.Load()
	if leader == raft.None || leader == n.id {
		return
	}
	n.tr.Send([]*raftpb.Message{{
		Type: raftpb.MsgProp.Enum(), From: new(n.id), To: new(leader),
		Entries: []*raftpb.Entry{{Type: typ.Enum(), Data: data}},
	}})
}

// raftError maps an error of raft.Node to this package's errors.
func (n *Node) raftError(op string, err error) error {
	switch {
	case errors.Is(err, raft.ErrStopped):
		return ErrStopped
	case errors.Is(err, raft.ErrProposalDropped):
		if n.leader.Load() == raft.None {
			return ErrNoLeader
		}
		return fmt.Errorf("%w: %s", ErrProposalDropped, op)
	default:
		return fmt.Errorf("raftnode: %s: %w", op, err)
	}
}
