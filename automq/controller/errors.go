package controller

import (
	"errors"
	"fmt"
	"strings"

	"walden/automq/protocol"
)

// Errors of the client, wrapped with the detail; test for them with
// errors.Is. The controller's own answers are protocol's named errors
// (errors.Is(err, protocol.ErrNodeFenced)).
var (
	// ErrInvalidConfig means a Config that Validate refuses.
	ErrInvalidConfig = errors.New("invalid controller config")
	// ErrInvalidArgument means a call's arguments that no controller
	// would accept (a count below 1, a time to live below 1 ms); nothing
	// was sent.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNoController means no voter answered as the active controller
	// within the attempts (or the deadline): every voter refused the
	// connection, was a standby (NOT_CONTROLLER), or failed. The error
	// lists each voter's last failure.
	ErrNoController = errors.New("no active controller answered")
	// ErrNotAutoMQ means a voter that does not serve the AutoMQ API asked
	// for (its ApiVersions lists no such key): not an AutoMQ controller
	// listener, or an AutoMQ without it.
	ErrNotAutoMQ = errors.New("not an AutoMQ controller")
	// ErrUnsupportedByController means a request the controller's version
	// of the API cannot carry (object attributes at CommitStreamSetObject
	// v0, stream tags at OpenStreams v0); nothing was sent.
	ErrUnsupportedByController = errors.New("the controller's version of the API cannot carry the request")
	// ErrOutcomeUnknown means a request that is not safe to repeat was
	// sent but its answer was lost (the connection died, the deadline
	// passed, the answer did not decode): it may or may not have been
	// carried out.
	ErrOutcomeUnknown = errors.New("the request may or may not have been carried out")
	// ErrBadAnswer means an answer that decodes but does not fit the
	// request (a per-stream list of another length).
	ErrBadAnswer = errors.New("the controller's answer does not fit the request")
	// ErrClosed means a call on a closed Client.
	ErrClosed = errors.New("controller client closed")
)

// VoterFailure is why one voter did not serve a call.
type VoterFailure struct {
	Voter string
	Err   error
}

// NoControllerError is ErrNoController with each voter's last failure,
// and the context's error when the deadline ended the call.
type NoControllerError struct {
	// API is the key of the API called.
	API int16
	// Rounds is how many rounds over the voters were made.
	Rounds int
	// Failures holds each voter's last failure, in the voters' order.
	Failures []VoterFailure
	// Ctx is the context's error when the call's context ended it.
	Ctx error
}

func (e *NoControllerError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: no voter answered as the active controller", protocol.NameForKey(e.API))
	if e.Ctx != nil {
		fmt.Fprintf(&b, " before the deadline (%v)", e.Ctx)
	} else {
		fmt.Fprintf(&b, " after %d round", e.Rounds)
		if e.Rounds != 1 {
			b.WriteString("s")
		}
		b.WriteString(" over the voters")
	}
	for i, f := range e.Failures {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %v", f.Voter, f.Err)
	}
	return b.String()
}

// Unwrap returns ErrNoController, the context's error and every voter's
// failure, so that errors.Is finds any of them.
func (e *NoControllerError) Unwrap() []error {
	out := []error{ErrNoController}
	if e.Ctx != nil {
		out = append(out, e.Ctx)
	}
	for _, f := range e.Failures {
		out = append(out, f.Err)
	}
	return out
}

// outcomeUnknownError is ErrOutcomeUnknown with its cause.
type outcomeUnknownError struct {
	api   int16
	voter string
	cause error
}

func (e *outcomeUnknownError) Error() string {
	return fmt.Sprintf("%s sent to %s: %v; it may or may not have been carried out, and it is not safe "+
		"to send again blindly", protocol.NameForKey(e.api), e.voter, e.cause)
}

func (e *outcomeUnknownError) Unwrap() []error { return []error{ErrOutcomeUnknown, e.cause} }
