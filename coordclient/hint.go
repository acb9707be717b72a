package coordclient

import (
	"context"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The leader hint of an Unavailable "not leader" answer.
const (
	// TrailerLeaderID and TrailerLeaderAddr are the trailers that carry the
	// leader's member id and admin address.
	TrailerLeaderID   = "walden-leader-id"
	TrailerLeaderAddr = "walden-leader-addr"
	// ReasonNotLeader is the errdetails.ErrorInfo reason of a not-leader
	// answer; its metadata holds leader_id and leader_addr.
	ReasonNotLeader = "NOT_LEADER"
)

// NotLeader is the Unavailable answer naming the leader: it sets the hint
// trailers on ctx (a server handler's context) and returns the status error
// with the hint in an ErrorInfo detail of the given domain.
func NotLeader(ctx context.Context, domain, leaderID, addr string) error {
	SetLeaderTrailer(ctx, leaderID, addr)
	s := status.New(codes.Unavailable, fmt.Sprintf("not leader; leader=%s addr=%s", leaderID, addr))
	if d, err := s.WithDetails(&errdetails.ErrorInfo{
		Reason:   ReasonNotLeader,
		Domain:   domain,
		Metadata: map[string]string{"leader_id": leaderID, "leader_addr": addr},
	}); err == nil {
		s = d
	}
	return s.Err()
}

// SetLeaderTrailer sets the hint trailers on a server handler's context.
func SetLeaderTrailer(ctx context.Context, leaderID, addr string) {
	_ = grpc.SetTrailer(ctx, metadata.Pairs(TrailerLeaderID, leaderID, TrailerLeaderAddr, addr))
}

// LeaderHint returns the leader id and admin address of the first
// not-leader detail of s, or empty strings.
func LeaderHint(s *status.Status) (id, addr string) {
	for _, d := range s.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == ReasonNotLeader {
			return info.GetMetadata()["leader_id"], info.GetMetadata()["leader_addr"]
		}
	}
	return "", ""
}

// LeaderAddr reads the leader's admin address from a not-leader answer:
// from a not-leader detail of err that names one, else from the trailer
// (nil when the caller did not ask for it). "" when there is no hint.
func LeaderAddr(err error, trailer metadata.MD) string {
	if s, ok := status.FromError(err); ok {
		for _, d := range s.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == ReasonNotLeader {
				if a := info.GetMetadata()["leader_addr"]; a != "" {
					return a
				}
			}
		}
	}
	if v := trailer.Get(TrailerLeaderAddr); len(v) > 0 {
		return v[0]
	}
	return ""
}
