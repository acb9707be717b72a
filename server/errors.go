package server

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/fieldlimit"
	"walden/policy"
	"walden/raftnode"
	"walden/refusal"
	"walden/rpcerr"
)

// stateErr maps an error of a proposal or a state check: a fencing refusal
// keeps its reason (FailedPrecondition / NotFound with ErrorInfo), anything
// else goes through the admin mapping.
func (d *serviceDeps) stateErr(ctx context.Context, err error) error {
	if refusal.Of(err) != "" {
		return rpcerr.Status(err).Err()
	}
	return d.admin.toStatus(ctx, err)
}

// toStatus maps a node error to a gRPC status error.
func (a *adminService) toStatus(ctx context.Context, err error) error {
	if _, ok := status.FromError(err); ok && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return err
	}
	switch {
	case errors.Is(err, raftnode.ErrNotLeader):
		st := a.node.Status()
		if st.LeaderID == "" || st.LeaderID == st.NodeID {
			return rpcerr.NewPlain(refusal.NoLeader, "no leader", nil)
		}
		return a.notLeader(ctx, st.LeaderID, adminAddrOf(st, st.LeaderID))
	case errors.Is(err, raftnode.ErrNoLeader):
		return rpcerr.NewPlain(refusal.NoLeader, "no leader", nil)
	case errors.Is(err, raftnode.ErrStopped):
		return rpcerr.NewPlain(refusal.Stopping, "member is stopping", nil)
	case errors.Is(err, raftnode.ErrUnknownMember):
		return rpcerr.NewPlain(refusal.MemberNotFound, raftnode.Sentence(err), nil)
	case errors.Is(err, raftnode.ErrMemberExists):
		return rpcerr.NewPlain(refusal.MemberExists, raftnode.Sentence(err), nil)
	case errors.Is(err, raftnode.ErrInvalidMember):
		return invalidArg("id", raftnode.Sentence(err))
	case errors.Is(err, raftnode.ErrNotVoter):
		return rpcerr.NewPlain(refusal.NotVoter, raftnode.Sentence(err), nil)
	case errors.Is(err, raftnode.ErrVoterChangeTooSoon):
		var soon *raftnode.VoterChangeTooSoonError
		md := map[string]string{}
		if errors.As(err, &soon) {
			md["wait_ms"] = strconv.FormatInt(soon.Wait.Milliseconds(), 10)
			md["left_ms"] = strconv.FormatInt(soon.Left.Milliseconds(), 10)
		}
		return rpcerr.NewPlain(refusal.VoterChangeTooSoon, raftnode.Sentence(err), md)
	case errors.Is(err, raftnode.ErrLastVoter):
		return rpcerr.NewPlain(refusal.LastVoter, raftnode.Sentence(err), nil)
	case errors.Is(err, raftnode.ErrProposalDropped):
		return rpcerr.NewPlain(refusal.ProposalDropped, raftnode.Sentence(err), nil)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func invalidArg(field, reason string) error {
	s := status.New(codes.InvalidArgument, field+": "+reason)
	if d, err := s.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: field, Description: reason},
	}}); err == nil {
		s = d
	}
	return s.Err()
}

// fieldErr maps a *fieldlimit.Violation (a duration or count out of
// bounds) to InvalidArgument naming its field.
func fieldErr(err error) error {
	var v *fieldlimit.Violation
	if errors.As(err, &v) {
		return invalidArg(v.Field, v.Reason)
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

// policyErr maps a policy error to InvalidArgument naming its key.
func policyErr(key string, err error) error {
	var ke *policy.KeyError
	if errors.As(err, &ke) {
		return invalidArg(ke.Key, ke.Reason)
	}
	if key == "" {
		key = "set"
	}
	return invalidArg(key, err.Error())
}
