package fsm_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"

	waldenv1 "walden/proto/walden/v1"
)

// TestEventsCarryTheirFields: every event the state machine makes carries
// its typed fields (broker, epoch, member, the broker's and the job's
// state before and after, the step, durations), and its message is
// rendered from them in the sentences an older walden wrote.
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

	var got []string
	for _, e := range domainSnapshot(t, h.s).GetEvents() {
		// prototext varies its spaces: without them, for comparison.
		d := strings.ReplaceAll(strings.Join(strings.Fields(prototext.Format(e.GetDetail())), " "), ": ", ":")
		got = append(got, fmt.Sprintf("%s %s | %s | %s", e.GetEventKind().Name(), e.GetBrokerId(), e.GetMessage(), d))
	}
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
	}
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}
