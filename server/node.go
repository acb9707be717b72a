package server

import (
	"context"

	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// ClusterNode is what the admin API needs from the raft node of this member.
// *raftnode.Node satisfies it.
type ClusterNode interface {
	// Status is this member's current view of the group.
	Status() raftnode.Status
	// LeaderID is the leader's member id, "" while there is none.
	LeaderID() string
	// Ready reports whether the member knows a leader and has applied up to
	// the commit index it learned at start.
	Ready() bool
	// LinearizableRead returns once the local state reflects every entry
	// committed before the call (ReadIndex).
	LinearizableRead(ctx context.Context) error
	// AddMember adds a member as a learner and returns once it is applied.
	AddMember(ctx context.Context, m *waldenv1.MemberContext) error
	// RemoveMember removes a member and returns once it is applied.
	RemoveMember(ctx context.Context, id string) error
	// TransferLeadership hands leadership to id; on a member that is not the
	// leader it fails with raftnode.ErrNotLeader.
	TransferLeadership(ctx context.Context, id string) error
}
