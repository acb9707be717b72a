package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/coordclient"
	"walden/mtls"
	"walden/refusal"
	"walden/rpcerr"
	"walden/typo"
)

// This file is the one place where waldenctl turns what the coordinators
// answer into sentences for people: the refusal reasons of the state machine
// (refusal.Err*), of the membership API and of gRPC itself. The code, the
// reason and the server's own message stay available in -o json.

// Exit codes: the one table of what waldenctl's exit status means, for
// scripts (docs/waldenctl.md#exit-codes). A refusal's gRPC code decides it
// (exitCodeOf); errors found before any call are usage errors.
const (
	// exitOK: the command did what it was asked.
	exitOK = 0
	// exitError: any other error (a file that cannot be written, an
	// answer that cannot be printed, an internal error, Ctrl-C).
	exitError = 1
	// exitUsage: the command line is wrong (unknown command or flag, a
	// missing or malformed argument), or the cluster refused an argument
	// as invalid (InvalidArgument). Nothing was sent, or nothing changed.
	exitUsage = 2
	// exitUnavailable: no member answered in time, or none could (no
	// leader, shutting down). A request that changes something may or may
	// not have been carried out: the message says how to check.
	exitUnavailable = 3
	// exitRefused: the cluster refused the request in its current state
	// (FailedPrecondition: fenced, expired epoch, a job running; Aborted;
	// AlreadyExists; OutOfRange). Nothing changed.
	exitRefused = 4
	// exitNotFound: the broker, job, member, stream or failover named does
	// not exist (NotFound).
	exitNotFound = 5
	// exitDenied: the certificate's role does not allow the request, or
	// no usable certificate was given (PermissionDenied, Unauthenticated).
	exitDenied = 6
)

// exitTable says in words what each exit status means: waldenctl --help
// and docs/waldenctl.md print it.
var exitTable = []struct {
	Code    int
	Meaning string
}{
	{exitOK, "success"},
	{exitError, "any other error (a file that cannot be written, an internal error, Ctrl-C)"},
	{exitUsage, "usage: an unknown command or flag, a missing or malformed argument, or an argument the cluster refused as invalid (InvalidArgument); nothing changed"},
	{exitUnavailable, "unavailable or timed out: no member answered in time, or none could (no leader, shutting down). A request that changes something may or may not have been carried out: the message says so and names the command that tells"},
	{exitRefused, "refused in the cluster's current state: failed precondition (a fenced broker, an expired epoch, a job still running), aborted, conflict (already exists); nothing changed"},
	{exitNotFound, "not found: the broker, job, member, stream or failover named does not exist"},
	{exitDenied, "permission denied: the role of the certificate does not allow the request, or no usable certificate was given"},
}

// exitHelp is exitTable as the help text prints it.
func exitHelp() string {
	var b strings.Builder
	b.WriteString("Exit status:\n")
	for _, r := range exitTable {
		fmt.Fprintf(&b, "  %d  %s\n", r.Code, r.Meaning)
	}
	b.WriteString("With -o json (or yaml) an error is one JSON object on stderr: message, code (gRPC),\nreason (the refusal's reason), exit_code and, when the answer never came,\nmay_have_been_carried_out and the hint of how to check.")
	return b.String()
}

// exitCodeOf is the exit status of a call refused with code.
func exitCodeOf(code codes.Code) int {
	switch code {
	case codes.OK:
		return exitOK
	case codes.InvalidArgument:
		return exitUsage
	case codes.Unavailable, codes.DeadlineExceeded:
		return exitUnavailable
	case codes.FailedPrecondition, codes.Aborted, codes.AlreadyExists, codes.OutOfRange:
		return exitRefused
	case codes.NotFound:
		return exitNotFound
	case codes.PermissionDenied, codes.Unauthenticated:
		return exitDenied
	}
	return exitError
}

// usageErr marks err as a mistake on the command line (exit status 2).
func usageErr(err error) error {
	var ce *callError
	if errors.As(err, &ce) {
		if ce.Exit == 0 {
			ce.Exit = exitUsage
		}
		return ce
	}
	return &callError{Message: err.Error(), Exit: exitUsage}
}

