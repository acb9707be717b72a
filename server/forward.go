package server

import (
	"context"
	"fmt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"walden/coordclient"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
	"walden/refusal"
	"walden/rpcerr"
)

// forwardLeaderTransfer sends req to the leader's admin address. A request
// that was already forwarded, or a leader that cannot be reached, gets the
// leader hint instead.
func (a *adminService) forwardLeaderTransfer(ctx context.Context, req *waldenv1.LeaderTransferRequest, st raftnode.Status) (*waldenv1.LeaderTransferResponse, error) {
	return forwardAdmin(a, ctx, st, func(ctx context.Context, c waldenv1.ClusterClient) (*waldenv1.LeaderTransferResponse, error) {
		return c.LeaderTransfer(ctx, req)
	})
}

// forwardAdmin makes call on the leader's admin address. A request that
// was already forwarded, or a leader that cannot be reached, gets the
// leader hint instead.
func forwardAdmin[T any](a *adminService, ctx context.Context, st raftnode.Status, call func(context.Context, waldenv1.ClusterClient) (T, error)) (T, error) {
	var none T
	addr := adminAddrOf(st, st.LeaderID)
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(headerForwardedBy)) > 0 || addr == "" {
		return none, a.notLeader(ctx, st.LeaderID, addr)
	}
	client, err := a.leaderClient(addr)
	if err != nil {
		return none, a.notLeader(ctx, st.LeaderID, addr)
	}
	fctx := metadata.AppendToOutgoingContext(ctx, headerForwardedBy, a.nodeID)
	resp, err := call(fctx, client)
	if err != nil {
		s, _ := status.FromError(err)
		if s.Code() == codes.Unavailable && !hasLeaderHint(s) {
			// The leader could not be reached: give the caller the hint.
			a.logger.DebugContext(ctx, "forward to leader failed", "leader_id", st.LeaderID, "leader_addr", addr, "term", st.Term, "err", err)
			return none, a.notLeader(ctx, st.LeaderID, addr)
		}
		if s.Code() == codes.Unavailable {
			copyLeaderHint(ctx, s)
		}
		return none, err
	}
	return resp, nil
}

func (a *adminService) leaderClient(addr string) (waldenv1.ClusterClient, error) {
	c, err := a.conns.Get(addr)
	if err != nil {
		return nil, fmt.Errorf("server: dial leader %s: %w", addr, err)
	}
	return waldenv1.NewClusterClient(c), nil
}

func adminAddrOf(st raftnode.Status, id string) string {
	for _, m := range st.Members {
		if m.GetId() == id {
			return m.GetAdminAddr()
		}
	}
	return ""
}

// notLeader is the Unavailable answer naming the leader, with the hint in a
// status detail and in trailers.
func (a *adminService) notLeader(ctx context.Context, leaderID, addr string) error {
	return coordclient.NotLeader(ctx, leaderID, addr)
}

func hasLeaderHint(s *status.Status) bool {
	_, addr := LeaderHint(s)
	return addr != ""
}

// copyLeaderHint passes a hint received from a forwarded call on to our caller.
func copyLeaderHint(ctx context.Context, s *status.Status) {
	if id, addr := LeaderHint(s); addr != "" {
		coordclient.SetLeaderTrailer(ctx, id, addr)
	}
}

// LeaderHint returns the leader id and admin address carried by a
// not-leader status, or empty strings.
func LeaderHint(s *status.Status) (id, addr string) {
	return coordclient.LeaderHint(s)
}

// forwarded reports whether the incoming call was forwarded by a member.
func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(headerForwardedBy)) > 0
}

// leaderConn returns a connection to the leader's admin address, or the
// not-leader answer when the call was already forwarded or the leader is
// unknown.
func (d *serviceDeps) leaderConn(ctx context.Context, st raftnode.Status) (*grpc.ClientConn, context.Context, error) {
	if st.LeaderID == "" {
		return nil, nil, rpcerr.NewPlain(refusal.NoLeader, "no leader", nil)
	}
	addr := adminAddrOf(st, st.LeaderID)
	if forwarded(ctx) || addr == "" {
		return nil, nil, d.admin.notLeader(ctx, st.LeaderID, addr)
	}
	conn, err := d.admin.conn(addr)
	if err != nil {
		return nil, nil, d.admin.notLeader(ctx, st.LeaderID, addr)
	}
	return conn, metadata.AppendToOutgoingContext(ctx, headerForwardedBy, d.nodeID), nil
}

// forwardErr turns the error of a forwarded call into our answer: a leader
// that could not be reached becomes the not-leader hint.
func (d *serviceDeps) forwardErr(ctx context.Context, st raftnode.Status, err error) error {
	s, _ := status.FromError(err)
	if s.Code() == codes.Unavailable && !hasLeaderHint(s) {
		d.logger.DebugContext(ctx, "forward to leader failed", "leader_id", st.LeaderID, "term", st.Term, "err", err)
		return d.admin.notLeader(ctx, st.LeaderID, adminAddrOf(st, st.LeaderID))
	}
	if s.Code() == codes.Unavailable {
		copyLeaderHint(ctx, s)
	}
	return err
}

// forwardToLeader calls the leader with call, or answers not-leader.
func forwardToLeader[T any](ctx context.Context, d *serviceDeps, st raftnode.Status, call func(ctx context.Context, conn *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	conn, fctx, err := d.leaderConn(ctx, st)
	if err != nil {
		return zero, err
	}
	resp, err := call(fctx, conn)
	if err != nil {
		return zero, d.forwardErr(ctx, st, err)
	}
	return resp, nil
}

// conn returns a cached client connection to a member's admin address.
func (a *adminService) conn(addr string) (*grpc.ClientConn, error) {
	c, err := a.conns.Get(addr)
	if err != nil {
		return nil, fmt.Errorf("server: dial %s: %w", addr, err)
	}
	return c, nil
}

// forwardRead sends a linearizable read received by a follower to the
// leader; done is false when this member must answer itself (it leads, the
// read is serializable or already forwarded, or the leader cannot be
// reached — then the caller's ReadIndex round decides).
func forwardRead[T any](ctx context.Context, d *serviceDeps, call func(ctx context.Context, conn *grpc.ClientConn) (T, error)) (T, error, bool) {
	var zero T
	lin, err := linearizable(ctx)
	if err != nil {
		return zero, err, true
	}
	leader, st := d.isLeader()
	if !lin || leader || forwarded(ctx) || st.LeaderID == "" {
		return zero, nil, false
	}
	resp, err := forwardToLeader(ctx, d, st, call)
	if err == nil || status.Code(err) == codes.NotFound || status.Code(err) == codes.InvalidArgument {
		return resp, err, true
	}
	d.logger.DebugContext(ctx, "read: leader not reachable, answering here after a ReadIndex round", "err", err)
	return zero, nil, false
}
