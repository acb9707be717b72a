package rpcerr

import (
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/refusal"
)

// Domain is the google.rpc.ErrorInfo domain of walden's refusals.
const Domain = "walden"

// legacyDomain is the domain the cluster and access refusals used before
// every refusal shared Domain; Reason still reads it from older members.
const legacyDomain = "walden.v1"

// codeOf is the gRPC code of each reason. A reason missing here is a bug
// (TestEveryReasonHasACode): Status answers it as Internal.
var codeOf = map[refusal.Reason]codes.Code{
	refusal.EpochExpired:         codes.FailedPrecondition,
	refusal.NodeFenced:           codes.FailedPrecondition,
	refusal.UnknownNode:          codes.NotFound,
	refusal.StreamNotClosed:      codes.FailedPrecondition,
	refusal.StreamNotOpened:      codes.FailedPrecondition,
	refusal.OffsetMismatch:       codes.FailedPrecondition,
	refusal.NotOwner:             codes.FailedPrecondition,
	refusal.StaleAttempt:         codes.FailedPrecondition,
	refusal.JobNotRunning:        codes.FailedPrecondition,
	refusal.RecoveryRunning:      codes.FailedPrecondition,
	refusal.StreamNotFound:       codes.NotFound,
	refusal.JobNotFound:          codes.NotFound,
	refusal.Maintenance:          codes.FailedPrecondition,
	refusal.InvalidArgument:      codes.InvalidArgument,
	refusal.LeaseNotExpired:      codes.FailedPrecondition,
	refusal.DecidedInAnotherTerm: codes.Aborted,
	refusal.StaleObservation:     codes.Aborted,
	refusal.FailoverRequested:    codes.FailedPrecondition,
	refusal.LeaseAttested:        codes.FailedPrecondition,
	refusal.RestoreReconciling:   codes.FailedPrecondition,

	refusal.LeaseInvalid:       codes.FailedPrecondition,
	refusal.NotReady:           codes.Unavailable,
	refusal.ShuttingDown:       codes.Unavailable,
	refusal.WALFull:            codes.Unavailable,
	refusal.OutOfOrderSequence: codes.FailedPrecondition,
	refusal.UnknownProducer:    codes.FailedPrecondition,
	refusal.ObjectMissing:      codes.DataLoss,

	refusal.NotLeader:          codes.Unavailable,
	refusal.NoLeader:           codes.Unavailable,
	refusal.Stopping:           codes.Unavailable,
	refusal.MemberNotFound:     codes.NotFound,
	refusal.MemberExists:       codes.AlreadyExists,
	refusal.InvalidMember:      codes.InvalidArgument,
	refusal.NotVoter:           codes.FailedPrecondition,
	refusal.LastVoter:          codes.FailedPrecondition,
	refusal.ProposalDropped:    codes.Unavailable,
	refusal.PermissionDenied:   codes.PermissionDenied,
	refusal.Unauthenticated:    codes.Unauthenticated,
	refusal.Compacted:          codes.OutOfRange,
	refusal.MemberRemoved:      codes.FailedPrecondition,
	refusal.VoterChangeTooSoon: codes.FailedPrecondition,
	refusal.PolicyNotSeeded:    codes.Unavailable,
	refusal.LeaseNotGranted:    codes.Unavailable,
	refusal.LeaseHeld:          codes.FailedPrecondition,
}

// Code is the gRPC code of reason.
func Code(reason refusal.Reason) codes.Code {
	if c, ok := codeOf[reason]; ok {
		return c
	}
	return codes.Internal
}

// Status maps err to the status a service answers with. A refusal
// (refusal.Error anywhere in err's chain) becomes its reason's code, the
// message "REASON: err", and an ErrorInfo detail with the reason and the
// metadata refusal.WithMetadata attached. An error that already is a gRPC
// status keeps it; any other error is Unknown. nil maps to nil.
func Status(err error) *status.Status {
	if err == nil {
		return nil
	}
	reason := refusal.Of(err)
	if reason == "" {
		if s, ok := status.FromError(err); ok {
			return s
		}
		return status.New(codes.Unknown, err.Error())
	}
	return build(reason, fmt.Sprintf("%s: %v", reason, err), refusal.Metadata(err))
}

// Err is Status(err).Err(): the error a service handler returns.
func Err(err error) error {
	if err == nil {
		return nil
	}
	return Status(err).Err()
}

// New is the status error of a refusal told in a message of its own
// (msg, after the reason) rather than by a refusal.Error, with optional
// metadata.
func New(reason refusal.Reason, msg string, md map[string]string) error {
	return build(reason, string(reason)+": "+msg, md).Err()
}

// NewPlain is New whose message is msg alone, for answers whose message
// predates the reason prefix (the membership and access refusals).
func NewPlain(reason refusal.Reason, msg string, md map[string]string) error {
	return build(reason, msg, md).Err()
}

func build(reason refusal.Reason, msg string, md map[string]string) *status.Status {
	st := status.New(Code(reason), msg)
	if md == nil {
		md = map[string]string{}
	}
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: string(reason), Domain: Domain, Metadata: md}); err == nil {
		st = d
	}
	return st
}

// Parts are a status error taken apart, for an answer that travels inside
// a message rather than as a call's status (the lease renewal stream):
// the code, the message, and the reason and metadata of its ErrorInfo of
// walden's domain (empty when it has none).
type Parts struct {
	Code     codes.Code
	Message  string
	Reason   refusal.Reason
	Metadata map[string]string
}

// Split takes err apart as Status(err) would answer it.
func Split(err error) Parts {
	s := Status(err)
	info := InfoOf(s)
	return Parts{Code: s.Code(), Message: s.Message(), Reason: refusal.Reason(info.GetReason()), Metadata: info.GetMetadata()}
}

// Join is the status error p was split from: Reason and Metadata and
// Code read back from it as from the call's status.
func Join(p Parts) error {
	if p.Code == codes.OK {
		return nil
	}
	s := status.New(p.Code, p.Message)
	if p.Reason != "" {
		if d, err := s.WithDetails(&errdetails.ErrorInfo{Reason: string(p.Reason), Domain: Domain, Metadata: p.Metadata}); err == nil {
			s = d
		}
	}
	return s.Err()
}

// Info returns the ErrorInfo of walden's domain that err carries, or nil.
func Info(err error) *errdetails.ErrorInfo {
	s, ok := status.FromError(err)
	if !ok || s == nil {
		return nil
	}
	return InfoOf(s)
}

// InfoOf is Info for a status.
func InfoOf(s *status.Status) *errdetails.ErrorInfo {
	for _, d := range s.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && (info.GetDomain() == Domain || info.GetDomain() == legacyDomain) {
			return info
		}
	}
	return nil
}

// Reason returns the reason a gRPC error carries, or "" when it carries
// none (a transport failure, a status of gRPC's own).
func Reason(err error) refusal.Reason {
	return refusal.Reason(Info(err).GetReason())
}

// Metadata returns the metadata of the reason a gRPC error carries, or nil.
func Metadata(err error) map[string]string {
	return Info(err).GetMetadata()
}

// MarkdownTable is the reference table of every refusal: its reason, its
// gRPC code and what it means (docs/refusals.md is generated from it).
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| reason | gRPC code | meaning |\n|---|---|---|\n")
	for _, r := range refusal.Reasons {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", r.Reason, Code(r.Reason), r.Meaning)
	}
	return b.String()
}
