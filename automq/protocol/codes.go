package protocol

import (
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
)

// CodeInfo describes an error code the controller may answer.
type CodeInfo struct {
	// Code is the number on the wire.
	Code int16
	// Name is Kafka's (or AutoMQ's) name for it, e.g. NODE_FENCED.
	Name string
	// Meaning says, for an operator, what it means in a failover and what
	// to do.
	Meaning string
	// Retriable says whether the same request, sent again (later, or to
	// another voter), may succeed. It does not say that sending it again
	// is harmless: that depends on the API (see package controller).
	Retriable bool
	// APIs names the APIs that answer it.
	APIs string
}

// CodeError is the named error of one code, the target of errors.Is:
// errors.Is(err, protocol.ErrNodeFenced) holds for an APIError with code
// 514, whatever it wraps.
type CodeError struct {
	CodeInfo
}

// Error returns the name, the code and the meaning.
func (e *CodeError) Error() string {
	return fmt.Sprintf("%s (%d): %s", e.Name, e.Code, e.Meaning)
}

func newCode(code int16, name string, retriable bool, apis, meaning string) *CodeError {
	return &CodeError{CodeInfo{Code: code, Name: name, Meaning: meaning, Retriable: retriable, APIs: apis}}
}

const (
	apisStreams   = "OpenStreams, CloseStreams, CommitStreamSetObject"
	apisAny       = "any"
	apisNotWalden = "APIs walden does not use"
)

