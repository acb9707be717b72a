package refusal

import (
	"errors"
	"maps"
)

// Reason is a refusal's machine-readable name, the ErrorInfo reason a
// client matches on. Reasons never change once released.
type Reason string

// The refusals of the replicated state: the catalog, the broker registry,
// the failover decision and the recovery jobs. What each means is in Reasons.
const (
	EpochExpired         Reason = "EPOCH_EXPIRED"
	NodeFenced           Reason = "NODE_FENCED"
	UnknownNode          Reason = "UNKNOWN_NODE"
	StreamNotClosed      Reason = "STREAM_NOT_CLOSED"
	StreamNotOpened      Reason = "STREAM_NOT_OPENED"
	OffsetMismatch       Reason = "OFFSET_MISMATCH"
	NotOwner             Reason = "NOT_OWNER"
	StaleAttempt         Reason = "STALE_ATTEMPT"
	JobNotRunning        Reason = "JOB_NOT_RUNNING"
	RecoveryRunning      Reason = "RECOVERY_RUNNING"
	StreamNotFound       Reason = "STREAM_NOT_FOUND"
	JobNotFound          Reason = "JOB_NOT_FOUND"
	Maintenance          Reason = "MAINTENANCE"
	InvalidArgument      Reason = "INVALID_ARGUMENT"
	LeaseNotExpired      Reason = "LEASE_NOT_EXPIRED"
	DecidedInAnotherTerm Reason = "DECIDED_IN_ANOTHER_TERM"
	StaleObservation     Reason = "STALE_OBSERVATION"
	FailoverRequested    Reason = "FAILOVER_REQUESTED"
	LeaseAttested        Reason = "LEASE_ATTESTED"
	// RestoreReconciling: the cluster was restored from a backup and has
	// not reconciled its catalog with what exists beyond it yet.
	RestoreReconciling Reason = "RESTORE_RECONCILING"
)

// The refusals of a broker's data API. What each means is in Reasons.
const (
	LeaseInvalid       Reason = "LEASE_INVALID"
	NotReady           Reason = "NOT_READY"
	ShuttingDown       Reason = "SHUTTING_DOWN"
	WALFull            Reason = "WAL_FULL"
	OutOfOrderSequence Reason = "OUT_OF_ORDER_SEQUENCE"
	UnknownProducer    Reason = "UNKNOWN_PRODUCER"
	ObjectMissing      Reason = "OBJECT_MISSING"
)

// The refusals of the cluster itself: leadership, membership, access and
// the watch. What each means is in Reasons.
const (
	NotLeader        Reason = "NOT_LEADER"
	NoLeader         Reason = "NO_LEADER"
	Stopping         Reason = "STOPPING"
	MemberNotFound   Reason = "MEMBER_NOT_FOUND"
	MemberExists     Reason = "MEMBER_EXISTS"
	InvalidMember    Reason = "INVALID_MEMBER"
	NotVoter         Reason = "NOT_VOTER"
	LastVoter        Reason = "LAST_VOTER"
	ProposalDropped  Reason = "PROPOSAL_DROPPED"
	PermissionDenied Reason = "PERMISSION_DENIED"
	Unauthenticated  Reason = "UNAUTHENTICATED"
	Compacted        Reason = "COMPACTED"
	MemberRemoved    Reason = "MEMBER_REMOVED"
	// VoterChangeTooSoon: a voter change inside the spacing of voter
	// changes after the previous one.
	VoterChangeTooSoon Reason = "VOTER_CHANGE_TOO_SOON"
	// PolicyNotSeeded: the cluster has no policy yet.
	PolicyNotSeeded Reason = "POLICY_NOT_SEEDED"
	// LeaseNotGranted: this coordinator grants no lease now (not a voter,
	// starting, or its lease state cannot be saved).
	LeaseNotGranted Reason = "LEASE_NOT_GRANTED"
	// LeaseHeld: a broker whose registration is to be removed may still
	// hold a lease.
	LeaseHeld Reason = "LEASE_HELD"
)

// Info is a reason and what it means, in a sentence for people.
type Info struct {
	Reason  Reason
	Meaning string
}

