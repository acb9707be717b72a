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

// MemberError is a membership change (or a leadership transfer) of member
// ID refused with one of the sentinels above (Err). Error is the chain for
// the logs; Sentence says it in the user's terms, for an API's answer.
type MemberError struct {
	// Op is what was asked, in a few words: "remove member".
	Op string
	ID string
	// Err is the sentinel: ErrUnknownMember, ErrMemberExists,
	// ErrInvalidMember, ErrNotVoter or ErrLastVoter.
	Err error
	// Why says more than the sentinel, or "".
	Why string
}

// memberSentences are the sentinels of MemberError as people read them.
var memberSentences = map[error]string{
	ErrUnknownMember: "no member has that id",
	ErrMemberExists:  "a member with that id is already in the cluster",
	ErrInvalidMember: "the member's description is invalid",
	ErrNotVoter:      "it is a learner, not a voter",
	ErrLastVoter:     "it is the last voter: the cluster could decide nothing without it",
}

func (e *MemberError) Error() string {
	msg := fmt.Sprintf("raftnode: %s %q: %v", e.Op, e.ID, e.Err)
	if e.ID == "" {
		msg = fmt.Sprintf("raftnode: %s: %v", e.Op, e.Err)
	}
	if e.Why != "" {
		msg += ": " + e.Why
	}
	return msg
}

// Unwrap makes errors.Is(err, e.Err) hold.
func (e *MemberError) Unwrap() error { return e.Err }

// Sentence is the refusal in the user's terms, without the package chain:
// `remove member "c9": no member has that id`.
func (e *MemberError) Sentence() string {
	msg := fmt.Sprintf("%s %q: %s", e.Op, e.ID, memberSentences[e.Err])
	if e.ID == "" {
		msg = e.Op + ": " + memberSentences[e.Err]
	}
	if e.Why != "" {
		msg += ": " + e.Why
	}
	return msg
}

// Sentence is err as a person reads it, for an API's answer: a
// *MemberError's or a *VoterChangeTooSoonError's sentence; for any other
// error, its text.
func Sentence(err error) string {
	var me *MemberError
	if errors.As(err, &me) {
		return me.Sentence()
	}
	var soon *VoterChangeTooSoonError
	if errors.As(err, &soon) {
		return soon.Error()
	}
	if errors.Is(err, ErrProposalDropped) {
		return "the proposal was dropped (a leadership change); retrying is safe"
	}
	return err.Error()
}

// Unwrap makes errors.Is(err, ErrVoterChangeTooSoon) hold.
func (e *VoterChangeTooSoonError) Unwrap() error { return ErrVoterChangeTooSoon }
