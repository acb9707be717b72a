package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
	"walden/timeline"
)

type fakeFailovers struct {
	waldenv1.UnimplementedFailoversServer
	f *waldenv1.Failover
}

func (f *fakeFailovers) ListFailovers(_ context.Context, r *waldenv1.ListFailoversRequest) (*waldenv1.ListFailoversResponse, error) {
	if r.GetBrokerId() != "" && r.GetBrokerId() != f.f.GetBrokerId() {
		return &waldenv1.ListFailoversResponse{}, nil
	}
	return &waldenv1.ListFailoversResponse{Failovers: []*waldenv1.Failover{f.f}}, nil
}

func (f *fakeFailovers) GetFailover(_ context.Context, r *waldenv1.GetFailoverRequest) (*waldenv1.GetFailoverResponse, error) {
	if r.GetId() != f.f.GetId() && r.GetId() != f.f.GetBrokerId() {
		return nil, status.Error(codes.NotFound, "failover not found")
	}
	return &waldenv1.GetFailoverResponse{Failover: f.f}, nil
}

func sampleFailover() *waldenv1.Failover {
	const t0 = int64(1_700_000_000_000)
	j := &waldenv1.Job{JobId: "job-b1-7", BrokerId: "b1", Token: 7, Attempt: 1, AssigneeId: "c2", JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED, JobStep: waldenv1.JobStep_JOB_STEP_DONE,
		CreatedUnixMs: t0 + 5000, FinishedUnixMs: t0 + 6500, StreamsTotal: 3, StreamsClosed: 3, StreamsReopened: 3, ReopenedUnixMs: t0 + 7000,
		BytesUploaded: 3 << 20, BytesTotal: 3 << 20, Objects: []string{"o1"}, RecordsUploaded: 12, LeaseWaitMs: 200,
		Checkpoints: []*waldenv1.Checkpoint{{JobStep: waldenv1.JobStep_JOB_STEP_FENCE, Attempt: 1, UnixMs: t0 + 5400}, {JobStep: waldenv1.JobStep_JOB_STEP_ATTACH, Attempt: 1, UnixMs: t0 + 5450},
			{JobStep: waldenv1.JobStep_JOB_STEP_READ, Attempt: 1, UnixMs: t0 + 5500}, {JobStep: waldenv1.JobStep_JOB_STEP_UPLOAD, Attempt: 1, UnixMs: t0 + 6200, Detail: "uploaded 1 object"},
			{JobStep: waldenv1.JobStep_JOB_STEP_COMMIT, Attempt: 1, UnixMs: t0 + 6300}, {JobStep: waldenv1.JobStep_JOB_STEP_CLOSE, Attempt: 1, UnixMs: t0 + 6400}, {JobStep: waldenv1.JobStep_JOB_STEP_DETACH, Attempt: 1, UnixMs: t0 + 6450}}}
	ev := []*waldenv1.Event{
		{Index: 9, EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", JobId: "job-b1-7", Actor: "c1", UnixMs: t0 + 5000, Message: "declared failed: epoch 4 fenced, new epoch 7",
			Evidence: &waldenv1.Evidence{DecidedBy: "c1", SuspectForMs: 5000, FailureTimeoutMs: 5000, LeaseExpiredForMs: 1200,
				Observations: []*waldenv1.Observation{{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD, SinceUnixMs: t0}, {ObserverId: "c3", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, SinceUnixMs: t0 + 300}}}},
		{Index: 10, EventKind: waldenv1.EventKind_EVENT_KIND_JOB, BrokerId: "b1", JobId: "job-b1-7", Actor: "c2", UnixMs: t0 + 5010, Message: "attempt 1 running on c2"},
	}
	return timeline.Build(j, ev)
}

func serveFailovers(t *testing.T, f *fakeFailovers) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	waldenv1.RegisterFailoversServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func TestFailoversCommands(t *testing.T) {
	addr := serveFailovers(t, &fakeFailovers{f: sampleFailover()})
	code, out, errOut := runCtl(t, "--endpoints", addr, "failovers", "b1")
	if code != 0 {
		t.Fatalf("exit %d %s", code, errOut)
	}
	for _, want := range []string{"FAILOVER", "job-b1-7", "4→7", "c1", "c2", "5.000s", "1.500s", "500ms", "7.000s", "3.0MiB", "3/3 reopened"} {
		if !strings.Contains(out, want) {
			t.Errorf("failovers lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "failover", "show", "b1")
	if code != 0 {
		t.Fatalf("show: exit %d", code)
	}
	for _, want := range []string{"broker        b1: epoch 4 fenced, new epoch 7", "by c1 (automatic)", "suspected by 2 coordinators for 5.000s",
		"recovered by  c2 (1 attempt)", "in 1 object (12 record batches)", "3/3 open again", "detection 5.000s, recovery 1.500s, reopen 500ms, total 7.000s",
		"lease wait", "uploaded 1 object"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	// Every phase row has a bar of the same width, in order.
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if i := strings.Index(l, "|"); i >= 0 {
			rows = append(rows, l[i:strings.LastIndex(l, "|")+1])
		}
	}
	if len(rows) != 12 {
		t.Fatalf("%d phase rows:\n%s", len(rows), out)
	}
	for _, r := range rows {
		if len([]rune(r)) != barWidth+2 {
			t.Errorf("bar %q is not %d wide", r, barWidth+2)
		}
	}
	if !strings.HasPrefix(rows[0], "|█") || !strings.HasSuffix(rows[len(rows)-1], "█|") {
		t.Errorf("first bar %q, last %q", rows[0], rows[len(rows)-1])
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "failover", "show", "job-b1-7", "-o", "json")
	var doc struct {
		Failover struct {
			Phases []map[string]any `json:"phases"`
		} `json:"failover"`
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Failover.Phases) != 12 {
		t.Fatalf("json: exit %d %v %s", code, err, out)
	}
	code, _, errOut = runCtl(t, "--endpoints", addr, "failover", "show", "job-b9-1")
	if code != exitNotFound || errOut != "waldenctl: there is no failover job-b9-1: no recovery job has that id (waldenctl failovers lists them)\n" {
		t.Fatalf("unknown: %d %q", code, errOut)
	}
}