// usagef is a usage error (exit status 2) with a message of its own.
func usagef(format string, args ...any) error {
	return &callError{Message: fmt.Sprintf(format, args...), Exit: exitUsage}
}

// cobraUsage are the beginnings of the errors cobra and pflag return for a
// wrong command line that waldenctl's own checks do not see first.
var cobraUsage = []string{"unknown command", "unknown flag", "unknown shorthand flag", "required flag(s)",
	"invalid argument", "flag needs an argument", "bad flag syntax", "accepts ", "requires at least", "requires at most"}

// exitCode is the exit status of a command that ended with err.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ce *callError
	if errors.As(err, &ce) {
		if ce.Exit != 0 {
			return ce.Exit
		}
	}
	for _, p := range cobraUsage {
		if strings.HasPrefix(err.Error(), p) {
			return exitUsage
		}
	}
	return exitError
}

// op says what a call was about, so that a refusal can be told in the
// user's terms ("broker b1 is already failed over").
type op struct {
	// verb is what the user asked, in a few words ("fail over", "cancel").
	verb string
	// kind and id name the object: "broker", "job", "member", "stream".
	kind, id string
	// check is the command that shows whether a request that changes
	// something was carried out after all, when its answer never came
	// (default: by kind, checkCommand).
	check string
}

// checkCommand is the command that shows whether a change o asked for was
// carried out.
func (o op) checkCommand() string {
	if o.check != "" {
		return o.check
	}
	switch o.kind {
	case "broker":
		return "waldenctl broker " + o.id
	case "job":
		return "waldenctl job " + o.id
	case "member":
		return "waldenctl member list"
	case "policy":
		return "waldenctl policy get"
	}
	return "waldenctl status"
}

func (o op) object() string {
	if o.id == "" {
		return o.kind
	}
	return o.kind + " " + o.id
}

// callError is a call that failed: Message is the sentence a person reads,
// Hint an optional suggestion printed on a line of its own; the other
// fields are printed with -o json or yaml.
type callError struct {
	Message  string            `json:"message"`
	Code     string            `json:"code,omitempty"`
	Reason   string            `json:"reason,omitempty"`
	Field    string            `json:"field,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Detail is the server's own message (for bug reports).
	Detail string `json:"detail,omitempty"`
	// Endpoints are the per-endpoint failures when no member answered.
	Endpoints []endpointError `json:"endpoints,omitempty"`
	Hint      string          `json:"hint,omitempty"`
	// Exit is the exit status (the table above); 0 means: from Code.
	Exit int `json:"exit_code"`
	// MaybeDone is set when a request that changes something got no
	// answer: it may or may not have been carried out (Hint says how to
	// check).
	MaybeDone bool `json:"may_have_been_carried_out,omitempty"`
}

type endpointError struct {
	Endpoint string `json:"endpoint"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message"`
	Detail   string `json:"detail,omitempty"`
}

func (e *callError) Error() string { return e.Message }

// explain turns the status of a refused call about o into a callError.
func explain(o op, s *status.Status, timeout time.Duration) *callError {
	e := &callError{Code: s.Code().String(), Detail: s.Message(), Exit: exitCodeOf(s.Code())}
	if info := rpcerr.InfoOf(s); info != nil {
		e.Reason, e.Metadata = info.GetReason(), info.GetMetadata()
	}
	for _, d := range s.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			if v := d.GetFieldViolations(); len(v) > 0 {
				e.Field = v[0].GetField()
				e.Message = fmt.Sprintf("%s: %s", asTyped(o, e.Field), v[0].GetDescription())
			}
		}
	}
	if e.Message == "" {
		e.Message = sentence(o, e, s, timeout)
	}
	return e
}

// flagOfField names the request fields the cluster may refuse as the
// user typed them: a flag, or the argument's name in the usage line.
var flagOfField = map[string]string{
	"ttl_ms":     "--ttl",
	"reason":     "--reason",
	"raft_addr":  "--raft",
	"admin_addr": "--admin",
	"job_state":  "--state",
	"set":        "KEY=VALUE",
	"limit":      "--limit",
}

