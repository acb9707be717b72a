package fsm_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// jobHarness returns a harness with broker b1 failed over: job-b1-2,
// attempt 1, assigned to c1, pending.
func jobHarness(t *testing.T) (*harness, string) {
	h := newHarness(t)
	h.register("b1")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: 1, StreamId: 1})
	d := h.ok(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: 1, LiveMembers: []string{"c1"}}).GetDeclareFailed()
	return h, d.GetJobId()
}

func TestJobCommandsRefused(t *testing.T) {
	cases := []struct {
		name  string
		setup func(h *harness, id string)
		op    func(id string) any
		want  error
	}{
		{"renew unknown job", nil, func(string) any { return &waldenv1.RenewJobLease{JobId: "nope", Attempt: 1, AssigneeId: "c1"} }, refusal.ErrUnknownJob},
		{"renew stale attempt", nil, func(id string) any { return &waldenv1.RenewJobLease{JobId: id, Attempt: 2, AssigneeId: "c1"} }, refusal.ErrStaleAttempt},
		{"renew by another member", nil, func(id string) any { return &waldenv1.RenewJobLease{JobId: id, Attempt: 1, AssigneeId: "c2"} }, refusal.ErrStaleAttempt},
		{"renew without assignee", func(h *harness, id string) {
			h.ok(&waldenv1.ReassignJob{JobId: id, Attempt: 1, LiveMembers: []string{"c9"}})
		}, func(id string) any { return &waldenv1.RenewJobLease{JobId: id, Attempt: 2} }, refusal.ErrInvalidArgument},
		{"renew cancelled", cancelJob, func(id string) any { return &waldenv1.RenewJobLease{JobId: id, Attempt: 1, AssigneeId: "c1"} }, refusal.ErrJobNotRunning},
		{"reassign unknown", nil, func(string) any { return &waldenv1.ReassignJob{JobId: "nope", Attempt: 1} }, refusal.ErrUnknownJob},
		{"reassign stale", nil, func(id string) any { return &waldenv1.ReassignJob{JobId: id, Attempt: 0} }, refusal.ErrStaleAttempt},
		{"reassign cancelled", cancelJob, func(id string) any { return &waldenv1.ReassignJob{JobId: id, Attempt: 1} }, refusal.ErrJobNotRunning},
		{"checkpoint unknown", nil, func(string) any { return &waldenv1.CheckpointJob{JobId: "nope", Attempt: 1} }, refusal.ErrUnknownJob},
		{"checkpoint stale", nil, func(id string) any {
			return &waldenv1.CheckpointJob{JobId: id, Attempt: 3, JobStep: waldenv1.JobStep_JOB_STEP_READ}
		}, refusal.ErrStaleAttempt},
		{"checkpoint unknown step", nil, func(id string) any {
			return &waldenv1.CheckpointJob{JobId: id, Attempt: 1, JobStep: waldenv1.JobStep(99)}
		}, refusal.ErrInvalidArgument},
		{"checkpoint done without step", nil, func(id string) any { return &waldenv1.CheckpointJob{JobId: id, Attempt: 1, StepDone: true} }, refusal.ErrInvalidArgument},
		{"checkpoint cancelled", cancelJob, func(id string) any {
			return &waldenv1.CheckpointJob{JobId: id, Attempt: 1, JobStep: waldenv1.JobStep_JOB_STEP_READ}
		}, refusal.ErrJobNotRunning},
		{"finish unknown", nil, func(string) any {
			return &waldenv1.FinishJob{JobId: "nope", Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_FAILED}
		}, refusal.ErrUnknownJob},
		{"finish stale", nil, func(id string) any {
			return &waldenv1.FinishJob{JobId: id, Attempt: 2, JobState: waldenv1.JobState_JOB_STATE_FAILED}
		}, refusal.ErrStaleAttempt},
		{"finish bad state", nil, func(id string) any {
			return &waldenv1.FinishJob{JobId: id, Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_CANCELLED}
		}, refusal.ErrInvalidArgument},
		{"finish with opened streams", nil, func(id string) any {
			return &waldenv1.FinishJob{JobId: id, Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED}
		}, refusal.ErrStreamNotClosed},
		{"cancel unknown", nil, func(string) any { return &waldenv1.CancelJob{JobId: "nope"} }, refusal.ErrUnknownJob},
		{"cancel twice", cancelJob, func(id string) any { return &waldenv1.CancelJob{JobId: id} }, refusal.ErrJobNotRunning},
		{"retry unknown", nil, func(string) any { return &waldenv1.RetryJob{JobId: "nope"} }, refusal.ErrUnknownJob},
		{"retry pending", nil, func(id string) any { return &waldenv1.RetryJob{JobId: id} }, refusal.ErrRecoveryRunning},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, id := jobHarness(t)
			if c.setup != nil {
				c.setup(h, id)
			}
			h.refuse(c.op(id), c.want)
		})
	}
}

