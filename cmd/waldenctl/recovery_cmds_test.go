package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

type fakeCatalog struct {
	waldenv1.UnimplementedCatalogServer
	streams []*waldenv1.Stream
}

func (f *fakeCatalog) ListStreams(context.Context, *waldenv1.ListStreamsRequest) (*waldenv1.ListStreamsResponse, error) {
	return &waldenv1.ListStreamsResponse{Streams: f.streams}, nil
}

func (f *fakeCatalog) DescribeStream(_ context.Context, r *waldenv1.DescribeStreamRequest) (*waldenv1.DescribeStreamResponse, error) {
	return &waldenv1.DescribeStreamResponse{Stream: f.streams[0], Objects: []*waldenv1.Object{{ObjectId: "o1", Key: "b1/1.obj", Size: 9,
		BrokerId: "b1", BrokerEpoch: 4, JobId: "job-b1-4", Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 2, StartOffset: 0, EndOffset: 10}}}}}, nil
}

type fakeJobs struct {
	waldenv1.UnimplementedJobsServer
	updates [][]*waldenv1.Job
}

func (f *fakeJobs) ListJobs(context.Context, *waldenv1.ListJobsRequest) (*waldenv1.ListJobsResponse, error) {
	return &waldenv1.ListJobsResponse{Jobs: f.updates[len(f.updates)-1]}, nil
}

func (f *fakeJobs) WatchJobs(_ *waldenv1.WatchJobsRequest, s grpc.ServerStreamingServer[waldenv1.ListJobsResponse]) error {
	for _, u := range f.updates {
		if err := s.Send(&waldenv1.ListJobsResponse{Jobs: u}); err != nil {
			return err
		}
	}
	<-s.Context().Done()
	return nil
}

func serveRecovery(t *testing.T, c *fakeCatalog, j *fakeJobs) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	waldenv1.RegisterCatalogServer(s, c)
	waldenv1.RegisterJobsServer(s, j)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func sampleJob(state, step string, up uint64, closed uint32) *waldenv1.Job {
	js, _ := waldenv1.Parse[waldenv1.JobState](state)
	st, _ := waldenv1.Parse[waldenv1.JobStep](step)
	return &waldenv1.Job{JobId: "job-b1-4", BrokerId: "b1", JobState: js, JobStep: st, AssigneeId: "c2", Attempt: 2, Token: 4,
		BytesUploaded: up, BytesTotal: 3 << 20, StreamsClosed: closed, StreamsTotal: 2}
}