// asTyped is a request field as the user gave it: its flag, or the
// argument naming the object (BROKER, ID) for the id fields of o.
func asTyped(o op, field string) string {
	if f, ok := flagOfField[field]; ok {
		return f
	}
	switch field {
	case "broker_id", "job_id", "id", "stream_id":
		if o.id != "" {
			return fmt.Sprintf("%s %q", firstNonEmpty(o.kind, "id"), o.id)
		}
		return strings.ToUpper(strings.TrimSuffix(field, "_id"))
	}
	return "invalid " + field
}

// sentence is the table of refusals: by reason first, then by code.
func sentence(o op, e *callError, s *status.Status, timeout time.Duration) string {
	obj := o.object()
	switch refusal.Reason(e.Reason) {
	case refusal.EpochExpired:
		switch {
		case o.verb == "fail over":
			return fmt.Sprintf("broker %s is already failed over: it was fenced and has not registered again since", o.id)
		case o.kind == "job":
			return fmt.Sprintf("job %s belongs to an earlier epoch: its broker registered again since the failover", o.id)
		}
		return fmt.Sprintf("%s: the epoch given is no longer current (fenced or superseded)", obj)
	case refusal.NodeFenced:
		if o.verb == "fail over" {
			return fmt.Sprintf("broker %s is already failed over: it was fenced and has not registered again since", o.id)
		}
		return fmt.Sprintf("%s is fenced: it was failed over and must register again before it may write", obj)
	case refusal.UnknownNode:
		return fmt.Sprintf("broker %s is not registered", firstNonEmpty(o.idOf("broker"), "given"))
	case refusal.JobNotFound:
		if o.kind == "failover" {
			return failoverNotFound(o.id)
		}
		return fmt.Sprintf("there is no recovery job %s", firstNonEmpty(o.idOf("job"), "with that id"))
	case refusal.JobNotRunning:
		return fmt.Sprintf("job %s is not pending or running, so there is nothing to %s", o.id, firstNonEmpty(o.verb, "do"))
	case refusal.RecoveryRunning:
		if o.kind == "job" {
			return fmt.Sprintf("job %s is still pending or running; only a failed or cancelled job can be retried", o.id)
		}
		return fmt.Sprintf("%s has a recovery job pending or running", obj)
	case refusal.RestoreReconciling:
		return fmt.Sprintf("%s: the cluster was restored from a backup and is still reconciling its catalog with what was written after it "+
			"(phase %s); until it is done no broker registers, no stream opens and no restore job is cancelled (a restore job whose WAL "+
			"is gone for good is resolved: waldenctl jobs resolve JOB --wal-lost); follow it with waldenctl restore status",
			obj, firstNonEmpty(e.Metadata["phase"], "?"))
	case refusal.StaleAttempt:
		return fmt.Sprintf("%s: this attempt of the recovery job is no longer the current one", obj)
	case refusal.Maintenance:
		return fmt.Sprintf("%s is in maintenance: only a manual failover may fence it", obj)
	case refusal.StreamNotFound:
		return fmt.Sprintf("there is no stream %s", firstNonEmpty(o.idOf("stream"), "with that id"))
	case refusal.StreamNotClosed:
		if o.verb == "remove" && e.Metadata["streams"] != "" {
			return fmt.Sprintf("broker %s owns opened streams %s: fail it over, or stop it gracefully, before removing it", o.id, e.Metadata["streams"])
		}
		if owner := e.Metadata["owner_broker_id"]; owner != "" {
			return fmt.Sprintf("%s is opened by broker %s", obj, owner)
		}
		return fmt.Sprintf("%s: a stream of the broker is still opened", obj)
	case refusal.StreamNotOpened:
		return fmt.Sprintf("%s is closed", obj)
	case refusal.NotOwner:
		return fmt.Sprintf("%s is owned by broker %s", obj, firstNonEmpty(e.Metadata["owner_broker_id"], "another broker"))
	case refusal.OffsetMismatch:
		return fmt.Sprintf("%s: the range does not start at the stream's end offset %s", obj, firstNonEmpty(e.Metadata["end_offset"], "?"))
	case refusal.MemberNotFound:
		return fmt.Sprintf("there is no member %s in the cluster", firstNonEmpty(o.idOf("member"), "with that id"))
	case refusal.MemberExists:
		return fmt.Sprintf("member %s is already in the cluster", o.id)
	case refusal.NotVoter:
		return fmt.Sprintf("member %s is a learner, not a voter: it cannot lead until it is promoted", o.id)
	case refusal.LastVoter:
		return fmt.Sprintf("member %s is the last voter: the cluster cannot remove it", o.id)
	case refusal.NoLeader, refusal.NotLeader:
		return "the cluster has no leader right now (a majority of coordinators must be up and in touch); try again"
	case refusal.Stopping:
		return "the coordinator is shutting down; try another endpoint"
	case refusal.ProposalDropped:
		return "the leader changed while the request was in flight; try again"
	case refusal.PolicyNotSeeded:
		return "the cluster's policy is not seeded yet: no leader has been elected since the cluster was founded; try again once one is"
	case refusal.InvalidArgument:
		return plain(e.Reason, s.Message())
	}
	switch s.Code() {
	case codes.DeadlineExceeded:
		return fmt.Sprintf("no answer within %s (--timeout)", timeout)
	case codes.Unavailable:
		if strings.Contains(s.Message(), "no leader") {
			return "the cluster has no leader right now (a majority of coordinators must be up and in touch); try again"
		}
		return "unavailable: " + transport(s.Message())
	case codes.PermissionDenied:
		// The coordinator says who may not do what, and why.
		return "permission denied: " + strings.TrimPrefix(plain(e.Reason, s.Message()), "permission denied: ")
	case codes.Unauthenticated:
		return "not authenticated: give a client certificate signed by the cluster's CA (--cert, --key): " + strings.TrimPrefix(plain(e.Reason, s.Message()), "permission denied: ")
	case codes.Unimplemented:
		return "the coordinator does not know this request (it runs an older walden)"
	case codes.NotFound:
		switch {
		case o.kind == "broker" && o.id != "":
			return fmt.Sprintf("broker %s is not registered", o.id)
		case o.kind == "member" && o.id != "":
			return fmt.Sprintf("there is no member %s in the cluster", o.id)
		case o.kind == "job" && o.id != "":
			return fmt.Sprintf("there is no recovery job %s", o.id)
		case o.kind == "failover" && o.id != "":
			return failoverNotFound(o.id)
		case o.id != "":
			return fmt.Sprintf("%s not found", obj)
		}
	}
	return plain(e.Reason, s.Message())
}