func cancelJob(h *harness, id string) { h.ok(&waldenv1.CancelJob{JobId: id, Actor: "operator"}) }

func TestJobProgress(t *testing.T) {
	h, id := jobHarness(t)
	h.nowMs += 100
	j := h.ok(&waldenv1.CheckpointJob{JobId: id, Attempt: 1, JobStep: waldenv1.JobStep_JOB_STEP_UPLOAD, BytesTotal: 1000, BytesUploaded: 100,
		StreamsTotal: 1, SkippedBytes: 4096, Gaps: []string{"stream 1: gap at 10"}, Error: "s3: 503", RecordsUploaded: 3}).GetJob()
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_RUNNING || j.GetJobStep() != waldenv1.JobStep_JOB_STEP_UPLOAD || j.GetBytesTotal() != 1000 || j.GetBytesUploaded() != 100 ||
		j.GetSkippedBytes() != 4096 || len(j.GetGaps()) != 1 || j.GetError() != "s3: 503" || len(j.GetCheckpoints()) != 0 {
		t.Fatalf("after checkpoint = %v", j)
	}
	if b := h.broker("b1"); b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_RECOVERING {
		t.Fatalf("broker state = %q", b.GetBrokerState().Name())
	}
	j = h.ok(&waldenv1.CheckpointJob{JobId: id, Attempt: 1, JobStep: waldenv1.JobStep_JOB_STEP_UPLOAD, BytesUploaded: 1000, StepDone: true, Detail: "3 objects"}).GetJob()
	if j.GetBytesUploaded() != 1000 || j.GetBytesTotal() != 1000 || j.GetError() != "" || j.GetJobStep() != waldenv1.JobStep_JOB_STEP_COMMIT ||
		len(j.GetCheckpoints()) != 1 || j.GetCheckpoints()[0].GetDetail() != "3 objects" || j.GetCheckpoints()[0].GetIndex() != h.index {
		t.Fatalf("after step done = %v", j)
	}
	if got := h.s.Jobs("b1", waldenv1.JobState_JOB_STATE_RUNNING); len(got) != 1 || h.s.ActiveJobs() != 1 || len(h.s.Jobs("", waldenv1.JobState_JOB_STATE_PENDING)) != 0 {
		t.Fatalf("Jobs = %v, active %d", got, h.s.ActiveJobs())
	}
}

