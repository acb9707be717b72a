package coordclient

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"google.golang.org/grpc/metadata"

	"walden/refusal"
	"walden/rpcerr"
)

// The leader hint of an Unavailable "not leader" answer.
const (
	// TrailerLeaderID and TrailerLeaderAddr are the trailers that carry the
	// leader's member id and admin address.
	TrailerLeaderID   = "walden-leader-id"
	TrailerLeaderAddr = "walden-leader-addr"
)

// NotLeader is the Unavailable answer naming the leader: it sets the hint
// trailers on ctx (a server handler's context) and returns the status error
// with the hint in an ErrorInfo detail (reason NOT_LEADER, metadata
// leader_id and leader_addr).
func NotLeader(ctx context.Context, leaderID, addr string) error {
	SetLeaderTrailer(ctx, leaderID, addr)
	return rpcerr.NewPlain(refusal.NotLeader, fmt.Sprintf("not leader; leader=%s addr=%s", leaderID, addr),
		map[string]string{"leader_id": leaderID, "leader_addr": addr})
}

// SetLeaderTrailer sets the hint trailers on a server handler's context.
func SetLeaderTrailer(ctx context.Context, leaderID, addr string) {
	_ = grpc.SetTrailer(ctx, metadata.Pairs(TrailerLeaderID, leaderID, TrailerLeaderAddr, addr))
}

// LeaderHint returns the leader id and admin address of the first
// not-leader detail of s, or empty strings.
func LeaderHint(s *status.Status) (id, addr string) {
	if info := rpcerr.InfoOf(s); info.GetReason() == string(refusal.NotLeader) {
		return info.GetMetadata()["leader_id"], info.GetMetadata()["leader_addr"]
	}
	return "", ""
}

// LeaderAddr reads the leader's admin address from a not-leader answer:
// from a not-leader detail of err that names one, else from the trailer
// (nil when the caller did not ask for it). "" when there is no hint.
func LeaderAddr(err error, trailer metadata.MD) string {
	if rpcerr.Reason(err) == refusal.NotLeader {
		if a := rpcerr.Metadata(err)["leader_addr"]; a != "" {
			return a
		}
	}
	if v := trailer.Get(TrailerLeaderAddr); len(v) > 0 {
		return v[0]
	}
	return ""
}