// failoverNotFound says that id names no failover: neither a recovery
// job's id nor a broker that was failed over.
func failoverNotFound(id string) string {
	if strings.HasPrefix(id, "job-") {
		return fmt.Sprintf("there is no failover %s: no recovery job has that id (waldenctl failovers lists them)", id)
	}
	return fmt.Sprintf("broker %s has no failover: it was never failed over, or is not registered (waldenctl failovers lists them)", id)
}

func (o op) idOf(kind string) string {
	if o.kind == kind {
		return o.id
	}
	return ""
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// plain is a server's message without the reason it starts with
// ("EPOCH_EXPIRED: ...", rpcerr.Status): what the server said about the
// request, a sentence in the user's terms as the services build it.
func plain(reason, msg string) string {
	if reason != "" {
		msg = strings.TrimPrefix(msg, reason+": ")
	}
	return strings.Join(strings.Fields(msg), " ")
}

// What transport says of a member that refuses the certificates given.
const (
	certUntrusted = "its certificate is not signed by the CA given with --cacert"
	certRequired  = "it requires a client certificate signed by the cluster's CA (--cert, --key)"
	connClosed    = "the connection was closed (does it expect TLS? give --cacert, --cert and --key)"
)

// transport describes a connection failure in a few words.
func transport(msg string) string {
	if s, ok := mtls.HandshakeSentence(msg); ok {
		return s // who refused whom, and why
	}
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "connection refused"):
		return "connection refused (is a coordinator listening there?)"
	case strings.Contains(m, "certificate signed by unknown authority"), strings.Contains(m, "certificate is not trusted"):
		return certUntrusted
	case strings.Contains(m, "first record does not look like a tls handshake"):
		return "it does not speak TLS (drop --cacert/--cert, or use an http:// endpoint)"
	case strings.Contains(m, "certificate required"), strings.Contains(m, "bad certificate"):
		return certRequired
	case strings.Contains(m, "error reading server preface"), strings.Contains(m, "connection reset"), strings.Contains(m, "eof"),
		strings.Contains(m, "broken pipe"):
		return connClosed
	case strings.Contains(m, "no such host"):
		return "no such host"
	case strings.Contains(m, "i/o timeout"), strings.Contains(m, "deadline exceeded"):
		return "no answer in time"
	}
	return plain("", msg)
}

