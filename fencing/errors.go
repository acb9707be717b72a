package fencing

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the google.rpc.ErrorInfo domain of walden's refusals.
const Domain = "walden"

// Error is a refusal with a machine-readable reason. The package's sentinels
// are *Error values: compare with errors.Is, read the reason with Reason.
type Error struct {
	reason string
	code   codes.Code
	msg    string
}

// Error returns the refusal's message.
func (e *Error) Error() string { return e.msg }

// Reason is the machine-readable reason, e.g. "NODE_FENCED".
func (e *Error) Reason() string { return e.reason }

// Code is the gRPC code the refusal maps to.
func (e *Error) Code() codes.Code { return e.code }

func newError(reason string, code codes.Code, msg string) *Error {
	return &Error{reason: reason, code: code, msg: "fencing: " + msg}
}

// The refusals of the catalog, the broker registry and the recovery jobs.
var (
	// ErrEpochExpired: the request carries an epoch (or stream epoch, or
	// job token) older than the current one.
	ErrEpochExpired = newError("EPOCH_EXPIRED", codes.FailedPrecondition, "epoch expired")
	// ErrNodeFenced: the broker was fenced by a failover decision; it must
	// register again before it may write.
	ErrNodeFenced = newError("NODE_FENCED", codes.FailedPrecondition, "node fenced")
	// ErrUnknownNode: no broker is registered under that id.
	ErrUnknownNode = newError("UNKNOWN_NODE", codes.NotFound, "unknown node")
	// ErrStreamNotClosed: the stream is opened by another broker (or the
	// operation needs every stream closed).
	ErrStreamNotClosed = newError("STREAM_NOT_CLOSED", codes.FailedPrecondition, "stream not closed")
	// ErrStreamNotOpened: the stream is closed; commit needs it opened.
	ErrStreamNotOpened = newError("STREAM_NOT_OPENED", codes.FailedPrecondition, "stream not opened")
	// ErrOffsetMismatch: a committed range does not start at the stream's
	// end offset.
	ErrOffsetMismatch = newError("OFFSET_MISMATCH", codes.FailedPrecondition, "offset mismatch")
	// ErrNotOwner: the stream is owned by another broker or another epoch
	// of this broker.
	ErrNotOwner = newError("NOT_OWNER", codes.FailedPrecondition, "not owner")
	// ErrStaleAttempt: the request comes from an attempt of a recovery job
	// (or an assignee) that is no longer the current one.
	ErrStaleAttempt = newError("STALE_ATTEMPT", codes.FailedPrecondition, "stale attempt")
	// ErrJobNotRunning: the recovery job is not pending or running.
	ErrJobNotRunning = newError("JOB_NOT_RUNNING", codes.FailedPrecondition, "job not running")
	// ErrRecoveryRunning: a recovery job of the broker is pending or
	// running; the broker may not register until it ends.
	ErrRecoveryRunning = newError("RECOVERY_RUNNING", codes.FailedPrecondition, "recovery running")
	// ErrUnknownStream: no stream has that id.
	ErrUnknownStream = newError("STREAM_NOT_FOUND", codes.NotFound, "stream not found")
	// ErrUnknownJob: no recovery job has that id (for that broker).
	ErrUnknownJob = newError("JOB_NOT_FOUND", codes.NotFound, "job not found")
	// ErrMaintenance: the broker is in maintenance; only a manual failover
	// may fence it.
	ErrMaintenance = newError("MAINTENANCE", codes.FailedPrecondition, "broker in maintenance")
	// ErrInvalidArgument: the command is malformed (a missing id, an
	// unknown state or key); the message names the field.
	ErrInvalidArgument = newError("INVALID_ARGUMENT", codes.InvalidArgument, "invalid argument")
	// ErrLeaseNotExpired: a failover decision without attestations from a
	// majority of the voters that their lease grant for the epoch expired.
	ErrLeaseNotExpired = newError("LEASE_NOT_EXPIRED", codes.FailedPrecondition, "lease not expired on a majority of coordinators")
	// ErrDecidedInAnotherTerm: an entry whose validity rests on the deciding
	// leader's timers was appended in another raft term than it was decided
	// in (a deposed leader's decision reached the new leader).
	ErrDecidedInAnotherTerm = newError("DECIDED_IN_ANOTHER_TERM", codes.Aborted, "decided in another term")
	// ErrStaleObservation: an observation meant to replace an observation
	// that has since been replaced (a late or repeated proposal).
	ErrStaleObservation = newError("STALE_OBSERVATION", codes.Aborted, "stale observation")
	// ErrFailoverRequested: an operator requested the broker's failover; its
	// lease is not renewed any more.
	ErrFailoverRequested = newError("FAILOVER_REQUESTED", codes.FailedPrecondition, "failover requested")
	// ErrLeaseAttested: this coordinator attested that its grant of the
	// epoch expired and grants it no more until it withdraws.
	ErrLeaseAttested = newError("LEASE_ATTESTED", codes.FailedPrecondition, "lease attested expired")
)