func TestStreamsAndJobsCommands(t *testing.T) {
	cat := &fakeCatalog{streams: []*waldenv1.Stream{{StreamId: 1, State: "closed", Epoch: 2, OwnerBrokerId: "b1", OwnerEpoch: 3, EndOffset: 10}}}
	jobs := &fakeJobs{updates: [][]*waldenv1.Job{
		{sampleJob("running", "upload", 1<<20, 0)},
		{sampleJob("running", "close", 3<<20, 1)},
		{sampleJob("succeeded", "done", 3<<20, 2)},
	}}
	addr := serveRecovery(t, cat, jobs)

	code, out, errOut := runCtl(t, "--endpoints", addr, "streams", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var sdoc struct {
		Streams []map[string]any `json:"streams"`
	}
	if err := json.Unmarshal([]byte(out), &sdoc); err != nil || len(sdoc.Streams) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	for _, k := range []string{"stream_id", "state", "epoch", "owner_broker_id", "start_offset", "end_offset"} {
		if _, ok := sdoc.Streams[0][k]; !ok {
			t.Fatalf("key %s missing: %s", k, out)
		}
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "stream", "1")
	if code != 0 || !strings.Contains(out, "0..10") || !strings.Contains(out, "job-b1-4") {
		t.Fatalf("stream 1: %s", out)
	}

	code, out, errOut = runCtl(t, "--endpoints", addr, "jobs", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var jdoc struct {
		Jobs []map[string]any `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &jdoc); err != nil || len(jdoc.Jobs) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	for _, k := range []string{"job_id", "broker_id", "state", "assignee_id", "attempt", "token", "bytes_uploaded", "bytes_total", "streams_closed", "streams_total"} {
		if _, ok := jdoc.Jobs[0][k]; !ok {
			t.Fatalf("key %s missing: %s", k, out)
		}
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "jobs")
	if code != 0 || !strings.Contains(out, "3.0MiB/3.0MiB (100%)") || !strings.Contains(out, "2/2") {
		t.Fatalf("jobs table: %s", out)
	}

	// watch prints each change and ends when the job finished.
	code, out, errOut = runCtl(t, "--endpoints", addr, "jobs", "watch")
	if code != 0 {
		t.Fatalf("watch exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.Contains(lines[1], "1.0MiB/3.0MiB") || !strings.Contains(lines[1], " 33%") || !strings.Contains(lines[2], "close") ||
		!strings.Contains(lines[3], "succeeded") || !strings.Contains(lines[3], "c2") {
		t.Fatalf("watch output:\n%s", out)
	}
	// Lines printed one by one still line up under the header.
	for _, col := range []string{"STATE", "PROGRESS", "UPLOADED", "RATE", "ETA", "STREAMS"} {
		at := strings.Index(lines[0], col)
		for _, l := range lines[1:] {
			r := []rune(l)
			if at <= 0 || len(r) <= at || r[at-1] != ' ' || r[at] == ' ' {
				t.Fatalf("column %s (at %d) not aligned:\n%s", col, at, out)
			}
		}
	}
}

func TestJobsWatchJSON(t *testing.T) {
	jobs := &fakeJobs{updates: [][]*waldenv1.Job{
		{sampleJob("running", "upload", 1<<20, 0)},
		{sampleJob("running", "upload", 1<<20, 0)},
		{sampleJob("running", "close", 3<<20, 1)},
		{sampleJob("succeeded", "done", 3<<20, 2)},
	}}
	addr := serveRecovery(t, &fakeCatalog{}, jobs)
	code, out, errOut := runCtl(t, "--endpoints", addr, "jobs", "watch", "--broker", "b1", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want one object per change (3), got:\n%s", out)
	}
	for i, l := range lines {
		var ch struct {
			Time string         `json:"time"`
			Job  map[string]any `json:"job"`
			Rate *float64       `json:"rate_bytes_per_sec"`
			Eta  *int64         `json:"eta_ms"`
		}
		if err := json.Unmarshal([]byte(l), &ch); err != nil || ch.Time == "" || ch.Job["job_id"] != "job-b1-4" || ch.Rate == nil || ch.Eta == nil {
			t.Fatalf("line %d: %v %q", i, err, l)
		}
		if i == 0 && *ch.Eta != -1 {
			t.Errorf("ETA before a rate: %d", *ch.Eta)
		}
		if i == 2 && (ch.Job["state"] != "succeeded" || *ch.Eta != 0) {
			t.Errorf("last: %q", l)
		}
	}
}

// TestJobShowsAutoMQIds: `waldenctl job` of an AutoMQ failover shows the
// node and epoch, each stream's end offsets before and after and the
// objects with their AutoMQ ids and keys.
func TestJobShowsAutoMQIds(t *testing.T) {
	j := &waldenv1.Job{JobId: "job-b3-9", BrokerId: "b3", Automq: &waldenv1.AutomqNode{NodeId: 3, NodeEpoch: 1733},
		TargetReport: &waldenv1.TargetReport{Target: "automq", NodeId: 3, NodeEpoch: 1800, Fenced: true, WalReset: true, BytesUploaded: 2048,
			Streams: []*waldenv1.TargetStream{{StreamId: 10, StreamEpoch: 2, EndOffsetBefore: 20, EndOffsetAfter: 80, Records: 60, Closed: true},
				{StreamId: 11, StreamEpoch: 1, Problem: "records missing: stream 11"}},
			Objects: []*waldenv1.TargetObject{{ObjectId: 4660, Key: "4321000/_kafka_prod/4660", Size: 2048, Kind: "stream_set", State: "committed"}}}}
	var b strings.Builder
	printJob(&b, j)
	out := b.String()
	for _, want := range []string{"automq node\t3, epoch 1800; fenced at the controller: yes; WAL reset: yes", "10\t2\t20\t80\t60\tyes\t-",
		"11\t1\t0\t0\t0\tno\trecords missing: stream 11", "4660\tstream_set\t2.0KiB\tcommitted\t4321000/_kafka_prod/4660"} {
		if !strings.Contains(out, want) {
			t.Errorf("job output lacks %q:\n%s", want, out)
		}
	}
}

type resolvingJobs struct {
	fakeJobs
	got []*waldenv1.ResolveJobRequest
}

func (f *resolvingJobs) ResolveJob(_ context.Context, r *waldenv1.ResolveJobRequest) (*waldenv1.ResolveJobResponse, error) {
	f.got = append(f.got, r)
	j := sampleJob("pending", "fence", 0, 0)
	j.WalLost, j.Resolution = r.GetWalLost(), r.GetReason()
	return &waldenv1.ResolveJobResponse{Job: j}, nil
}

// TestJobsResolve: resolve sends the reason and --wal-lost; without a
// reason it is a usage error and sends nothing.
func TestJobsResolve(t *testing.T) {
	jobs := &resolvingJobs{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	waldenv1.RegisterJobsServer(s, jobs)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	addr := l.Addr().String()

	code, _, errOut := runCtl(t, "--endpoints", addr, "jobs", "resolve", "job-b1-4", "--wal-lost")
	if code != exitUsage || !strings.Contains(errOut, "--reason is required") || len(jobs.got) != 0 {
		t.Fatalf("resolve without a reason: exit %d, %q, %d requests sent", code, errOut, len(jobs.got))
	}
	code, out, errOut := runCtl(t, "--endpoints", addr, "jobs", "resolve", "job-b1-4", "--reason", "host lost with its disk", "--wal-lost", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if len(jobs.got) != 1 || jobs.got[0].GetJobId() != "job-b1-4" || jobs.got[0].GetReason() != "host lost with its disk" || !jobs.got[0].GetWalLost() {
		t.Fatalf("requests: %v", jobs.got)
	}
	if !strings.Contains(out, `"wal_lost": true`) && !strings.Contains(out, `"wal_lost":true`) {
		t.Fatalf("output: %s", out)
	}
}