// explainNoAnswer describes a call that no endpoint answered.
// noClientCert says that TLS was used without a client certificate: a
// member that closes the connection then refuses the missing certificate
// (with TLS 1.3 the client learns it only when it writes).
func explainNoAnswer(none *coordclient.NoAnswerError, timeout time.Duration, noClientCert bool) *callError {
	e := &callError{Code: codes.Unavailable.String(), Exit: exitUnavailable}
	var parts []string
	certOnly := len(none.Failures) > 0
	for _, f := range none.Failures {
		ee := endpointError{Endpoint: f.Addr}
		if s, ok := status.FromError(f.Err); ok {
			ee.Code, ee.Detail = s.Code().String(), s.Message()
			if info := rpcerr.InfoOf(s); info != nil {
				e.Reason = info.GetReason() // the last member's reason
			}
			switch {
			case s.Code() == codes.DeadlineExceeded:
				ee.Message = fmt.Sprintf("no answer within %s", timeout)
			case s.Code() == codes.Unavailable && !strings.Contains(s.Message(), "no leader"):
				ee.Message = transport(s.Message())
			default:
				ee.Message = explain(op{}, s, timeout).Message
			}
		} else {
			ee.Code, ee.Message, ee.Detail = codes.Unknown.String(), transport(f.Err.Error()), f.Err.Error()
		}
		if noClientCert && ee.Message == connClosed {
			ee.Message = certRequired
		}
		e.Endpoints = append(e.Endpoints, ee)
		parts = append(parts, ee.Endpoint+": "+ee.Message)
		_, refused := mtls.HandshakeSentence(ee.Message)
		certOnly = certOnly && (ee.Message == certRequired || ee.Message == certUntrusted || refused)
	}
	switch {
	case len(parts) == 0:
		e.Message = "no endpoint to ask (--endpoints)"
	case len(parts) == 1:
		e.Message = parts[0]
	default:
		e.Message = "no endpoint answered: " + strings.Join(parts, "; ")
	}
	if certOnly {
		// Every member refused the certificate: no retry will help.
		e.Exit = exitDenied
	}
	if errors.Is(none.Ctx, errInterrupted) {
		e.Message, e.Exit = "interrupted", exitError
	}
	return e
}

// unanswered adds to e, the failure of a request that changes something
// and got no answer (exit status 3), that it may or may not have been
// carried out, and the command that tells.
func unanswered(o op, e *callError) *callError {
	if e.Exit != exitUnavailable || refusedBeforeProposal(e.Reason) {
		return e
	}
	e.MaybeDone = true
	e.Message += ": the request may or may not have been carried out"
	e.Hint = "check with: " + o.checkCommand()
	return e
}

// refusedBeforeProposal reports whether a member refused with reason
// before anything was proposed: the request was not carried out.
func refusedBeforeProposal(reason string) bool {
	switch refusal.Reason(reason) {
	case refusal.NoLeader, refusal.NotLeader, refusal.Stopping, refusal.ShuttingDown, refusal.NotReady, refusal.PolicyNotSeeded:
		return true
	}
	return false
}

// errInterrupted ends a command on Ctrl-C.
var errInterrupted = errors.New("interrupted")

// plural is "1 object", "2 objects".
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// badWord refuses a flag's value that is not one of words: what it is
// not, the words, and the closest one.
func badWord(flag, value, what string, words []string) *callError {
	e := &callError{Message: fmt.Sprintf("%s: %q is not %s (%s)", flag, value, what, strings.Join(words, ", ")), Exit: exitUsage}
	if s := closest(value, words); s != "" {
		e.Hint = "did you mean " + s + "?"
	}
	return e
}

// closest returns the candidate nearest to s by edit distance when it is
// near enough to be a typo (at most a third of s's length, at least 1),
// else "".
func closest(s string, candidates []string) string {
	return typo.Closest(s, candidates, max(1, len(s)/3))
}
