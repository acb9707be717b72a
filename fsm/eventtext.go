package fsm

import (
	"fmt"
	"strings"

	waldenv1 "walden/proto/walden/v1"
)

// eventMessage renders the message of event e from its kind, its job and
// its typed fields (e.detail): the one place where the sentences of the
// event log are written. A reader takes the fields, never the sentence.
// The sentences are those an older walden wrote, so that a member of
// either walden shows the same log during a rolling upgrade.
func eventMessage(e *waldenv1.Event) string {
	d := e.GetDetail()
	switch e.GetEventKind() {
	case waldenv1.EventKind_EVENT_KIND_REGISTER:
		return fmt.Sprintf("registered with epoch %d", d.GetEpoch())
	case waldenv1.EventKind_EVENT_KIND_OBSERVATION:
		what := d.GetObservationState().Name()
		if d.GetLeaseExpired() {
			what += ", lease expired"
		}
		return withReason(fmt.Sprintf("%s observes %s", d.GetMember(), what), d.GetReason())
	case waldenv1.EventKind_EVENT_KIND_LEASE:
		if d.GetLeaseExpired() {
			return withReason(fmt.Sprintf("%s attests its lease grant of epoch %d expired and grants it no more", d.GetMember(), d.GetEpoch()), d.GetReason())
		}
		return withReason(fmt.Sprintf("%s withdraws its attestation for epoch %d: the broker renews with it again", d.GetMember(), d.GetEpoch()), d.GetReason())
	case waldenv1.EventKind_EVENT_KIND_DRY_RUN:
		return withReason(fmt.Sprintf("dry run: would fence epoch %d", d.GetEpoch()), d.GetReason())
	case waldenv1.EventKind_EVENT_KIND_DECISION:
		msg := fmt.Sprintf("declared failed: epoch %d fenced, new epoch %d; job %s assigned to %q", d.GetEpoch(), d.GetNewEpoch(), e.GetJobId(), d.GetMember())
		if never := d.GetNeverGrantedBy(); len(never) > 0 {
			msg += fmt.Sprintf("; the job reads no WAL: a majority of the voters (%s) never granted epoch %d a lease, so the broker "+
				"acknowledged nothing under it, and its earlier epochs were recovered before it registered", strings.Join(never, ", "), d.GetEpoch())
		}
		return withReason(msg, d.GetReason())
	case waldenv1.EventKind_EVENT_KIND_FAILOVER_REQUESTED:
		return withReason(fmt.Sprintf("manual failover of epoch %d requested: coordinators stop renewing its lease and it is fenced "+
			"once a majority attest the lease expired", d.GetEpoch()), d.GetReason())
	case waldenv1.EventKind_EVENT_KIND_ACK:
		return "cooldown block cleared"
	case waldenv1.EventKind_EVENT_KIND_MAINTENANCE:
		msg := "maintenance off"
		switch {
		case d.GetMaintenance() && d.GetDurationMs() > 0:
			msg = "maintenance on for " + msText(d.GetDurationMs())
		case d.GetMaintenance():
			msg = "maintenance on"
		}
		return withReason(msg, d.GetReason())
	case waldenv1.EventKind_EVENT_KIND_REMOVE:
		return fmt.Sprintf("registration removed at epoch %d", d.GetEpoch())
	case waldenv1.EventKind_EVENT_KIND_JOB:
		return jobMessage(d)
	}
	return ""
}

// jobMessage renders the message of a job event: what became of the
// attempt, told by the job states before and after it.
func jobMessage(d *waldenv1.EventDetail) string {
	switch d.GetJobState() {
	case waldenv1.JobState_JOB_STATE_RUNNING:
		return fmt.Sprintf("attempt %d running on %s", d.GetAttempt(), d.GetMember())
	case waldenv1.JobState_JOB_STATE_SUCCEEDED, waldenv1.JobState_JOB_STATE_FAILED:
		return withReason(fmt.Sprintf("attempt %d %s", d.GetAttempt(), d.GetJobState().Name()), d.GetReason())
	case waldenv1.JobState_JOB_STATE_CANCELLED:
		return fmt.Sprintf("attempt %d cancelled", d.GetAttempt())
	case waldenv1.JobState_JOB_STATE_BLOCKED:
		return fmt.Sprintf("attempt %d blocked at %s after failing for %.1fs: %s",
			d.GetAttempt(), d.GetJobStep().Name(), float64(d.GetDurationMs())/1000, d.GetReason())
	}
	// A new attempt, pending: a reassignment of an active job, a retry or
	// an operator's resolution (which always says why) of an ended one.
	switch d.GetFromJobState() {
	case waldenv1.JobState_JOB_STATE_PENDING, waldenv1.JobState_JOB_STATE_RUNNING:
		return withReason(fmt.Sprintf("attempt %d reassigned from %q to %q", d.GetAttempt(), d.GetFromMember(), d.GetMember()), d.GetReason())
	}
	if d.GetReason() == "" {
		return fmt.Sprintf("retried as attempt %d on %q", d.GetAttempt(), d.GetMember())
	}
	what := "resolved"
	if d.GetWalLost() {
		what = "resolved with the WAL declared lost (what it held beyond the catalog is lost)"
	}
	return fmt.Sprintf("%s: %s; attempt %d on %q", what, d.GetReason(), d.GetAttempt(), d.GetMember())
}

// withReason appends ": reason" to msg when there is a reason.
func withReason(msg, reason string) string {
	if reason == "" {
		return msg
	}
	return msg + ": " + reason
}