// The named errors of the codes that matter to a failover: Kafka's that the
// controller answers to these APIs, and AutoMQ's range 501–516 and 599.
// Other Kafka codes are kerr's errors.
var (
	ErrUnknownServerError = newCode(-1, "UNKNOWN_SERVER_ERROR", false, apisAny,
		"The controller failed while handling the request; its log says why, and the outcome is unknown. "+
			"walden repeats only requests that are safe to repeat; otherwise check the controller's log.")
	ErrRequestTimedOut = newCode(7, "REQUEST_TIMED_OUT", true, apisAny,
		"The controller did not complete the request in time (its metadata log was slow, or lost its quorum); "+
			"the outcome is unknown. walden repeats it only where that is safe.")
	ErrClusterAuthorizationFailed = newCode(31, "CLUSTER_AUTHORIZATION_FAILED", false, apisAny,
		"The controller's authorizer refused walden's principal (AutoMQ 1.4.1 checks no ACL on these APIs, "+
			"so this is another controller). Grant the principal cluster access, or configure another one.")
	ErrUnsupportedVersion = newCode(35, "UNSUPPORTED_VERSION", false, apisAny,
		"The controller does not speak the version walden sent, though walden picks versions from the "+
			"controller's own ApiVersions: the controller changed under it (a rolling upgrade). Nothing was done.")
	ErrNotController = newCode(41, "NOT_CONTROLLER", true, apisAny,
		"This voter is not the active controller (a standby, or an election is under way); nothing was done. "+
			"walden moves on to the next voter of controller.quorum.voters.")
	ErrInvalidRequest = newCode(42, "INVALID_REQUEST", false, apisAny,
		"The controller could not parse the request or found it inconsistent: a bug in walden or a controller "+
			"of another AutoMQ version. Nothing was done; report it with the controller's log.")

	ErrStreamExist = newCode(501, "STREAM_EXIST", false, "CreateStreams ("+apisNotWalden+")",
		"A stream with that id already exists. walden never creates streams: a controller answering this "+
			"to walden does not behave as AutoMQ 1.4.1.")
	ErrStreamNotExist = newCode(502, "STREAM_NOT_EXIST", false, apisStreams,
		"The controller has no stream with that id (deleted since, or a wrong id). There is nothing to "+
			"commit or close for a deleted stream; a failover reports it and goes on with the others.")
	ErrStreamFenced = newCode(503, "STREAM_FENCED", false, "OpenStreams, CloseStreams",
		"The stream's epoch at the controller is newer than the request's, or another node owns its current "+
			"range: the stream was opened again since. It is no longer the dead node's to close; nothing was done.")
	ErrObjectNotExist = newCode(504, "OBJECT_NOT_EXIST", false, "CommitStreamSetObject",
		"The object id was never prepared, or its preparation expired (the time to live passed) before the "+
			"commit. Nothing was committed: prepare new ids, upload the objects again under them and commit.")
	ErrStreamNotOpened = newCode(505, "STREAM_NOT_OPENED", false, "CommitStreamSetObject",
		"A committed range belongs to a stream that is closed at the controller: its records were already "+
			"handed over (another failover, or the node closed it). Nothing was committed; read the opening "+
			"streams again.")
	ErrStreamNotClosed = newCode(506, "STREAM_NOT_CLOSED", true, "OpenStreams",
		"Another node still holds the stream open: the dead broker, until the failover closes its streams. "+
			"New partition leaders get this until then; it clears by itself once the failover has closed them.")
	ErrRedundantOperation = newCode(507, "REDUNDANT_OPERATION", false, "CommitStreamSetObject, CloseStreams",
		"The operation was already done (a commit or close repeated after its answer was lost). Nothing "+
			"changed: it counts as done.")
	ErrCompactedObjectsNotFound = newCode(508, "COMPACTED_OBJECTS_NOT_FOUND", false, "CommitStreamSetObject",
		"A commit named compacted objects the controller does not know (compaction only: a failover commits "+
			"none). Nothing was committed.")
	ErrOffsetNotMatched = newCode(509, "OFFSET_NOT_MATCHED", false, "CommitStreamSetObject",
		"A committed range does not start at the stream's end offset at the controller: an earlier attempt "+
			"already committed part of the records, or the WAL was read against stale offsets. Nothing was "+
			"committed; read the opening streams again and commit from their end offsets.")
	ErrNodeEpochExpired = newCode(510, "NODE_EPOCH_EXPIRED", false, "GetOpeningStreams, "+apisStreams,
		"The controller holds a newer epoch for the node than the request's: the broker restarted (a new "+
			"epoch) or a failover used a newer one. This failover must stop; a restarted broker recovers its own WAL.")
	ErrNodeEpochNotExist = newCode(511, "NODE_EPOCH_NOT_EXIST", false, apisStreams,
		"The controller has no record of the node (it never started, or was removed): check the node id. "+
			"Nothing was done.")
	ErrKeyExist = newCode(512, "KEY_EXIST", false, "PutKVs ("+apisNotWalden+")",
		"A key-value put found the key already there.")
	ErrKeyNotExist = newCode(513, "KEY_NOT_EXIST", false, "GetKVs, DeleteKVs ("+apisNotWalden+")",
		"A key-value request found no such key.")
	ErrNodeFenced = newCode(514, "NODE_FENCED", false, "OpenStreams, CommitStreamSetObject",
		"The node is in failover mode at the controller: a failover's GetOpeningStreams fenced it, and its "+
			"own opens and commits are refused until it starts again with a new epoch. A broker that gets this "+
			"must stop; a failover's commit gets it only without FailoverMode.")
	ErrNodeLocked = newCode(515, "NODE_LOCKED", true, "OpenStreams",
		"The stream's last range belongs to a node the controller has locked (a reassignment under way); "+
			"the open is refused until the node is unlocked. Retry later.")
	ErrObjectNotCommitted = newCode(516, "OBJECT_NOT_COMMITED", false, "object APIs walden does not use",
		"The object is not committed; nothing was done.")
	ErrStreamInnerError = newCode(599, "STREAM_INNER_ERROR", false, apisStreams,
		"The controller's metadata of the stream is inconsistent (a range missing, or a request epoch above "+
			"the stream's). This should not happen: stop and inspect the controller's log before retrying.")
)

// ErrUnknownCode is the target of errors.Is for an error code that neither
// AutoMQ 1.4.1 nor Kafka defines.
var ErrUnknownCode = errors.New("unknown error code")

// codes lists the named errors in the order of the reference table.
var codes = []*CodeError{
	ErrUnknownServerError, ErrRequestTimedOut, ErrClusterAuthorizationFailed, ErrUnsupportedVersion,
	ErrNotController, ErrInvalidRequest,
	ErrStreamExist, ErrStreamNotExist, ErrStreamFenced, ErrObjectNotExist, ErrStreamNotOpened,
	ErrStreamNotClosed, ErrRedundantOperation, ErrCompactedObjectsNotFound, ErrOffsetNotMatched,
	ErrNodeEpochExpired, ErrNodeEpochNotExist, ErrKeyExist, ErrKeyNotExist, ErrNodeFenced, ErrNodeLocked,
	ErrObjectNotCommitted, ErrStreamInnerError,
}

