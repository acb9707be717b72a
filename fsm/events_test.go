package fsm_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/prototext"

	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// TestEventsCarryTheirFields: every event the state machine makes carries
// its typed fields (broker, epoch, member, the broker's and the job's
// state before and after, the step, durations, the policy keys changed,
// what a forced new cluster may have lost), and so do the leader's
// freeze, unfreeze and cooldown events; the message is rendered from them
// in the sentences an older walden wrote (the leader's message replaced by
// the one its fields render).
func TestEventsCarryTheirFields(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	h.register("b2")
	h.ok(&waldenv1.ObserveBroker{BrokerId: "b1", Epoch: 1, ObserverId: "c2", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, Reason: "probe timeout"})
	h.ok(&waldenv1.ObserveBroker{BrokerId: "b1", Epoch: 1, ObserverId: "c2", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT,
		LeaseExpired: true, ExpectedIndex: h.index})
	h.ok(&waldenv1.ObserveBroker{BrokerId: "b1", Epoch: 1, ObserverId: "c2", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD,
		LeaseExpired: true, ExpectedIndex: h.index})
	h.ok(&waldenv1.RequestFailover{BrokerId: "b1", Epoch: 1, Reason: "disk slow", Actor: "alice"})
	id := h.declare("b1").GetJobId()
	h.ok(&waldenv1.RenewJobLease{JobId: id, Attempt: 1, AssigneeId: h.job(id).GetAssigneeId()})
	h.ok(&waldenv1.ReassignJob{JobId: id, Attempt: 1, LiveMembers: []string{"c2"}, Reason: "job lease expired"})
	h.ok(&waldenv1.BlockJob{JobId: id, Attempt: 2, JobStep: waldenv1.JobStep_JOB_STEP_ATTACH, Error: "volume busy", FailingMs: 600_000})
	h.ok(&waldenv1.ResolveJob{JobId: id, Reason: "host lost", WalLost: true, LiveMembers: []string{"c3"}, Actor: "alice"})
	h.ok(&waldenv1.FinishJob{JobId: id, Attempt: 3, JobState: waldenv1.JobState_JOB_STATE_FAILED, Error: "s3: access denied"})
	h.ok(&waldenv1.RetryJob{JobId: id, LiveMembers: []string{"c1"}, Actor: "alice"})
	h.ok(&waldenv1.CancelJob{JobId: id, Actor: "alice"})
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b2", On: true, TtlMs: 90_000, Reason: "kernel upgrade", Actor: "alice"})
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b2", Reason: "done", Actor: "alice"})
	h.ok(&waldenv1.AckBroker{BrokerId: "b2", Actor: "alice"})
	h.ok(&waldenv1.RemoveBroker{BrokerId: "b2", Actor: "alice"})
	h.ok(&waldenv1.SeedPolicy{Policy: policy.Defaults(), SeededBy: "c1"})
	h.ok(&waldenv1.SetPolicy{Set: map[string]string{"dry_run": "true", "cooldown": "600s"}, Unset: []string{"max_concurrent_recoveries"}, Actor: "alice"})
	h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_FREEZE,
		Detail: &waldenv1.EventDetail{Suspected: 3, Eligible: 4, MaxFailedFraction: 0.5}}})
	h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_UNFREEZE,
		Detail: &waldenv1.EventDetail{Suspected: 1, Eligible: 4, MaxFailedFraction: 0.5, ResumeFraction: 0.5, DurationMs: 20_000}}})
	h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_COOLDOWN, BrokerId: "b1", Message: "not rendered from the fields",
		Detail: &waldenv1.EventDetail{Epoch: 3, DurationMs: 90_500, CooldownMs: 600_000}}})
	h.register("b3")
	h.ok(&waldenv1.ForceNewCluster{NodeId: "c3", LastIndex: 40, CommitIndex: 39, Term: 4, EpochBump: 1000, Removed: []string{"c1", "c2"}})

	got := eventLines(domainSnapshot(t, h.s).GetEvents())
	want := []string{
		`register b1 | registered with epoch 1 | epoch:1 to_state:BROKER_STATE_ALIVE`,
		`register b2 | registered with epoch 2 | epoch:2 to_state:BROKER_STATE_ALIVE`,
		`observation b1 | c2 observes suspect: probe timeout | epoch:1 member:"c2" from_state:BROKER_STATE_ALIVE to_state:BROKER_STATE_SUSPECT observation_state:OBSERVATION_STATE_SUSPECT reason:"probe timeout"`,
		`lease b1 | c2 attests its lease grant of epoch 1 expired and grants it no more | epoch:1 member:"c2" from_state:BROKER_STATE_SUSPECT to_state:BROKER_STATE_SUSPECT observation_state:OBSERVATION_STATE_SUSPECT from_observation_state:OBSERVATION_STATE_SUSPECT lease_expired:true`,
		`observation b1 | c2 observes dead, lease expired | epoch:1 member:"c2" from_state:BROKER_STATE_SUSPECT to_state:BROKER_STATE_SUSPECT observation_state:OBSERVATION_STATE_DEAD from_observation_state:OBSERVATION_STATE_SUSPECT lease_expired:true`,
		`failover_requested b1 | manual failover of epoch 1 requested: coordinators stop renewing its lease and it is fenced once a majority attest the lease expired: disk slow | epoch:1 from_state:BROKER_STATE_SUSPECT to_state:BROKER_STATE_SUSPECT reason:"disk slow"`,
		`decision b1 | declared failed: epoch 1 fenced, new epoch 3; job job-b1-3 assigned to "c1": test | epoch:1 new_epoch:3 member:"c1" from_state:BROKER_STATE_SUSPECT to_state:BROKER_STATE_FAILED attempt:1 job_state:JOB_STATE_PENDING reason:"test"`,
		`job b1 | attempt 1 running on c1 | epoch:3 member:"c1" from_state:BROKER_STATE_FAILED to_state:BROKER_STATE_RECOVERING attempt:1 job_state:JOB_STATE_RUNNING from_job_state:JOB_STATE_PENDING`,
		`job b1 | attempt 2 reassigned from "c1" to "c2": job lease expired | epoch:3 member:"c2" from_member:"c1" from_state:BROKER_STATE_RECOVERING to_state:BROKER_STATE_RECOVERING attempt:2 job_state:JOB_STATE_PENDING from_job_state:JOB_STATE_RUNNING reason:"job lease expired"`,
		`job b1 | attempt 2 blocked at attach after failing for 600.0s: volume busy | epoch:3 member:"c2" from_state:BROKER_STATE_RECOVERING to_state:BROKER_STATE_FAILED attempt:2 job_state:JOB_STATE_BLOCKED from_job_state:JOB_STATE_PENDING job_step:JOB_STEP_ATTACH duration_ms:600000 reason:"volume busy"`,
		`job b1 | resolved with the WAL declared lost (what it held beyond the catalog is lost): host lost; attempt 3 on "c3" | epoch:3 member:"c3" from_member:"c2" from_state:BROKER_STATE_FAILED to_state:BROKER_STATE_RECOVERING attempt:3 job_state:JOB_STATE_PENDING from_job_state:JOB_STATE_BLOCKED reason:"host lost" wal_lost:true`,
		`job b1 | attempt 3 failed: s3: access denied | epoch:3 member:"c3" from_state:BROKER_STATE_RECOVERING to_state:BROKER_STATE_FAILED attempt:3 job_state:JOB_STATE_FAILED from_job_state:JOB_STATE_PENDING reason:"s3:access denied"`,
		`job b1 | retried as attempt 4 on "c1" | epoch:3 member:"c1" from_member:"c3" from_state:BROKER_STATE_FAILED to_state:BROKER_STATE_RECOVERING attempt:4 job_state:JOB_STATE_PENDING from_job_state:JOB_STATE_FAILED`,
		`job b1 | attempt 4 cancelled | epoch:3 member:"c1" from_state:BROKER_STATE_RECOVERING to_state:BROKER_STATE_FAILED attempt:4 job_state:JOB_STATE_CANCELLED from_job_state:JOB_STATE_PENDING`,
		`maintenance b2 | maintenance on for 1m30s: kernel upgrade | epoch:2 from_state:BROKER_STATE_ALIVE to_state:BROKER_STATE_MAINTENANCE duration_ms:90000 maintenance:true reason:"kernel upgrade"`,
		`maintenance b2 | maintenance off: done | epoch:2 from_state:BROKER_STATE_MAINTENANCE to_state:BROKER_STATE_ALIVE reason:"done"`,
		`ack b2 | cooldown block cleared | epoch:2 from_state:BROKER_STATE_ALIVE to_state:BROKER_STATE_ALIVE`,
		`remove b2 | registration removed at epoch 2 | epoch:2 from_state:BROKER_STATE_ALIVE`,
		`policy  | policy seeded from the config file of c1 | member:"c1" policy_seeded:true`,
		`policy  | cooldown=10m, dry_run=true, unset max_concurrent_recoveries | policy_set:{key:"cooldown" value:"10m"} policy_set:{key:"dry_run" value:"true"} policy_unset:"max_concurrent_recoveries"`,
		`freeze  | automatic failover frozen: 3 of 4 brokers suspected by a quorum, more than max_failed_fraction 0.5 (a partition of the coordinators is more likely than a mass death) | suspected:3 eligible:4 max_failed_fraction:0.5`,
		`unfreeze  | automatic failover resumed: 1 of 4 brokers suspected, at most 50% of max_failed_fraction for 20s | duration_ms:20000 suspected:1 eligible:4 max_failed_fraction:0.5 resume_fraction:0.5`,
		"cooldown b1 | broker b1 looks failed again 1m30.5s after its recovery, within cooldown 10m0s: automatic failover waits for `waldenctl ack b1` | epoch:3 duration_ms:90500 cooldown_ms:600000",
		`register b3 | registered with epoch 4 | epoch:4 to_state:BROKER_STATE_ALIVE`,
		`force_new_cluster  | c3 was made the only voter after a lost quorum (removed: c1, c2); its log ended at index 40 (term 4, committed 39): whatever the lost members committed beyond it is lost; 1 broker epoch(s) revoked (they register again), fencing tokens and stream epochs moved 1000 past what this log issued (next token 1005) | member:"c3" force_new_cluster:{removed:"c1" removed:"c2" last_index:40 term:4 commit_index:39 brokers_fenced:1 epoch_bump:1000 next_epoch:1005}`,
	}
	compareEventLines(t, got, want)
}

