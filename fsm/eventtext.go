package fsm

import (
	"fmt"
	"strings"

	waldenv1 "walden/proto/walden/v1"
)

// EventMessage renders the message of event e from its kind, its job and
// its typed fields (e.detail): the one place where the sentences of the
// event log are written. A reader takes the fields, never the sentence.
// The sentences are those an older walden wrote, so that a member of
// either walden shows the same log during a rolling upgrade. The leader
// renders the events it records (freeze, unfreeze, cooldown) with it, so
// that a member of an older walden, which keeps the message it is given,
// shows the same. It is empty for a kind whose message is not rendered
// (an executor's recovery note).
func EventMessage(e *waldenv1.Event) string {
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
	return clusterMessage(e)
}

// clusterMessage renders the message of an event about the cluster rather
// than one broker's registration or job: the leader's freeze, unfreeze and
// cooldown, a policy change, a forced new cluster, a restore's phase.
func clusterMessage(e *waldenv1.Event) string {
	d := e.GetDetail()
	switch e.GetEventKind() {
	case waldenv1.EventKind_EVENT_KIND_FREEZE:
		return fmt.Sprintf("automatic failover frozen: %d of %d brokers suspected by a quorum, more than max_failed_fraction %g "+
			"(a partition of the coordinators is more likely than a mass death)", d.GetSuspected(), d.GetEligible(), d.GetMaxFailedFraction())
	case waldenv1.EventKind_EVENT_KIND_UNFREEZE:
		return fmt.Sprintf("automatic failover resumed: %d of %d brokers suspected, at most %g%% of max_failed_fraction for %s",
			d.GetSuspected(), d.GetEligible(), d.GetResumeFraction()*100, msDuration(d.GetDurationMs()))
	case waldenv1.EventKind_EVENT_KIND_COOLDOWN:
		id := e.GetBrokerId()
		return fmt.Sprintf("broker %s looks failed again %s after its recovery, within cooldown %s: automatic failover waits for `waldenctl ack %s`",
			id, msDuration(d.GetDurationMs()), msDuration(d.GetCooldownMs()), id)
	case waldenv1.EventKind_EVENT_KIND_POLICY:
		return policyMessage(d)
	case waldenv1.EventKind_EVENT_KIND_FORCE_NEW_CLUSTER:
		return forceNewClusterMessage(d)
	case waldenv1.EventKind_EVENT_KIND_RESTORE:
		return restoreMessage(d.GetRestore())
	}
	return ""
}

// msDuration is ms milliseconds as a time.Duration of them prints
// ("1m30s", "1h0m0s", "1.5s", "500ms"), written out here since the state
// machine does not import package time.
func msDuration(ms int64) string {
	if ms == 0 {
		return "0s"
	}
	sign, u := "", uint64(ms)
	if ms < 0 {
		sign, u = "-", -u
	}
	if u < 1000 {
		return fmt.Sprintf("%s%dms", sign, u)
	}
	sec, frac := u/1000, u%1000
	out := fmt.Sprint(sec % 60)
	if frac > 0 {
		out += strings.TrimRight(fmt.Sprintf(".%03d", frac), "0")
	}
	out += "s"
	if m := sec / 60; m > 0 {
		out = fmt.Sprintf("%dm", m%60) + out
		if h := m / 60; h > 0 {
			out = fmt.Sprintf("%dh", h) + out
		}
	}
	return sign + out
}

// policyMessage renders a policy event: the seed, or the keys set (k=v)
// and unset.
func policyMessage(d *waldenv1.EventDetail) string {
	if d.GetPolicySeeded() {
		return "policy seeded from the config file of " + d.GetMember()
	}
	var parts []string
	for _, kv := range d.GetPolicySet() {
		parts = append(parts, kv.GetKey()+"="+kv.GetValue())
	}
	for _, k := range d.GetPolicyUnset() {
		parts = append(parts, "unset "+k)
	}
	return strings.Join(parts, ", ")
}