// Reasons lists every reason and its meaning, in the order above: the
// reference docs/refusals.md is generated from it.
var Reasons = []Info{
	{EpochExpired, "The request carries an epoch (or stream epoch, or job token) older than the current " +
		"one."},
	{NodeFenced, "The broker was fenced by a failover decision; it must register again before it may " +
		"write."},
	{UnknownNode, "No broker is registered under that id."},
	{StreamNotClosed, "The stream is opened by another broker (or the operation needs every stream closed)."},
	{StreamNotOpened, "The stream is closed; commit needs it opened."},
	{OffsetMismatch, "A committed range does not start at the stream's end."},
	{NotOwner, "The stream is owned by another broker or another epoch of this broker. The broker's " +
		"data API adds metadata owner_addr and owner_broker_id when it knows the owner."},
	{StaleAttempt, "The request comes from an attempt of a recovery job (or an assignee) that is no " +
		"longer the current one."},
	{JobNotRunning, "The recovery job is not pending or running."},
	{RecoveryRunning, "A recovery job of the broker is pending or running; the broker may not register " +
		"until it ends."},
	{StreamNotFound, "No stream has that id."},
	{JobNotFound, "No recovery job has that id (for that broker)."},
	{Maintenance, "The broker is in maintenance; only a manual failover may fence it."},
	{InvalidArgument, "The command is malformed (a missing id, an unknown state or key); the message names " +
		"the field."},
	{LeaseNotExpired, "A failover decision without attestations from a majority of the voters that their " +
		"lease grant of the epoch expired."},
	{DecidedInAnotherTerm, "An entry whose validity rests on the deciding leader's timers was appended in " +
		"another raft term than it was decided in (a deposed leader's decision reached the " +
		"new leader)."},
	{StaleObservation, "An observation meant to replace one that has since been replaced (a late or repeated " +
		"proposal)."},
	{FailoverRequested, "An operator requested the broker's failover; its lease is not renewed any more."},
	{LeaseAttested, "This coordinator attested that its grant of the epoch expired and grants it no more " +
		"until it withdraws the attestation."},
	{RestoreReconciling, "The cluster was restored from a backup and is reconciling its catalog with the objects " +
		"written to S3 and the records in the brokers' WALs after it: until it is done no broker registers and no " +
		"stream opens, so that no offset acknowledged before is issued again. Metadata phase names where it is " +
		"(waldenctl restore status)."},
	{LeaseInvalid, "The broker's agent does not confirm its lease now."},
	{NotReady, "The broker is registering or recovering."},
	{ShuttingDown, "The broker is stopping."},
	{WALFull, "The WAL has no room until the next upload trims it."},
	{OutOfOrderSequence, "An idempotent append whose sequence is neither its producer's next one nor a retry " +
		"of its last batch; metadata expected_sequence holds the next one."},
	{UnknownProducer, "An idempotent append with a sequence other than 0 from a producer the stream does " +
		"not know; the producer starts again with a new producer id."},
	{ObjectMissing, "A read reached a committed range that no object in the object store backs (the object " +
		"is not there, or the catalog's objects leave a hole): its records cannot be read. Metadata stream_id, " +
		"start_offset and end_offset name the range, object_id and key its object."},
	{NotLeader, "The member is not the leader; metadata leader_id and leader_addr name the leader."},
	{NoLeader, "The cluster has no leader now (an election, or no quorum)."},
	{Stopping, "The member is stopping."},
	{MemberNotFound, "No member has that id."},
	{MemberExists, "A member with that id is already in the cluster."},
	{InvalidMember, "The member's id or addresses are malformed."},
	{NotVoter, "The operation needs a voter."},
	{LastVoter, "The operation would leave the cluster without a voter."},
	{ProposalDropped, "Raft dropped the proposal (a leadership change); retrying is safe."},
	{PermissionDenied, "The caller's role may not make this call; metadata method, identity and role say who " +
		"asked for what."},
	{Unauthenticated, "The caller presented no verified certificate."},
	{Compacted, "A watch from a revision the member no longer keeps; metadata compact_revision names " +
		"the oldest it has."},
	{MemberRemoved, "A raft peer refuses the messages of a member whose removal from the cluster it has " +
		"applied; metadata member and removed_index name the member and the raft entry that removed it. " +
		"The member stops, unless it has applied that entry itself (then its own configuration decides)."},
	{VoterChangeTooSoon, "A voter change (a promotion, the removal of a voter) less than the cluster's longest " +
		"lease_ttl + drift_margin after the previous one, while a broker lease granted under the configuration " +
		"before it may still run; metadata wait_ms and left_ms say the spacing and when to try again."},
	{PolicyNotSeeded, "The cluster's policy is not seeded yet: no leader has been elected since the cluster was " +
		"founded. No lease is granted and the policy can be neither read nor set until one is; retrying is safe."},
	{LeaseNotGranted, "This coordinator grants no lease now: it is not a voter, it started less than a lease ago and " +
		"waits out the leases it may have granted before it stopped, or it cannot save its lease state. Metadata cause " +
		"says which (not_voter, starting, store); with starting, retry_after_ms says in how many milliseconds the " +
		"coordinator grants again, and the agent asks it again then rather than on its backoff. The agent holds its " +
		"lease through the other voters meanwhile; retrying is safe."},
	{LeaseHeld, "The broker's registration is not removed: it holds a lease, or may still renew one (it registered or " +
		"renewed within lease_ttl + drift_margin). Stop its agent, or fail it over, first."},
}

