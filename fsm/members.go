package fsm

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// ErrDuplicateMember is returned by ApplyConfChange when an added member's
// id is already used by a member with another raft id.
var ErrDuplicateMember = errors.New("fsm: member id already in use")

// ApplyConfChange records a membership change that raft has applied at
// index. Raft ids come from the changes' NodeIDs; the name and addresses of
// an added member from ctx.member:
//   - AddNode of an unknown id adds a voter, of a learner promotes it, of a
//     voter only refreshes its addresses;
//   - AddLearnerNode of an unknown id adds a learner, of a voter demotes it;
//   - RemoveNode removes the member; UpdateNode refreshes its addresses.
//
// Every change is applied even when another fails (raft applied them all);
// the errors are returned joined. cs is raft's resulting configuration; the
// member list follows the changes themselves.
func (s *State) ApplyConfChange(index uint64, cc *raftpb.ConfChangeV2, ctx *waldenv1.ConfChangeContext, _ *raftpb.ConfState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.advance(index); err != nil {
		return err
	}
	defer s.notifyLocked()
	s.brokersView.invalidate() // a member's observations may go with it
	s.confIndex = index
	mc := ctx.GetMember()
	ctxUsed := false
	var errs []error
	for _, ch := range cc.GetChanges() {
		id := ch.GetNodeId()
		var err error
		switch ch.GetType() {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			role := waldenv1.MemberRole_MEMBER_ROLE_VOTER
			if ch.GetType() == raftpb.ConfChangeAddLearnerNode {
				role = waldenv1.MemberRole_MEMBER_ROLE_LEARNER
			}
			if m, ok := s.members[id]; ok {
				m.MemberRole = role
				refreshAddrs(m, mc)
				break
			}
			if mc.GetId() == "" || ctxUsed {
				err = fmt.Errorf("fsm: conf change at index %d adds raft id %d: %w", index, id, ErrNoMemberContext)
				break
			}
			ctxUsed = true
			err = s.addMember(index, id, mc, role)
		case raftpb.ConfChangeRemoveNode:
			if _, ok := s.members[id]; !ok {
				err = fmt.Errorf("fsm: conf change at index %d removes raft id %d: %w", index, id, ErrUnknownMember)
				break
			}
			s.dropObservationsOf(s.members[id].GetId())
			delete(s.members, id)
		case raftpb.ConfChangeUpdateNode:
			m, ok := s.members[id]
			if !ok {
				err = fmt.Errorf("fsm: conf change at index %d updates raft id %d: %w", index, id, ErrUnknownMember)
				break
			}
			refreshAddrs(m, mc)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// addMember adds the member described by mc under raft id id.
func (s *State) addMember(index, id uint64, mc *waldenv1.MemberContext, role waldenv1.MemberRole) error {
	for rid, m := range s.members {
		if m.GetId() == mc.GetId() {
			return fmt.Errorf("fsm: conf change at index %d adds %q as raft id %d, it is raft id %d: %w",
				index, mc.GetId(), id, rid, ErrDuplicateMember)
		}
	}
	s.members[id] = &waldenv1.Member{
		Id:         mc.GetId(),
		RaftId:     id,
		RaftAddr:   mc.GetRaftAddr(),
		AdminAddr:  mc.GetAdminAddr(),
		MemberRole: role,
		// A member removed and added again is a new incarnation: the
		// index of the change that added it tells them apart.
		Incarnation: index,
	}
	return nil
}

// refreshAddrs copies the addresses of mc into m when mc names m.
func refreshAddrs(m *waldenv1.Member, mc *waldenv1.MemberContext) {
	if mc.GetId() != m.GetId() {
		return
	}
	if a := mc.GetRaftAddr(); a != "" {
		m.RaftAddr = a
	}
	if a := mc.GetAdminAddr(); a != "" {
		m.AdminAddr = a
	}
}

// Members returns copies of the members sorted by id, with their role:
// voter or learner.
func (s *State) Members() []*waldenv1.Member {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sortedMembers()
}

// ConfIndex returns the index of the last membership change applied: a
// newer configuration has a higher index.
func (s *State) ConfIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.confIndex
}

// Voters returns the ids of the voting members, sorted.
func (s *State) Voters() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.votersLocked()
}

func (s *State) votersLocked() []string {
	var out []string
	for _, m := range s.sortedMembers() {
		if m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER {
			out = append(out, m.GetId())
		}
	}
	return out
}

// dropObservationsOf removes a removed member's observations: its
// attestations and suspicions must not count for a decision after it left
// (if it joins again it starts afresh, with the restart rule of the lease).
func (s *State) dropObservationsOf(member string) {
	for _, id := range sortedKeys(s.brokers) {
		b := s.brokers[id]
		n := len(b.Observations)
		b.Observations = slices.DeleteFunc(b.Observations, func(o *waldenv1.Observation) bool { return o.GetObserverId() == member })
		if len(b.Observations) != n {
			s.deriveState(b)
		}
	}
}

// isMember reports whether id names a current member.
func (s *State) isMember(id string) bool {
	for _, m := range s.members {
		if m.GetId() == id {
			return true
		}
	}
	return false
}

func (s *State) sortedMembers() []*waldenv1.Member {
	out := make([]*waldenv1.Member, 0, len(s.members))
	for _, m := range s.members {
		out = append(out, proto.Clone(m).(*waldenv1.Member))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetId() < out[j].GetId() })
	return out
}