// Codes returns every named error code's description, NONE (0) first, in
// the order of the reference table (docs/automq-protocol.md).
func Codes() []CodeInfo {
	out := []CodeInfo{{Code: 0, Name: "NONE", Meaning: "Success.", APIs: apisAny}}
	for _, c := range codes {
		out = append(out, c.CodeInfo)
	}
	return out
}

// LookupCode returns the named error of a code, nil for 0 and for a code
// without one of this package (other Kafka codes are kerr's).
func LookupCode(code int16) *CodeError {
	for _, c := range codes {
		if c.Code == code {
			return c
		}
	}
	return nil
}

// APIError is a non-zero error code in a response: the API that answered
// it, the code, and for a per-item code the item it is about. It unwraps to
// the code's named error (a *CodeError), to kerr's error for another Kafka
// code, or to ErrUnknownCode; errors.Is also matches kerr's error of the
// same code (errors.Is(err, kerr.NotController)).
type APIError struct {
	// API is the key of the API that answered.
	API int16
	// Code is the error code.
	Code int16
	// Item names what a per-item code is about ("stream 42"); empty for a
	// top-level code.
	Item string
	err  error
}

// ErrorForCode returns nil for code 0 and otherwise the APIError of a
// top-level code of api's response.
func ErrorForCode(api, code int16) error {
	return ItemError(api, code, "")
}

// ItemError returns nil for code 0 and otherwise the APIError of a code
// about one item of api's response (item names it, e.g. "stream 42").
func ItemError(api, code int16, item string) error {
	if code == 0 {
		return nil
	}
	e := &APIError{API: api, Code: code, Item: item}
	if c := LookupCode(code); c != nil {
		e.err = c
	} else if ke := kerr.TypedErrorForCode(code); ke != kerr.UnknownServerError {
		e.err = ke
	} else {
		e.err = ErrUnknownCode
	}
	return e
}

// Error says which API answered which code about what, and what it means.
func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString(NameForKey(e.API))
	b.WriteString(" answered ")
	name, meaning := e.Name(), e.Meaning()
	fmt.Fprintf(&b, "%s (%d)", name, e.Code)
	if e.Item != "" {
		b.WriteString(" for ")
		b.WriteString(e.Item)
	}
	b.WriteString(": ")
	b.WriteString(meaning)
	return b.String()
}

// Unwrap returns the code's named error, kerr's error, or ErrUnknownCode.
func (e *APIError) Unwrap() error { return e.err }

// Is matches kerr's error of the same code, so that callers may test with
// either package's values.
func (e *APIError) Is(target error) bool {
	if ke, ok := target.(*kerr.Error); ok {
		return ke.Code == e.Code
	}
	return false
}

// Name is the code's name (e.g. NODE_FENCED), or "UNKNOWN".
func (e *APIError) Name() string {
	switch err := e.err.(type) {
	case *CodeError:
		return err.Name
	case *kerr.Error:
		return err.Message
	}
	return "UNKNOWN"
}

// Meaning is the code's meaning for an operator.
func (e *APIError) Meaning() string {
	switch err := e.err.(type) {
	case *CodeError:
		return err.Meaning
	case *kerr.Error:
		return err.Description
	}
	return "a code that neither AutoMQ 1.4.1 nor Kafka defines: the controller is of another version " +
		"than walden knows. Nothing is assumed to have happened or not; check the controller's log."
}

// Retriable says whether the same request, sent again, may succeed (see
// CodeInfo.Retriable). An unknown code is not.
func (e *APIError) Retriable() bool {
	switch err := e.err.(type) {
	case *CodeError:
		return err.Retriable
	case *kerr.Error:
		return err.Retriable
	}
	return false
}

// MarkdownTable is the reference table of the error codes: code, name,
// whether a retry may succeed, which APIs answer it and what it means
// (docs/automq-protocol.md is generated from it).
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| code | name | retry may succeed | answered by | meaning |\n|---|---|---|---|---|\n")
	for _, c := range Codes() {
		retry := "no"
		if c.Retriable {
			retry = "yes"
		}
		if c.Code == 0 {
			retry = "—"
		}
		fmt.Fprintf(&b, "| %d | `%s` | %s | %s | %s |\n", c.Code, c.Name, retry, c.APIs, c.Meaning)
	}
	return b.String()
}
