package raftnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// maybePromoteLearners, on the leader, promotes every learner whose log
// matches the leader's commit index (checked on every tick).
func (n *Node) maybePromoteLearners() {
	if n.leader.Load() != n.id {
		return
	}
	n.mu.RLock()
	hasLearners := len(n.confState.GetLearners()) > 0
	n.mu.RUnlock()
	if !hasLearners {
		return
	}
	st := n.raft.Status()
	if st.RaftState != raft.StateLeader {
		return
	}
	commit := st.HardState.GetCommit()
	for id, pr := range st.Progress {
		if !pr.IsLearner || pr.Match < commit {
			continue
		}
		n.mu.Lock()
		name, known := n.names[id]
		busy := n.promoting[id]
		n.mu.Unlock()
		if !known || busy {
			continue
		}
		if _, left := n.voterChangeLeft(); left > 0 {
			continue // voter changes are spaced; try again on a later tick
		}
		n.mu.Lock()
		n.promoting[id] = true
		n.mu.Unlock()
		n.logger.Info("raftnode: learner caught up, promoting", "member", name, "match", pr.Match, "commit", commit)
		go func() {
			defer func() {
				n.mu.Lock()
				delete(n.promoting, id)
				n.mu.Unlock()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 2*n.electionTimeout())
			defer cancel()
			if err := n.PromoteMember(ctx, name); err != nil {
				n.logger.Warn("raftnode: promoting learner failed", "member", name, "err", err)
			}
		}()
	}
}

// AddMember adds m as a learner (ConfChangeV2 AddLearnerNode) and returns
// once the change is applied on this member. The leader promotes the learner
// to voter by itself once the learner's log matches the leader's commit
// index.
func (n *Node) AddMember(ctx context.Context, m *waldenv1.MemberContext) error {
	switch {
	case m == nil || m.GetId() == "":
		return &MemberError{Op: "add member", Err: ErrInvalidMember, Why: "id is empty"}
	case m.GetRaftAddr() == "":
		return &MemberError{Op: "add member", ID: m.GetId(), Err: ErrInvalidMember, Why: "raft_addr is empty"}
	}
	id := RaftID(m.GetId())
	if voter, learner := n.role(id); voter || learner {
		return &MemberError{Op: "add member", ID: m.GetId(), Err: ErrMemberExists}
	}
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{
		Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(id),
	}}}
	member := proto.Clone(m).(*waldenv1.MemberContext)
	return n.proposeConfChange(ctx, "add member "+m.GetId(), cc, member, false)
}

// PromoteMember makes the learner id a voter. Promoting a voter does nothing.
func (n *Node) PromoteMember(ctx context.Context, id string) error {
	rid := RaftID(id)
	voter, learner := n.role(rid)
	switch {
	case voter:
		return nil
	case !learner:
		return &MemberError{Op: "promote member", ID: id, Err: ErrUnknownMember}
	}
	var member *waldenv1.MemberContext
	if m := n.member(rid); m != nil {
		member = &waldenv1.MemberContext{Id: m.GetId(), RaftAddr: m.GetRaftAddr(), AdminAddr: m.GetAdminAddr()}
	}
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{
		Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(rid),
	}}}
	return n.proposeConfChange(ctx, "promote member "+id, cc, member, true)
}

// RemoveMember removes the voter or learner id. A member that applies its
// own removal stops (Done is closed).
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	rid := RaftID(id)
	voter, learner := n.role(rid)
	if !voter && !learner {
		return &MemberError{Op: "remove member", ID: id, Err: ErrUnknownMember}
	}
	if voter {
		n.mu.RLock()
		voters := len(n.confState.GetVoters())
		n.mu.RUnlock()
		if voters <= 1 {
			return &MemberError{Op: "remove member", ID: id, Err: ErrLastVoter}
		}
	}
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{
		Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(rid),
	}}}
	return n.proposeConfChange(ctx, "remove member "+id, cc, nil, voter)
}

// VoterChangeIn returns how long a voter change must still wait on this
// member (0: it may be made now) and the spacing (Config.VoterChangeWait;
// 0 when voter changes are not spaced).
func (n *Node) VoterChangeIn() (left, wait time.Duration) {
	wait, left = n.voterChangeLeft()
	return left, wait
}

// voterChangeLeft returns the spacing of voter changes and what remains of
// it since this member applied the last one (or started).
func (n *Node) voterChangeLeft() (wait, left time.Duration) {
	if n.cfg.VoterChangeWait == nil {
		return 0, 0
	}
	wait = n.cfg.VoterChangeWait()
	n.mu.RLock()
	since := time.Since(n.voterChangedAt)
	n.mu.RUnlock()
	return wait, max(wait-since, 0)
}

// sameVoters reports whether a and b have the same voters (incoming and
// outgoing).
func sameVoters(a, b *raftpb.ConfState) bool {
	set := func(cs *raftpb.ConfState) []uint64 {
		ids := slices.Concat(cs.GetVoters(), cs.GetVotersOutgoing())
		slices.Sort(ids)
		return slices.Compact(ids)
	}
	return slices.Equal(set(a), set(b))
}

