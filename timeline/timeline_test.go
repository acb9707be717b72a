package timeline_test

import (
	"fmt"
	"strings"
	"testing"

	waldenv1 "walden/proto/walden/v1"
	"walden/timeline"
)

const t0 = int64(1_700_000_000_000)

func job(state, step string, cps ...*waldenv1.Checkpoint) *waldenv1.Job {
	js, _ := waldenv1.Parse[waldenv1.JobState](state)
	st, _ := waldenv1.Parse[waldenv1.JobStep](step)
	return &waldenv1.Job{JobId: "job-b1-7", BrokerId: "b1", Token: 7, Attempt: 2, AssigneeId: "c3", JobState: js, JobStep: st,
		CreatedUnixMs: t0 + 5000, LeaseWaitMs: 300, StreamsTotal: 2, StreamsClosed: 2, BytesUploaded: 4096, BytesTotal: 4096,
		Objects: []string{"o1"}, Checkpoints: cps}
}

func cp(step string, attempt uint32, atMs int64) *waldenv1.Checkpoint {
	st, _ := waldenv1.Parse[waldenv1.JobStep](step)
	return &waldenv1.Checkpoint{JobStep: st, Attempt: attempt, UnixMs: t0 + atMs, Detail: step + " done"}
}

func events() []*waldenv1.Event {
	ev := &waldenv1.Evidence{DecidedBy: "c1", Reason: "", SuspectForMs: 5000, Observations: []*waldenv1.Observation{
		{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD, SinceUnixMs: t0, Reason: "probe: connection refused"},
		{ObserverId: "c2", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, SinceUnixMs: t0 + 400},
		{ObserverId: "c3", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_ALIVE, SinceUnixMs: t0 - 9000},
	}}
	return []*waldenv1.Event{
		{Index: 30, EventKind: waldenv1.EventKind_EVENT_KIND_JOB, BrokerId: "b1", JobId: "job-b1-7", Actor: "c3", Message: "attempt 2 running on c3", UnixMs: t0 + 5900},
		{Index: 20, EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", JobId: "job-b1-7", Actor: "c1", Evidence: ev, UnixMs: t0 + 5000,
			Message: `declared failed: epoch 4 fenced, new epoch 7; job job-b1-7 assigned to "c2"`},
		{Index: 21, EventKind: waldenv1.EventKind_EVENT_KIND_JOB, BrokerId: "b1", JobId: "job-b1-7", Actor: "c2", Message: "attempt 1 running on c2", UnixMs: t0 + 5100},
		{Index: 25, EventKind: waldenv1.EventKind_EVENT_KIND_JOB, BrokerId: "b1", JobId: "job-b1-7", Actor: "c1", Message: `attempt 2 reassigned from "c2" to "c3"`, UnixMs: t0 + 5800},
		{Index: 19, EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", JobId: "job-b1-3", Actor: "c1", UnixMs: t0 - 90000, Message: "declared failed: epoch 2 fenced"},
	}
}

// typedEvents are events() as this walden records them: with their typed
// fields. Their messages are dropped, so that only the fields can tell.
func typedEvents() []*waldenv1.Event {
	details := map[uint64]*waldenv1.EventDetail{
		30: {Attempt: 2, Member: "c3", JobState: waldenv1.JobState_JOB_STATE_RUNNING, FromJobState: waldenv1.JobState_JOB_STATE_PENDING},
		20: {Epoch: 4, NewEpoch: 7, Member: "c2", Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_PENDING},
		21: {Attempt: 1, Member: "c2", JobState: waldenv1.JobState_JOB_STATE_RUNNING, FromJobState: waldenv1.JobState_JOB_STATE_PENDING},
		25: {Attempt: 2, Member: "c3", FromMember: "c2", JobState: waldenv1.JobState_JOB_STATE_PENDING, FromJobState: waldenv1.JobState_JOB_STATE_RUNNING},
		19: {Epoch: 2, NewEpoch: 3},
	}
	evs := events()
	for _, e := range evs {
		e.Detail, e.Message = details[e.GetIndex()], ""
	}
	return evs
}

func phases(f *waldenv1.Failover) string {
	var out []string
	for _, p := range f.GetPhases() {
		end := "…"
		if p.GetEndUnixMs() != 0 {
			end = fmt.Sprint(p.GetEndUnixMs() - t0)
		}
		out = append(out, fmt.Sprintf("%s/%s@%d %d-%s", p.GetKind(), p.GetActor(), p.GetAttempt(), p.GetStartUnixMs()-t0, end))
	}
	return strings.Join(out, "\n")
}

// TestBuildFinishedFailover reads the events' typed fields, and the
// messages of events an older walden recorded without them.
func TestBuildFinishedFailover(t *testing.T) {
	t.Run("fields", func(t *testing.T) { testBuildFinishedFailover(t, typedEvents()) })
	t.Run("legacy messages", func(t *testing.T) { testBuildFinishedFailover(t, events()) })
}

func testBuildFinishedFailover(t *testing.T, evs []*waldenv1.Event) {
	j := job("succeeded", "done", cp("fence", 1, 5600), cp("attach", 2, 6000), cp("read", 2, 6100), cp("upload", 2, 6500),
		cp("commit", 2, 6600), cp("close", 2, 6700), cp("detach", 2, 6750))
	j.FinishedUnixMs = t0 + 6760
	j.StreamsReopened, j.FirstReopenedUnixMs, j.ReopenedUnixMs = 2, t0+6900, t0+7200
	f := timeline.Build(j, evs)
	want := strings.Join([]string{
		"observe/c1@0 0-5000",
		"observe/c2@0 400-5000",
		"decide/c1@0 5000-5000",
		"fence/c2@1 5000-5300",
		"lease_wait/c2@1 5300-5600",
		"attach/c3@2 5600-6000",
		"read/c3@2 6000-6100",
		"upload/c3@2 6100-6500",
		"commit/c3@2 6500-6600",
		"close/c3@2 6600-6700",
		"detach/c3@2 6700-6750",
		"reopen/@0 6700-7200",
	}, "\n")
	if got := phases(f); got != want {
		t.Fatalf("phases:\n%s\nwant:\n%s", got, want)
	}
	if f.GetOldEpoch() != 4 || f.GetNewEpoch() != 7 || f.GetDecidedBy() != "c1" || f.GetRecoveredBy() != "c3" ||
		strings.Join(f.GetAssignees(), ",") != "c2,c3" || f.GetFirstSuspectUnixMs() != t0 || f.GetReopenedUnixMs() != t0+7200 ||
		f.GetObjects() != 1 || f.GetAttempts() != 2 {
		t.Fatalf("summary: %v", f)
	}
	if start, end := timeline.Span(f, t0+99999); start != t0 || end != t0+7200 {
		t.Fatalf("span %d..%d", start-t0, end-t0)
	}
}

func TestBuildRunningFailover(t *testing.T) {
	j := job("running", "upload", cp("fence", 1, 5600), cp("attach", 2, 6000), cp("read", 2, 6100))
	j.Error = "upload: connection refused"
	f := timeline.Build(j, events())
	ps := f.GetPhases()
	last := ps[len(ps)-1]
	if last.GetKind() != "upload" || last.GetEndUnixMs() != 0 || last.GetStartUnixMs() != t0+6100 || !strings.Contains(last.GetDetail(), "connection refused") {
		t.Fatalf("last phase %v", last)
	}
	if d := timeline.Duration(last, t0+6600); d != 500 {
		t.Fatalf("running phase duration %d", d)
	}
	if f.GetReopenedUnixMs() != 0 {
		t.Fatal("reopened while running")
	}
}

// Without its decision in the (bounded) event log, a failover still has
// its recovery steps, timed from the job's creation.
func TestBuildWithoutDecisionEvent(t *testing.T) {
	j := job("succeeded", "done", cp("fence", 2, 5200))
	j.LeaseWaitMs = 0
	f := timeline.Build(j, nil)
	if got := phases(f); got != "decide/@0 5000-5000\nfence/c3@2 5000-5200\nreopen/@0 5200-…" {
		t.Fatalf("phases:\n%s", got)
	}
	if f.GetEvidence() != nil || f.GetOldEpoch() != 0 {
		t.Fatalf("%v", f)
	}
}

// A manual failover waits, from the request to the decision, for a
// majority of the coordinators to attest the broker's lease expired: that
// wait is its lease phase. A request of an earlier failover does not count.
func TestBuildManualFailoverLeaseWait(t *testing.T) {
	j := job("succeeded", "done", cp("fence", 1, 5100), cp("attach", 1, 5200))
	j.LeaseWaitMs = 0
	evs := events()
	evs[1].Evidence.Manual = true
	evs[4].Index = 9 // the earlier failover's decision
	evs = append(evs,
		&waldenv1.Event{Index: 5, EventKind: waldenv1.EventKind_EVENT_KIND_FAILOVER_REQUESTED, BrokerId: "b1", Actor: "alice", UnixMs: t0 - 95000},
		&waldenv1.Event{Index: 18, EventKind: waldenv1.EventKind_EVENT_KIND_FAILOVER_REQUESTED, BrokerId: "b1", Actor: "bob", UnixMs: t0 + 1500})
	f := timeline.Build(j, evs)
	var got string
	for _, p := range f.GetPhases() {
		if p.GetKind() == timeline.KindLeaseWait {
			got = fmt.Sprintf("%s %d-%d", p.GetActor(), p.GetStartUnixMs()-t0, p.GetEndUnixMs()-t0)
		}
	}
	if got != "bob 1500-5000" {
		t.Fatalf("lease wait phase %q, want bob 1500-5000\n%s", got, phases(f))
	}
}

// TestLabel: every phase kind has a label of its own, and a kind this
// version does not know is shown as it is.
func TestLabel(t *testing.T) {
	seen := map[string]string{}
	for _, k := range timeline.Kinds() {
		l := timeline.Label(k)
		if other, dup := seen[l]; dup {
			t.Errorf("kinds %q and %q share the label %q", other, k, l)
		}
		seen[l] = k
	}
	for k, want := range map[string]string{
		timeline.KindObserve: "observed", timeline.KindLeaseWait: "lease wait", timeline.KindAttach: "attach WAL",
		timeline.KindClose: "close streams", timeline.KindReopen: "reopen", "fence_automq": "fence_automq",
	} {
		if got := timeline.Label(k); got != want {
			t.Errorf("Label(%q) = %q, want %q", k, got, want)
		}
	}
}