// Error is a refusal: a reason and a message for people. Wrap it with
// fmt.Errorf("...: %w", err) to say more; errors.Is matches the sentinel
// through any wrapping, and Of reads the reason back.
type Error struct {
	reason Reason
	msg    string
}

// New returns a refusal with the given reason and message.
func New(reason Reason, msg string) *Error { return &Error{reason: reason, msg: msg} }

// Error returns the refusal's message.
func (e *Error) Error() string { return e.msg }

// Reason is the refusal's machine-readable reason.
func (e *Error) Reason() Reason { return e.reason }

// The sentinels of the replicated state's refusals.
var (
	ErrEpochExpired         = New(EpochExpired, "epoch expired")
	ErrNodeFenced           = New(NodeFenced, "node fenced")
	ErrUnknownNode          = New(UnknownNode, "unknown node")
	ErrStreamNotClosed      = New(StreamNotClosed, "stream not closed")
	ErrStreamNotOpened      = New(StreamNotOpened, "stream not opened")
	ErrOffsetMismatch       = New(OffsetMismatch, "offset mismatch")
	ErrNotOwner             = New(NotOwner, "not owner")
	ErrStaleAttempt         = New(StaleAttempt, "stale attempt")
	ErrJobNotRunning        = New(JobNotRunning, "job not running")
	ErrRecoveryRunning      = New(RecoveryRunning, "recovery running")
	ErrUnknownStream        = New(StreamNotFound, "stream not found")
	ErrUnknownJob           = New(JobNotFound, "job not found")
	ErrMaintenance          = New(Maintenance, "broker in maintenance")
	ErrInvalidArgument      = New(InvalidArgument, "invalid argument")
	ErrLeaseNotExpired      = New(LeaseNotExpired, "lease not expired on a majority of coordinators")
	ErrDecidedInAnotherTerm = New(DecidedInAnotherTerm, "decided in another term")
	ErrStaleObservation     = New(StaleObservation, "stale observation")
	ErrFailoverRequested    = New(FailoverRequested, "failover requested")
	ErrLeaseAttested        = New(LeaseAttested, "lease attested expired")
	ErrRestoreReconciling   = New(RestoreReconciling, "restore reconciling")
)

var sentinels = []*Error{
	ErrEpochExpired, ErrNodeFenced, ErrUnknownNode, ErrStreamNotClosed, ErrStreamNotOpened,
	ErrOffsetMismatch, ErrNotOwner, ErrStaleAttempt, ErrJobNotRunning, ErrRecoveryRunning,
	ErrUnknownStream, ErrUnknownJob, ErrMaintenance, ErrInvalidArgument,
	ErrLeaseNotExpired, ErrDecidedInAnotherTerm, ErrStaleObservation, ErrFailoverRequested, ErrLeaseAttested,
	ErrRestoreReconciling,
}

// ErrPolicyNotSeeded is the refusal of everything that needs the cluster's
// policy before a leader has seeded it: a lease renewal, reading or setting
// the policy. It is a refusal of the cluster, not of the replicated
// state's commands (Sentinel does not return it).
var ErrPolicyNotSeeded = New(PolicyNotSeeded, "the cluster's policy is not seeded yet: no leader has been elected "+
	"since the cluster was founded")

// Of returns the reason of the refusal err wraps, or "" when it wraps none.
func Of(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.reason
	}
	return ""
}

// Sentinel returns the sentinel of the replicated state's refusals with
// the given reason, or nil (a reason of another API, or an unknown one).
func Sentinel(reason Reason) error {
	for _, e := range sentinels {
		if e.reason == reason {
			return e
		}
	}
	return nil
}

// metadataError attaches key/value metadata to a refusal.
type metadataError struct {
	err error
	md  map[string]string
}

func (e *metadataError) Error() string { return e.err.Error() }
func (e *metadataError) Unwrap() error { return e.err }

// WithMetadata wraps err with key/value metadata for programs (e.g. the
// owner of a stream for NOT_OWNER); a transport carries it beside the
// reason (rpcerr puts it in the ErrorInfo detail).
func WithMetadata(err error, md map[string]string) error {
	if err == nil || len(md) == 0 {
		return err
	}
	return &metadataError{err: err, md: maps.Clone(md)}
}

// Metadata returns the metadata the outermost WithMetadata in err's chain
// attached, or nil.
func Metadata(err error) map[string]string {
	var m *metadataError
	if errors.As(err, &m) {
		return maps.Clone(m.md)
	}
	return nil
}
