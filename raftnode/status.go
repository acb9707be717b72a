package raftnode

import (
	"fmt"
	"slices"
	"sort"

	"go.etcd.io/raft/v3"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// Status is a member's view of the cluster.
type Status struct {
	ClusterName  string
	NodeID       string
	LeaderID     string // empty while no leader is known
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	// RaftState is "leader", "follower", "candidate", "pre-candidate" or
	// "learner".
	RaftState string
	// Members is the current configuration, sorted by id, with member_role
	// (leader, follower or learner), reachable (as seen by this member),
	// version (as each announced itself to this member's transport), and
	// match_index and commits (only when this member leads).
	Members []*waldenv1.Member
}

// VersionReporter is implemented by a Transport that learns the walden
// version each peer runs (GRPCTransport: from the header of the peer's
// stream).
type VersionReporter interface {
	// PeerVersion is the version member id announced, "" when unknown.
	PeerVersion(id string) string
}

// recordCommitTick remembers the commit index at this tick while this
// member leads (run goroutine).
func (n *Node) recordCommitTick() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.leader.Load() != n.id {
		n.commitTicks = n.commitTicks[:0]
		return
	}
	n.commitTicks = append(n.commitTicks, n.commit.Load())
	if over := len(n.commitTicks) - (n.cfg.ElectionTicks + 1); over > 0 {
		n.commitTicks = append(n.commitTicks[:0], n.commitTicks[over:]...)
	}
}

// committedLongAgo is the commit index one election timeout ago (or at the
// oldest tick this leadership recorded). Call with mu held.
func (n *Node) committedLongAgo() uint64 {
	if len(n.commitTicks) == 0 {
		return 0
	}
	return n.commitTicks[0]
}

// Status reports this member's view of the cluster.
func (n *Node) Status() Status {
	rs := n.raft.Status()
	s := Status{
		ClusterName:  n.cfg.ClusterName,
		NodeID:       n.cfg.NodeID,
		Term:         rs.HardState.GetTerm(),
		CommitIndex:  rs.HardState.GetCommit(),
		AppliedIndex: n.applied.Load(),
	}
	if n.stopped() {
		s.Term, s.CommitIndex = n.term.Load(), n.commit.Load()
		rs.Lead = raft.None
	}
	if rs.Lead != raft.None {
		s.LeaderID = n.nameOf(rs.Lead)
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	selfLearner := slices.Contains(n.confState.GetLearners(), n.id)
	s.RaftState = raftStateName(rs.RaftState, selfLearner)
	for id, m := range n.members {
		mm := proto.Clone(m).(*waldenv1.Member)
		mm.RaftId = id
		switch {
		case slices.Contains(n.confState.GetLearners(), id):
			mm.MemberRole = waldenv1.MemberRole_MEMBER_ROLE_LEARNER
		case id == rs.Lead:
			mm.MemberRole = waldenv1.MemberRole_MEMBER_ROLE_LEADER
		default:
			mm.MemberRole = waldenv1.MemberRole_MEMBER_ROLE_FOLLOWER
		}
		mm.Reachable = id == n.id || n.tr.Reachable(id)
		if id == n.id {
			mm.Version = n.cfg.Version
		} else if vr, ok := n.tr.(VersionReporter); ok {
			mm.Version = vr.PeerVersion(m.GetId())
		}
		if pr, ok := rs.Progress[id]; ok {
			mm.MatchIndex = pr.Match
			// A voter commits when the leader hears from it and it has
			// acknowledged what was committed an election timeout ago;
			// the leader itself always does while it leads.
			mm.Commits = mm.MemberRole != waldenv1.MemberRole_MEMBER_ROLE_LEARNER &&
				(id == n.id || (pr.RecentActive && pr.Match >= n.committedLongAgo()))
		}
		s.Members = append(s.Members, mm)
	}
	sort.Slice(s.Members, func(i, j int) bool { return s.Members[i].GetId() < s.Members[j].GetId() })
	return s
}

func raftStateName(st raft.StateType, learner bool) string {
	switch st {
	case raft.StateLeader:
		return "leader"
	case raft.StateCandidate:
		return "candidate"
	case raft.StatePreCandidate:
		return "pre-candidate"
	default:
		if learner {
			return "learner"
		}
		return "follower"
	}
}

// LeaderID is the member id of the leader this member knows, or "".
func (n *Node) LeaderID() string {
	lead := n.leader.Load()
	if lead == raft.None {
		return ""
	}
	return n.nameOf(lead)
}

// Stopped reports whether the member has stopped: Done is closed (after
// Stop, its own removal or a fatal storage fault; Err says which fault).
func (n *Node) Stopped() bool {
	select {
	case <-n.donec:
		return true
	default:
		return false
	}
}

// IsLeader reports whether this member is the leader.
func (n *Node) IsLeader() bool { return n.leader.Load() == n.id }

// Leadership reports whether this member leads, and the term it knows.
func (n *Node) Leadership() (leader bool, term uint64) {
	st := n.Status()
	return st.RaftState == "leader" && st.LeaderID == st.NodeID, st.Term
}

// Voters are the voting members' ids.
func (n *Node) Voters() []string {
	var out []string
	for _, m := range n.Status().Members {
		if m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER {
			out = append(out, m.GetId())
		}
	}
	return out
}

// LiveMembers are the voters this member sees active (on the leader, from
// raft's progress), itself included.
func (n *Node) LiveMembers() []string {
	st := n.Status()
	var out []string
	for _, m := range st.Members {
		if m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER && (m.GetReachable() || m.GetId() == st.NodeID) {
			out = append(out, m.GetId())
		}
	}
	return out
}

// Ready reports whether the member knows a leader and has applied every
// entry up to the commit index it found in its storage at start (the
// bootstrap entries for a new member) — the /readyz condition.
func (n *Node) Ready() bool {
	return !n.stopped() && n.leader.Load() != raft.None && n.applied.Load() >= n.readyCommit
}

func (n *Node) nameOf(id uint64) string {
	if id == raft.None {
		return ""
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if name, ok := n.names[id]; ok {
		return name
	}
	return fmt.Sprintf("%x", id)
}
