package server

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"walden/fsm"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/rpcerr"
	"walden/wal"
)

// TestCatalogAndJobsAPI drives one member through the Catalog and Jobs
// APIs: a broker opens streams and commits, is failed over by hand, its own
// writes are then refused NODE_FENCED, the member's recovery runs the job
// (watched through WatchJobs) and closes the streams; bad input is refused
// with InvalidArgument naming the field.
func TestCatalogAndJobsAPI(t *testing.T) {
	cfg := singleMember(t)
	cfg.S3 = s3test.StartFake(t)
	cfg.Recovery.JobLease = time.Second
	cfg.Recovery.RetryMin = 20 * time.Millisecond
	cfg.Recovery.RetryMax = 200 * time.Millisecond
	s := startServer(t, cfg)
	conn, err := grpc.NewClient(s.Addrs().Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	catalog, jobs := waldenv1.NewCatalogClient(conn), waldenv1.NewJobsClient(conn)

	walPath := filepath.Join(t.TempDir(), "b1.wal")
	reg, err := waldenv1.NewAgentClient(conn).Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: "b1", AgentAddr: "127.0.0.1:1",
		Wal: &waldenv1.WalLocation{Path: walPath}})
	if err != nil {
		t.Fatal(err)
	}
	epoch := reg.GetEpoch()
	grantLease(t, ctx, "b1", epoch, conn)
	for _, id := range []uint64{1, 2} {
		if _, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := catalog.CommitObject(ctx, &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: epoch, Object: &waldenv1.Object{
		ObjectId: "o1", Key: "k/o1", Size: 200, Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 1, StartOffset: 0, EndOffset: 5, Position: 16, Length: 16}}}}); err != nil {
		t.Fatal(err)
	}
	// The WAL holds stream 1 from 5 and stream 2 from 0.
	w, err := wal.Create(walPath, wal.CreateOptions{Capacity: 1 << 20, NodeID: 1, NodeEpoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.AppendAll(ctx, []wal.Batch{
		{StreamID: 1, Epoch: 1, BaseOffset: 5, Count: 2, Payload: []byte("s1-5")},
		{StreamID: 2, Epoch: 1, BaseOffset: 0, Count: 3, Payload: []byte("s2-0")},
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.Abandon(); err != nil {
		t.Fatal(err)
	}

	// Bad input names the field.
	for _, tc := range []struct {
		field string
		call  func() error
	}{
		{"broker_id", func() error {
			_, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerEpoch: 1})
			return err
		}},
		{"object.ranges[0].end_offset", func() error {
			_, err := catalog.CommitObject(ctx, &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: epoch, Object: &waldenv1.Object{
				ObjectId: "x", Key: "x", Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 1, StartOffset: 5, EndOffset: 5}}}})
			return err
		}},
		{"state", func() error {
			_, err := catalog.ListStreams(ctx, &waldenv1.ListStreamsRequest{State: "OPEN"})
			return err
		}},
		{"job_id", func() error { _, err := jobs.GetJob(ctx, &waldenv1.GetJobRequest{}); return err }},
	} {
		err := tc.call()
		if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !containsField(st, tc.field) {
			t.Fatalf("%s: %v, want InvalidArgument naming it", tc.field, err)
		}
	}
	ls, err := catalog.ListStreams(ctx, &waldenv1.ListStreamsRequest{State: fsm.StreamOpened})
	if err != nil || len(ls.GetStreams()) != 2 {
		t.Fatalf("opened streams: %v %v", ls, err)
	}

	// A job watcher from before the failover.
	watch, err := jobs.WatchJobs(ctx, &waldenv1.WatchJobsRequest{BrokerId: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	fo, err := waldenv1.NewBrokersClient(conn).Failover(ctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	// The fenced broker's own writes are refused.
	_, err = catalog.CommitObject(ctx, &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: epoch, Object: &waldenv1.Object{
		ObjectId: "o2", Key: "k/o2", Size: 200, Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 1, StartOffset: 5, EndOffset: 7, Position: 16, Length: 16}}}})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || rpcerr.Reason(err) != "NODE_FENCED" {
		t.Fatalf("fenced commit: %v", err)
	}
	_, err = catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: 3})
	if rpcerr.Reason(err) != "NODE_FENCED" {
		t.Fatalf("fenced open: %v", err)
	}
	var last *waldenv1.Job
	for last.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED {
		resp, err := watch.Recv()
		if errors.Is(err, io.EOF) || err != nil {
			t.Fatalf("watch: %v (last %v)", err, last)
		}
		for _, j := range resp.GetJobs() {
			if j.GetJobId() == fo.GetJobId() {
				last = j
			}
		}
	}
	if last.GetStreamsClosed() != 2 || last.GetRecordsUploaded() != 2 {
		t.Fatalf("job: %v", last)
	}
	ds, err := catalog.DescribeStream(ctx, &waldenv1.DescribeStreamRequest{StreamId: 1})
	if err != nil || ds.GetStream().GetState() != fsm.StreamClosed || ds.GetStream().GetEndOffset() != 7 || len(ds.GetObjects()) != 2 {
		t.Fatalf("stream 1: %v %v", ds, err)
	}
	if _, err := catalog.DescribeStream(ctx, &waldenv1.DescribeStreamRequest{StreamId: 99}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown stream: %v", err)
	}
	// Cancelling a finished job is refused; listing shows it.
	if _, err := jobs.CancelJob(ctx, &waldenv1.CancelJobRequest{JobId: fo.GetJobId()}); rpcerr.Reason(err) != "JOB_NOT_RUNNING" {
		t.Fatalf("cancel of a finished job: %v", err)
	}
	lj, err := jobs.ListJobs(ctx, &waldenv1.ListJobsRequest{JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED})
	if err != nil || len(lj.GetJobs()) != 1 {
		t.Fatalf("list jobs: %v %v", lj, err)
	}
	// The recovering member answers GetOpeningStreams in failover mode: none left.
	op, err := catalog.GetOpeningStreams(ctx, &waldenv1.GetOpeningStreamsRequest{BrokerId: "b1", BrokerEpoch: epoch})
	if rpcerr.Reason(err) != "NODE_FENCED" {
		t.Fatalf("opening streams of the fenced broker without failover: %v %v", op, err)
	}
}

// containsField reports whether an InvalidArgument message names field
// (invalidArg writes "field: reason").
func containsField(st *status.Status, field string) bool {
	return strings.HasPrefix(st.Message(), field+": ")
}