// forceNewClusterMessage renders what a member made the only voter may
// have lost, and what was revoked and moved.
func forceNewClusterMessage(d *waldenv1.EventDetail) string {
	f := d.GetForceNewCluster()
	removed := "no other member"
	if len(f.GetRemoved()) > 0 {
		removed = strings.Join(f.GetRemoved(), ", ")
	}
	return fmt.Sprintf("%s was made the only voter after a lost quorum (removed: %s); its log ended at index %d (term %d, committed %d): "+
		"whatever the lost members committed beyond it is lost; %d broker epoch(s) revoked (they register again), "+
		"fencing tokens and stream epochs moved %d past what this log issued (next token %d)",
		d.GetMember(), removed, f.GetLastIndex(), f.GetTerm(), f.GetCommitIndex(), f.GetBrokersFenced(), f.GetEpochBump(), f.GetNextEpoch())
}

// restoreMessage renders a restore event by the phases the entry moved
// the reconciliation between: what the scan, the survey or the plan found,
// or that the reconciliation is done.
func restoreMessage(r *waldenv1.RestoreEvent) string {
	switch from, to := r.GetFromRestorePhase(), r.GetRestorePhase(); {
	case from == waldenv1.RestorePhase_RESTORE_PHASE_SCAN:
		msg := fmt.Sprintf("scanned %d keys under the cluster's prefix in S3", r.GetObjectsListed())
		if len(r.GetBrokersAdded()) > 0 {
			msg += fmt.Sprintf("; brokers the backup did not know wrote after it: %s", strings.Join(r.GetBrokersAdded(), ", "))
		}
		if len(r.GetAutomqNodes()) > 0 {
			msg += fmt.Sprintf("; AutoMQ nodes %s keep their streams at AutoMQ's controller: no restore job", strings.Join(r.GetAutomqNodes(), ", "))
		}
		if len(r.GetJobIds()) == 0 {
			return msg + "; no broker WAL to read: the objects are checked next"
		}
		return fmt.Sprintf("%s; restore jobs %s read the brokers' WALs", msg, strings.Join(r.GetJobIds(), ", "))
	case from == waldenv1.RestorePhase_RESTORE_PHASE_SURVEY:
		msg := fmt.Sprintf("every broker's WAL was read (%d runs of records); the objects written after the backup are checked next", r.GetRuns())
		if r.GetWalsLost() > 0 {
			msg += fmt.Sprintf(" (%d WALs declared lost by an operator)", r.GetWalsLost())
		}
		return msg
	case from == waldenv1.RestorePhase_RESTORE_PHASE_PLAN:
		return reconcilePlanText(r.GetReport(), r.GetTails())
	case to == waldenv1.RestorePhase_RESTORE_PHASE_DONE:
		return fmt.Sprintf("the restored cluster is reconciled with what was written after the backup of %q at index %d: "+
			"brokers register and streams open again", r.GetFromCluster(), r.GetFromIndex())
	}
	return ""
}

// reconcilePlanText tells what the plan committed again, which WALs hold
// the stream tails, and what it found damaged or missing.
func reconcilePlanText(rep *waldenv1.RestoreReport, tails []*waldenv1.BrokerTails) string {
	var parts []string
	for _, t := range tails {
		parts = append(parts, fmt.Sprintf("%s %d", t.GetBrokerId(), t.GetTails()))
	}
	msg := fmt.Sprintf("committed again %d objects written after the backup (%d ranges; %d streams extended); %d redundant, %d superseded, %d damaged",
		rep.GetObjectsCommitted(), rep.GetRangesCommitted(), rep.GetStreamsExtended(), rep.GetObjectsRedundant(), rep.GetObjectsSuperseded(), len(rep.GetDamaged()))
	if len(parts) > 0 {
		msg += fmt.Sprintf("; stream tails in the WALs of %s are recovered by their restore jobs", strings.Join(parts, ", "))
	} else {
		msg += "; no stream has records beyond them in a WAL"
	}
	for _, d := range rep.GetDamaged() {
		msg += fmt.Sprintf("; damaged, not committed: %s (%s)", d.GetKey(), d.GetError())
	}
	for _, g := range rep.GetGaps() {
		msg += "; " + g
	}
	return msg
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