// eventLines are events as "kind broker | message | detail" lines.
func eventLines(events []*waldenv1.Event) []string {
	var out []string
	for _, e := range events {
		// prototext varies its spaces: without them, for comparison.
		d := strings.NewReplacer(": ", ":", "{ ", "{", " }", "}").Replace(strings.Join(strings.Fields(prototext.Format(e.GetDetail())), " "))
		out = append(out, fmt.Sprintf("%s %s | %s | %s", e.GetEventKind().Name(), e.GetBrokerId(), e.GetMessage(), d))
	}
	return out
}

// compareEventLines fails t unless the event lines got are want.
func compareEventLines(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

// TestEventDurationsPrintAsTime: a duration in an event's message prints
// as package time prints it, as the leader's messages did before they were
// rendered from the fields.
func TestEventDurationsPrintAsTime(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	for _, ms := range []int64{0, 1, 999, 1000, 1001, 1500, 1050, 59_999, 60_000, 90_500, 3_600_000, 3_661_001, 90_000_000, -1500, -500} {
		e := h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_COOLDOWN, BrokerId: "b1",
			Detail: &waldenv1.EventDetail{DurationMs: ms, CooldownMs: ms}}}).GetEvent()
		d := time.Duration(ms) * time.Millisecond
		want := fmt.Sprintf("broker b1 looks failed again %s after its recovery, within cooldown %s: automatic failover waits for `waldenctl ack b1`", d, d)
		if e.GetMessage() != want {
			t.Errorf("%d ms:\n got %s\nwant %s", ms, e.GetMessage(), want)
		}
	}
}

// restoreEventLines are the event lines of the restore events of s.
func restoreEventLines(h *harness) []string {
	var out []*waldenv1.Event
	for _, e := range h.s.Events("", 0) {
		if e.GetEventKind() == waldenv1.EventKind_EVENT_KIND_RESTORE {
			out = append(out, e)
		}
	}
	return eventLines(out)
}