// hasConfChange reports whether the proposal m carries a membership change.
func hasConfChange(m *raftpb.Message) bool {
	for _, e := range m.GetEntries() {
		if t := e.GetType(); t == raftpb.EntryConfChange || t == raftpb.EntryConfChangeV2 {
			return true
		}
	}
	return false
}

// proposeConfChange proposes cc with a ConfChangeContext carrying a request
// id and member, and waits until it is applied on this member. Raft ignores a
// change proposed while another is pending; the caller's ctx bounds the wait.
//
// With Config.VoterChangeWait set, a change is made on the leader only
// (ErrNotLeader elsewhere), and a voter change (voterChange) only once the
// spacing has passed since the previous one (a *VoterChangeTooSoonError).
func (n *Node) proposeConfChange(ctx context.Context, op string, cc *raftpb.ConfChangeV2, member *waldenv1.MemberContext, voterChange bool) error {
	n.confMu.Lock()
	defer n.confMu.Unlock()
	if n.stopped() {
		return ErrStopped
	}
	if n.leader.Load() == raft.None {
		return ErrNoLeader
	}
	if n.cfg.VoterChangeWait != nil {
		if n.leader.Load() != n.id {
			return ErrNotLeader
		}
		if wait, left := n.voterChangeLeft(); voterChange && left > 0 {
			return &VoterChangeTooSoonError{Op: op, Wait: wait, Left: left}
		}
	}
	reqID := n.reqIDs.Next()
	data, err := proto.Marshal(&waldenv1.ConfChangeContext{RequestId: reqID, Member: member})
	if err != nil {
		return fmt.Errorf("raftnode: %s: marshal context: %w", op, err)
	}
	cc.Context = data
	ch := n.wait.Register(reqID)
	if ch == nil {
		return fmt.Errorf("raftnode: %s: request id %x already pending", op, reqID)
	}
	defer n.wait.Cancel(reqID)
	if n.forwardProposals.Load() {
		entry, err := proto.Marshal(cc)
		if err != nil {
			return fmt.Errorf("raftnode: %s: marshal change: %w", op, err)
		}
		n.forwardProposal(raftpb.EntryConfChangeV2, entry)
	} else if err := n.raft.ProposeConfChange(ctx, cc); err != nil {
		return n.raftError(op, err)
	}
	select {
	case a := <-ch:
		if a.err != nil && !errors.Is(a.err, ErrStopped) {
			return fmt.Errorf("raftnode: %s: %w", op, a.err)
		}
		return a.err
	case <-ctx.Done():
		return fmt.Errorf("raftnode: %s: %w", op, ctx.Err())
	case <-n.donec:
		return ErrStopped
	}
}

// TransferLeadership hands leadership to the voter id. It must be called on
// the leader (else ErrNotLeader) and waits until id leads or ctx is done.
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	if n.stopped() {
		return ErrStopped
	}
	if n.leader.Load() != n.id {
		return ErrNotLeader
	}
	rid := RaftID(id)
	voter, learner := n.role(rid)
	switch {
	case learner:
		return &MemberError{Op: "transfer leadership to", ID: id, Err: ErrNotVoter}
	case !voter:
		return &MemberError{Op: "transfer leadership to", ID: id, Err: ErrUnknownMember}
	case rid == n.id:
		return nil
	}
	n.transferring.Add(1)
	defer n.transferring.Add(-1)
	n.logger.Info("raftnode: transferring leadership", "to", id, "term", n.term.Load())
	n.raft.TransferLeadership(ctx, n.id, rid)
	poll := time.NewTicker(n.cfg.TickInterval)
	defer poll.Stop()
	retry := time.NewTicker(n.electionTimeout())
	defer retry.Stop()
	for {
		select {
		case <-poll.C:
			if n.leader.Load() == rid {
				return nil
			}
		case <-retry.C:
			// raft abandons a transfer that did not finish within an
			// election timeout; ask again while still leading.
			if n.leader.Load() == n.id {
				n.raft.TransferLeadership(ctx, n.id, rid)
			}
		case <-ctx.Done():
			return fmt.Errorf("raftnode: transfer leadership to %q: %w", id, ctx.Err())
		case <-n.donec:
			return ErrStopped
		}
	}
}

// Member returns this member's view of member id with its addresses, or nil.
func (n *Node) member(id uint64) *waldenv1.Member {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.members[id]
}

// inConfig reports whether this member is a voter or a learner of the
// applied configuration.
func (n *Node) inConfig() bool {
	voter, learner := n.role(n.id)
	return voter || learner
}

// confStateHas reports whether raft id is a voter or a learner of cs.
func confStateHas(cs *raftpb.ConfState, id uint64) bool {
	for _, ids := range [][]uint64{cs.GetVoters(), cs.GetVotersOutgoing(), cs.GetLearners(), cs.GetLearnersNext()} {
		if slices.Contains(ids, id) {
			return true
		}
	}
	return false
}

// role reports whether raft id is a voter or a learner in the applied
// configuration.
func (n *Node) role(id uint64) (voter, learner bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	cs := n.confState
	voter = slices.Contains(cs.GetVoters(), id) || slices.Contains(cs.GetVotersOutgoing(), id)
	learner = slices.Contains(cs.GetLearners(), id) || slices.Contains(cs.GetLearnersNext(), id)
	return voter, learner
}
