package raftnode

import (
	"errors"
	"fmt"
	"time"
)

// Errors of a running member; the storage's are raftlog's.
var (
	// ErrNoLeader is returned when this member knows no leader (election in
	// progress, or cut off from the majority). Retry later or ask another
	// member.
	ErrNoLeader = errors.New("raftnode: no leader")
	// ErrNotLeader is returned by operations that only the leader performs
	// (TransferLeadership) when called on another member.
	ErrNotLeader = errors.New("raftnode: not the leader")
	// ErrStopped is returned once the node has stopped (Stop, removal from
	// the cluster, or a fatal storage error).
	ErrStopped = errors.New("raftnode: node stopped")
	// ErrUnknownMember is returned for a member id that is not in the
	// current configuration.
	ErrUnknownMember = errors.New("raftnode: unknown member")
	// ErrMemberExists is returned when adding a member that is already in the
	// configuration.
	ErrMemberExists = errors.New("raftnode: member already exists")
	// ErrInvalidMember is returned for a member description that cannot be
	// used (empty id or raft address).
	ErrInvalidMember = errors.New("raftnode: invalid member")
	// ErrNotVoter is returned when leadership is to move to a member that
	// cannot lead (a learner).
	ErrNotVoter = errors.New("raftnode: member is not a voter")
	// ErrLastVoter is returned when removing the only voter, which would leave
	// the cluster unable to decide anything.
	ErrLastVoter = errors.New("raftnode: cannot remove the last voter")
	// ErrVoterChangeTooSoon is returned for a voter change (a promotion,
	// the removal of a voter) that comes less than Config.VoterChangeWait
	// after the previous one; a *VoterChangeTooSoonError says how long.
	ErrVoterChangeTooSoon = errors.New("raftnode: voter change too soon after the previous one")
	// ErrProposalDropped is returned when raft refused a proposal (for
	// example while leadership is being transferred); retrying may succeed.
	ErrProposalDropped = errors.New("raftnode: proposal dropped")
	// ErrInvalidConfig is wrapped by Config.Validate errors.
	ErrInvalidConfig = errors.New("raftnode: invalid config")
	// ErrCorruptEntry stops a member that is about to apply a committed
	// entry whose command (or membership change) does not decode: applying
	// anything else than what its peers apply would diverge the state.
	ErrCorruptEntry = errors.New("raftnode: committed entry does not decode")
	// ErrLogWentBackwards stops a member whose leader says it had
	// acknowledged entries beyond the end of its log: its data directory is
	// an older copy, or was wiped while the member id stayed in the cluster.
	// Such a member may have voted and acknowledged what it no longer has;
	// the way back is `waldenctl member remove` and `member add` with an
	// empty data directory.
	ErrLogWentBackwards = errors.New("raftnode: this member's raft log went backwards")
	// ErrRemoved is matched by a RemovedError: the message came from a
	// member that was removed from the cluster.
	ErrRemoved = errors.New("raftnode: member removed from the cluster")
)

// RemovedError is Process's answer to a message from a member whose
// removal this member has applied (and no addition since): the message is
// not stepped into raft, and the transport hands the refusal back to the
// sender (ReportRemoved), which stops unless it has applied the entry at
// Index itself. errors.Is(err, ErrRemoved) matches it.
type RemovedError struct {
	// Member is the removed member's name (its raft id in hex when this
	// member never learnt the name).
	Member string
	// Index is the raft index of the entry that removed it.
	Index uint64
}

func (e *RemovedError) Error() string {
	return fmt.Sprintf("raftnode: member %s was removed from the cluster by raft entry %d; its messages are refused", e.Member, e.Index)
}

func (e *RemovedError) Unwrap() error { return ErrRemoved }

// VoterChangeTooSoonError is ErrVoterChangeTooSoon with the time left.
type VoterChangeTooSoonError struct {
	// Op is the refused change, in words ("remove member c3").
	Op string
	// Wait is the spacing of voter changes; Left is what remains of it.
	Wait, Left time.Duration
}

func (e *VoterChangeTooSoonError) Error() string {
	return fmt.Sprintf("%s refused: the previous change of the voters was %s ago, and voter changes are spaced by %s "+
		"(the longest lease_ttl + drift_margin the cluster has used), so that no broker lease granted under the "+
		"configuration before it is still running; try again in %s",
		e.Op, (e.Wait - e.Left).Round(time.Millisecond), e.Wait, e.Left.Round(time.Millisecond))
}

// Unwrap makes errors.Is(err, ErrVoterChangeTooSoon) hold.
func (e *VoterChangeTooSoonError) Unwrap() error { return ErrVoterChangeTooSoon }
