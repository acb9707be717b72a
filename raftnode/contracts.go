package raftnode

import (
	"context"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	waldenv1 "walden/proto/walden/v1"
)

// StateMachine is the replicated state. Every method is called from the
// node's apply path only, one call at a time, in log order.
//
// Apply and ApplyConfChange must be deterministic: the same entries in the
// same order produce the same state on every member, so they read no clock,
// no randomness and do no I/O. An error returned by Apply is a result for the
// proposer (the command was refused), not a failure of the member.
type StateMachine interface {
	// Apply applies the command of the normal entry at index.
	Apply(index, term uint64, cmd *waldenv1.Command) (*waldenv1.Result, error)
	// ApplyConfChange records a membership change that raft has applied;
	// ctx is decoded from the entry's Context (nil when it had none).
	ApplyConfChange(index uint64, cc *raftpb.ConfChangeV2, ctx *waldenv1.ConfChangeContext, cs *raftpb.ConfState) error
	// Snapshot serializes the state as of the last applied index.
	Snapshot() ([]byte, error)
	// Restore replaces the state with a snapshot's data.
	Restore(data []byte) error
	// AppliedIndex is the index of the last entry applied.
	AppliedIndex() uint64
	// Members is the current membership with addresses (roles unset).
	Members() []*waldenv1.Member
}

// Transport carries raft messages between members.
//
// Send never blocks on the network: a message that cannot be delivered is
// dropped and the peer reported unreachable (raft retries). Messages to one
// peer are delivered in the order sent.
type Transport interface {
	// Start begins delivering received messages to h.
	Start(h Handler) error
	Send(msgs []*raftpb.Message)
	AddPeer(id uint64, addr string)
	RemovePeer(id uint64)
	// Reachable reports whether this member can currently reach the peer
	// (whether or not it has sent to it lately).
	Reachable(id uint64) bool
	Close() error
}

// Handler is the receiving side of a Transport: the node.
type Handler interface {
	// Process steps a received message into raft.
	Process(ctx context.Context, m *raftpb.Message) error
	// ReportUnreachable tells raft that a send to id failed.
	ReportUnreachable(id uint64)
	// ReportSnapshot tells raft whether a snapshot sent to id was delivered.
	ReportSnapshot(id uint64, status raft.SnapshotStatus)
	// ReportRemoved tells the node that peer id refused its messages
	// because it applied this member's removal, by the raft entry at index
	// (Process's RemovedError on the peer's side).
	ReportRemoved(id, index uint64)
}