// TestAssigneeBalance checks that new jobs go to the live member with the
// fewest pending or running jobs, ties to the smallest id.
func TestAssigneeBalance(t *testing.T) {
	h := newHarness(t)
	var got []string
	for i, b := range []string{"b1", "b2", "b3", "b4", "b5"} {
		e := h.register(b)
		live := []string{"c3", "c2", "c1", "c2"}
		if i == 4 {
			live = []string{"c2", "c3"}
		}
		d := h.ok(&waldenv1.DeclareFailed{BrokerId: b, Epoch: e, LiveMembers: live}).GetDeclareFailed()
		got = append(got, h.job(d.GetJobId()).GetAssigneeId())
	}
	want := []string{"c1", "c2", "c3", "c1", "c2"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("assignees = %v, want %v", got, want)
		}
	}
	// A finished job no longer counts.
	j := h.s.Jobs("b1", waldenv1.JobState_JOB_STATE_UNSPECIFIED)[0]
	h.ok(&waldenv1.FinishJob{JobId: j.GetJobId(), Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_FAILED, Error: "attach: no such volume"})
	e := h.register("b6")
	d := h.ok(&waldenv1.DeclareFailed{BrokerId: "b6", Epoch: e, LiveMembers: []string{"c1", "c2", "c3"}}).GetDeclareFailed()
	// Loads are now c1: 1 (b4), c2: 2 (b2, b5), c3: 1 (b3): c1 and c3 tie.
	if a := h.job(d.GetJobId()).GetAssigneeId(); a != "c1" {
		t.Fatalf("assignee after c1's first job failed = %q, want c1", a)
	}
	if jobs := h.s.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED); len(jobs) != 6 || jobs[0].GetBrokerId() != "b1" || jobs[5].GetBrokerId() != "b6" {
		t.Fatalf("Jobs not in token order: %v", jobs)
	}
}

// TestJobKeepsTheTargetsTerms: a job copies the broker's AutoMQ node when
// it is created, a checkpoint's target report replaces the job's, and an
// oversized report is refused without changing the job.
func TestJobKeepsTheTargetsTerms(t *testing.T) {
	h := newHarness(t)
	e := h.ok(&waldenv1.RegisterBroker{BrokerId: "b1", Wal: &waldenv1.WalLocation{Path: "/wal"},
		Automq: &waldenv1.AutomqNode{NodeId: 3, NodeEpoch: 1733}}).GetRegisterBroker().GetEpoch()
	d := h.ok(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: e, LiveMembers: []string{"c1"}}).GetDeclareFailed()
	j := h.job(d.GetJobId())
	if j.GetAutomq().GetNodeId() != 3 || j.GetAutomq().GetNodeEpoch() != 1733 {
		t.Fatalf("job's AutoMQ node %v, want node 3 epoch 1733", j.GetAutomq())
	}
	rep := &waldenv1.TargetReport{Target: "automq", NodeId: 3, NodeEpoch: 1800, Fenced: true,
		Streams: []*waldenv1.TargetStream{{StreamId: 7, StreamEpoch: 2, EndOffsetBefore: 10, EndOffsetAfter: 15, Records: 2, Closed: true}},
		Objects: []*waldenv1.TargetObject{{ObjectId: 42, Key: "24000000/_kafka_c/42", Size: 200, Kind: "stream_set", State: "committed"}}}
	h.ok(&waldenv1.CheckpointJob{JobId: j.GetJobId(), Attempt: 1, JobStep: waldenv1.JobStep_JOB_STEP_COMMIT, TargetReport: rep})
	if got := h.job(j.GetJobId()).GetTargetReport(); !proto.Equal(got, rep) {
		t.Fatalf("target report %v, want %v", got, rep)
	}
	// A checkpoint without a report leaves it as it is.
	h.ok(&waldenv1.CheckpointJob{JobId: j.GetJobId(), Attempt: 1, BytesUploaded: 5})
	if got := h.job(j.GetJobId()).GetTargetReport(); !proto.Equal(got, rep) {
		t.Fatalf("a checkpoint without a report changed it: %v", got)
	}
	big := &waldenv1.TargetReport{Target: "automq", Streams: make([]*waldenv1.TargetStream, fsm.MaxTargetReportItems+1)}
	for i := range big.Streams {
		big.Streams[i] = &waldenv1.TargetStream{StreamId: int64(i)}
	}
	h.refuse(&waldenv1.CheckpointJob{JobId: j.GetJobId(), Attempt: 1, TargetReport: big}, refusal.ErrInvalidArgument)
	if got := h.job(j.GetJobId()).GetTargetReport(); !proto.Equal(got, rep) {
		t.Fatalf("a refused report changed the job's: %d streams", len(got.GetStreams()))
	}
}