var sentinels = []*Error{
	ErrEpochExpired, ErrNodeFenced, ErrUnknownNode, ErrStreamNotClosed, ErrStreamNotOpened,
	ErrOffsetMismatch, ErrNotOwner, ErrStaleAttempt, ErrJobNotRunning, ErrRecoveryRunning,
	ErrUnknownStream, ErrUnknownJob, ErrMaintenance, ErrInvalidArgument,
	ErrLeaseNotExpired, ErrDecidedInAnotherTerm, ErrStaleObservation, ErrFailoverRequested, ErrLeaseAttested,
}

// Reason returns the machine-readable reason of the refusal err wraps, or ""
// when it wraps none.
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.reason
	}
	return ""
}

// FromReason returns the sentinel with the given reason, or nil.
func FromReason(reason string) error {
	for _, e := range sentinels {
		if e.reason == reason {
			return e
		}
	}
	return nil
}

// metadataError attaches ErrorInfo metadata to an error.
type metadataError struct {
	err error
	md  map[string]string
}

func (e *metadataError) Error() string { return e.err.Error() }
func (e *metadataError) Unwrap() error { return e.err }

// WithMetadata wraps err with key/value metadata that GRPCStatus puts into
// the ErrorInfo detail (e.g. the owner of a stream for NOT_OWNER).
func WithMetadata(err error, md map[string]string) error {
	if err == nil || len(md) == 0 {
		return err
	}
	cp := make(map[string]string, len(md))
	for k, v := range md {
		cp[k] = v
	}
	return &metadataError{err: err, md: cp}
}

// GRPCStatus maps err to a gRPC status. A refusal becomes its code
// (FailedPrecondition; NotFound for the unknown node, stream and job;
// InvalidArgument for a malformed command) with a message starting with the
// reason and a google.rpc.ErrorInfo detail {Reason, Domain "walden",
// Metadata}. An error that already is a gRPC status keeps it; any other error
// is codes.Unknown. nil maps to nil.
func GRPCStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	var e *Error
	if !errors.As(err, &e) {
		if s, ok := status.FromError(err); ok {
			return s
		}
		return status.New(codes.Unknown, err.Error())
	}
	md := map[string]string{}
	var m *metadataError
	if errors.As(err, &m) {
		for k, v := range m.md {
			md[k] = v
		}
	}
	st := status.New(e.code, fmt.Sprintf("%s: %v", e.reason, err))
	withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: e.reason, Domain: Domain, Metadata: md})
	if derr != nil {
		return st
	}
	return withInfo
}

// ReasonFromStatus returns the walden reason carried by a gRPC error
// (its ErrorInfo detail of domain "walden"), or "" when it has none.
func ReasonFromStatus(err error) string {
	s, ok := status.FromError(err)
	if !ok || s == nil {
		return ""
	}
	for _, d := range s.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}
