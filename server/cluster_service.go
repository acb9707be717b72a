package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"walden/authz"
	"walden/config"
	"walden/coordclient"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// Metadata keys of the admin API.
const (
	// TrailerLeaderID and TrailerLeaderAddr carry the leader hint of an
	// Unavailable "not leader" answer: the leader's member id and admin
	// address. The same values are in an errdetails.ErrorInfo detail
	// (reason NOT_LEADER, metadata leader_id and leader_addr).
	TrailerLeaderID   = coordclient.TrailerLeaderID
	TrailerLeaderAddr = coordclient.TrailerLeaderAddr
	// headerForwardedBy marks a request one member forwarded to the leader,
	// so that the receiver answers with a hint instead of forwarding again.
	headerForwardedBy = "walden-forwarded-by"
)

// adminService implements walden.v1.Cluster over a ClusterNode.
type adminService struct {
	waldenv1.UnimplementedClusterServer

	node   ClusterNode
	nodeID string
	logger *slog.Logger
	// conns are the connections to the leader when forwarding, by admin
	// address, secured with the cluster's client credentials.
	conns *coordclient.Conns
	// restore reads the reconciliation of a restored cluster (nil: none).
	restore func() *waldenv1.RestoreState
}

func newAdminService(node ClusterNode, nodeID string, creds credentials.TransportCredentials, logger *slog.Logger) *adminService {
	return &adminService{node: node, nodeID: nodeID, logger: logger, conns: coordclient.NewConns(
		grpc.WithTransportCredentials(creds),
		// The leader authorizes the original caller, not this member.
		grpc.WithChainUnaryInterceptor(authz.ForwardUnary()),
		grpc.WithChainStreamInterceptor(authz.ForwardStream()),
	)}
}

// close drops the forwarding connections.
func (a *adminService) close() {
	a.conns.Close()
}

func (a *adminService) Status(ctx context.Context, _ *waldenv1.StatusRequest) (*waldenv1.StatusResponse, error) {
	st := a.node.Status()
	by := a.leaderProgress(ctx, st)
	return &waldenv1.StatusResponse{
		ClusterName:  st.ClusterName,
		NodeId:       st.NodeID,
		LeaderId:     st.LeaderID,
		Term:         st.Term,
		CommitIndex:  st.CommitIndex,
		AppliedIndex: st.AppliedIndex,
		Members:      st.Members,
		RaftState:    st.RaftState,
		ProgressBy:   by,
		Restore:      a.restoreState(),
	}, nil
}

// restoreState is the reconciliation of a restored cluster as this member
// applied it, nil when it was not restored.
func (a *adminService) restoreState() *waldenv1.RestoreState {
	if a.restore == nil {
		return nil
	}
	return a.restore()
}

func (a *adminService) MemberList(ctx context.Context, req *waldenv1.MemberListRequest) (*waldenv1.MemberListResponse, error) {
	if req.GetLinearizable() {
		if err := a.node.LinearizableRead(ctx); err != nil {
			return nil, a.toStatus(ctx, err)
		}
	}
	st := a.node.Status()
	by := a.leaderProgress(ctx, st)
	return &waldenv1.MemberListResponse{Members: st.Members, ProgressBy: by}, nil
}

// leaderProgressTimeout bounds a follower's question to the leader about
// the members' replication progress.
const leaderProgressTimeout = time.Second

// leaderProgress fills st's members with the leader's view of their
// replication (match index, whether they commit) and the versions the
// leader knows and this member does not, and returns the leader's id; ""
// when no leader answered (then the match indexes are 0: only the leader
// tracks them). Only the leader knows every member's progress: a follower
// hears from the leader alone.
func (a *adminService) leaderProgress(ctx context.Context, st raftnode.Status) string {
	if st.LeaderID == "" {
		return ""
	}
	if st.LeaderID == st.NodeID {
		return st.NodeID
	}
	addr := adminAddrOf(st, st.LeaderID)
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(headerForwardedBy)) > 0 || addr == "" {
		return ""
	}
	client, err := a.leaderClient(addr)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, headerForwardedBy, a.nodeID), leaderProgressTimeout)
	defer cancel()
	ls, err := client.Status(ctx, &waldenv1.StatusRequest{})
	if err != nil || ls.GetNodeId() != st.LeaderID || ls.GetProgressBy() != st.LeaderID {
		a.logger.DebugContext(ctx, "the leader's view of the members' progress is not available", "leader_id", st.LeaderID, "err", err)
		return ""
	}
	byID := map[string]*waldenv1.Member{}
	for _, m := range ls.GetMembers() {
		byID[m.GetId()] = m
	}
	for _, m := range st.Members {
		if lm, ok := byID[m.GetId()]; ok {
			m.MatchIndex, m.Commits = lm.GetMatchIndex(), lm.GetCommits()
			if m.GetVersion() == "" {
				m.Version = lm.GetVersion()
			}
		}
	}
	return st.LeaderID
}

