package raftnode

import (
	"context"
	"time"
)

// What the external tests (package raftnode_test, which run clusters on
// raftnodetest's network) use of the package's internals and of its own
// test helpers.
var (
	TestLogger = testLogger
	Noop       = noop
)

// SnapshotForTest serializes the member's state machine (recordingSM in
// the cluster tests serializes it with the apply path).
func (n *Node) SnapshotForTest() ([]byte, error) { return n.sm.Snapshot() }

// SnapshotsApplied counts the snapshots received from a leader and applied.
func (n *Node) SnapshotsApplied() uint64 { return n.snapshotsApplied.Load() }

// Role reports whether raft id is a voter or a learner in the applied
// configuration.
func (n *Node) Role(id uint64) (voter, learner bool) { return n.role(id) }

// RaftApplied is raft's own applied index: what this member acknowledged
// to raft.Node (Advance), which can trail what it applied.
func (n *Node) RaftApplied() uint64 { return n.raft.Status().Applied }

// ElectionTimeout is the election timeout in time.
func (n *Node) ElectionTimeout() time.Duration { return n.electionTimeout() }

// RaftProposeForTest proposes data as it is, below the node's encoding (as
// a damaged log would hand it to the apply path).
func (n *Node) RaftProposeForTest(ctx context.Context, data []byte) error {
	return n.raft.Propose(ctx, data)
}