func (a *adminService) MemberAdd(ctx context.Context, req *waldenv1.MemberAddRequest) (*waldenv1.MemberAddResponse, error) {
	if err := checkMemberID("id", req.GetId()); err != nil {
		return nil, err
	}
	if err := checkAddr("raft_addr", req.GetRaftAddr()); err != nil {
		return nil, err
	}
	if err := checkAddr("admin_addr", req.GetAdminAddr()); err != nil {
		return nil, err
	}
	if req.GetRaftAddr() == req.GetAdminAddr() {
		return nil, invalidArg("admin_addr", fmt.Sprintf("%s is also raft_addr: a member listens on two addresses", req.GetAdminAddr()))
	}
	if err := checkAddrsFree(a.node.Status().Members, req); err != nil {
		return nil, err
	}
	mc := &waldenv1.MemberContext{Id: req.GetId(), RaftAddr: req.GetRaftAddr(), AdminAddr: req.GetAdminAddr()}
	if st := a.node.Status(); st.LeaderID != "" && st.LeaderID != st.NodeID {
		// Membership changes are made on the leader (it spaces voter
		// changes): forward.
		return forwardAdmin(a, ctx, st, func(ctx context.Context, c waldenv1.ClusterClient) (*waldenv1.MemberAddResponse, error) {
			return c.MemberAdd(ctx, req)
		})
	}
	if err := a.node.AddMember(ctx, mc); err != nil {
		a.logger.WarnContext(ctx, "member add failed", "member_id", mc.Id, "raft_addr", mc.RaftAddr, "err", err)
		return nil, a.toStatus(ctx, err)
	}
	st := a.node.Status()
	a.logger.InfoContext(ctx, "member added as learner", "member_id", mc.Id, "raft_addr", mc.RaftAddr, "admin_addr", mc.AdminAddr, "term", st.Term)
	resp := &waldenv1.MemberAddResponse{Members: st.Members}
	for _, m := range st.Members {
		if m.GetId() == mc.Id {
			resp.Member = m
		}
	}
	if resp.Member == nil {
		resp.Member = &waldenv1.Member{Id: mc.Id, RaftId: raftnode.RaftID(mc.Id), RaftAddr: mc.RaftAddr, AdminAddr: mc.AdminAddr, MemberRole: waldenv1.MemberRole_MEMBER_ROLE_LEARNER}
	}
	return resp, nil
}

func (a *adminService) MemberRemove(ctx context.Context, req *waldenv1.MemberRemoveRequest) (*waldenv1.MemberRemoveResponse, error) {
	if req.GetId() == "" {
		return nil, invalidArg("id", "must not be empty")
	}
	if st := a.node.Status(); st.LeaderID != "" && st.LeaderID != st.NodeID {
		return forwardAdmin(a, ctx, st, func(ctx context.Context, c waldenv1.ClusterClient) (*waldenv1.MemberRemoveResponse, error) {
			return c.MemberRemove(ctx, req)
		})
	}
	if err := a.node.RemoveMember(ctx, req.GetId()); err != nil {
		a.logger.WarnContext(ctx, "member remove failed", "member_id", req.GetId(), "err", err)
		return nil, a.toStatus(ctx, err)
	}
	st := a.node.Status()
	a.logger.InfoContext(ctx, "member removed", "member_id", req.GetId(), "term", st.Term)
	return &waldenv1.MemberRemoveResponse{Members: st.Members}, nil
}

func (a *adminService) LeaderTransfer(ctx context.Context, req *waldenv1.LeaderTransferRequest) (*waldenv1.LeaderTransferResponse, error) {
	if req.GetId() == "" {
		return nil, invalidArg("id", "must not be empty")
	}
	st := a.node.Status()
	if st.LeaderID != "" && st.LeaderID != st.NodeID {
		return a.forwardLeaderTransfer(ctx, req, st)
	}
	if st.LeaderID == "" {
		return nil, a.toStatus(ctx, raftnode.ErrNoLeader)
	}
	if err := a.node.TransferLeadership(ctx, req.GetId()); err != nil {
		a.logger.WarnContext(ctx, "leader transfer failed", "target_id", req.GetId(), "term", st.Term, "err", err)
		return nil, a.toStatus(ctx, err)
	}
	after := a.node.Status()
	a.logger.InfoContext(ctx, "leadership transferred", "from_id", st.NodeID, "target_id", req.GetId(), "leader_id", after.LeaderID, "term", after.Term)
	return &waldenv1.LeaderTransferResponse{LeaderId: after.LeaderID, Term: after.Term}, nil
}

// checkAddrsFree refuses a new member whose raft or admin address another
// member already uses: raft would send one member's messages to the other.
func checkAddrsFree(members []*waldenv1.Member, req *waldenv1.MemberAddRequest) error {
	for _, m := range members {
		if m.GetId() == req.GetId() {
			continue // the same member again: AddMember answers AlreadyExists
		}
		for _, f := range []struct{ field, addr string }{{"raft_addr", req.GetRaftAddr()}, {"admin_addr", req.GetAdminAddr()}} {
			switch f.addr {
			case m.GetRaftAddr():
				return invalidArg(f.field, fmt.Sprintf("%s is already the raft address of member %q", f.addr, m.GetId()))
			case m.GetAdminAddr():
				return invalidArg(f.field, fmt.Sprintf("%s is already the admin address of member %q", f.addr, m.GetId()))
			}
		}
	}
	return nil
}

func checkMemberID(field, id string) error {
	if id == "" {
		return invalidArg(field, "must not be empty")
	}
	if err := config.CheckName(id); err != nil {
		return invalidArg(field, err.Error())
	}
	return nil
}

func checkAddr(field, addr string) error {
	if addr == "" {
		return invalidArg(field, "must not be empty")
	}
	if err := config.CheckHostPort(addr, true); err != nil {
		return invalidArg(field, fmt.Sprintf("invalid address %q: %v", addr, err))
	}
	return nil
}
