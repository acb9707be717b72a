package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"walden/coordclient"
	waldenv1 "walden/proto/walden/v1"
)

// describeChange names a change for comparisons.
func describeChange(c *waldenv1.Change) string {
	switch v := c.GetValue().(type) {
	case *waldenv1.Change_Stream:
		return fmt.Sprintf("stream %d %s by %s", v.Stream.GetStreamId(), v.Stream.GetState(), v.Stream.GetOwnerBrokerId())
	case *waldenv1.Change_Broker:
		return fmt.Sprintf("broker %s epoch %d", v.Broker.GetBrokerId(), v.Broker.GetEpoch())
	case *waldenv1.Change_Job:
		return "job " + v.Job.GetJobId()
	case *waldenv1.Change_Event:
		return "event " + v.Event.GetEventKind().Name()
	}
	return "?"
}

// recvChanges reads responses until one with changes, skipping progress
// notices, and returns it.
func recvChanges(t *testing.T, st grpc.ServerStreamingClient[waldenv1.WatchResponse]) *waldenv1.WatchResponse {
	t.Helper()
	for {
		r, err := st.Recv()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if len(r.GetChanges()) > 0 || r.GetSnapshot() {
			return r
		}
	}
}

// TestWatch: a watch from 0 starts with a snapshot, then streams each
// change with its revision; a watch resumed from a revision gets exactly
// what happened since; filters keep kinds and a broker's objects; bad
// requests name the field; after a restart, a revision older than the
// snapshot the member restarted from is COMPACTED, and the client helper
// lists again and goes on.
func TestWatch(t *testing.T) {
	cfg := singleMember(t)
	cfg.Raft.SnapshotCount = 5
	s := startServer(t, cfg)
	admin := s.Addrs().Admin
	conn, err := grpc.NewClient(admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	catalog, watch := waldenv1.NewCatalogClient(conn), waldenv1.NewWatchClient(conn)
	register := func(id string) uint64 {
		t.Helper()
		r, err := waldenv1.NewAgentClient(conn).Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: id, AgentAddr: "127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetEpoch()
	}
	e1 := register("b1")
	if _, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 1}); err != nil {
		t.Fatal(err)
	}

	st, err := watch.Watch(ctx, &waldenv1.WatchRequest{Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_STREAM, waldenv1.WatchKind_WATCH_KIND_BROKER}})
	if err != nil {
		t.Fatal(err)
	}
	snap := recvChanges(t, st)
	var names []string
	for _, c := range snap.GetChanges() {
		names = append(names, describeChange(c))
	}
	if !snap.GetSnapshot() || fmt.Sprint(names) != fmt.Sprintf("[stream 1 opened by b1 broker b1 epoch %d]", e1) {
		t.Fatalf("snapshot %v: %v", snap.GetSnapshot(), names)
	}
	if _, err := catalog.CloseStream(ctx, &waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 1, StreamEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	r := recvChanges(t, st)
	if len(r.GetChanges()) != 1 || describeChange(r.GetChanges()[0]) != "stream 1 closed by b1" || r.GetChanges()[0].GetRevision() <= snap.GetRevision() ||
		r.GetRevision() < r.GetChanges()[0].GetRevision() {
		t.Fatalf("after the close: %v", r)
	}
	resume := r.GetRevision() + 1

	// Changes made while nobody watches: a watch resumed from the next
	// revision gets them, in order; one filtered on b2 only b2's.
	e2 := register("b2")
	for _, id := range []uint64{1, 2} {
		if _, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: id}); err != nil {
			t.Fatal(err)
		}
	}
	st2, err := watch.Watch(ctx, &waldenv1.WatchRequest{StartRevision: resume, Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_STREAM, waldenv1.WatchKind_WATCH_KIND_BROKER}})
	if err != nil {
		t.Fatal(err)
	}
	r = recvChanges(t, st2)
	names = nil
	for _, c := range r.GetChanges() {
		names = append(names, describeChange(c))
	}
	if r.GetSnapshot() || fmt.Sprint(names) != fmt.Sprintf("[broker b2 epoch %d stream 1 opened by b2 stream 2 opened by b2]", e2) {
		t.Fatalf("resumed from %d: %v", resume, names)
	}
	st3, err := watch.Watch(ctx, &waldenv1.WatchRequest{StartRevision: 1, BrokerId: "b1", Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_EVENT}})
	if err != nil {
		t.Fatal(err)
	}
	r = recvChanges(t, st3)
	for _, c := range r.GetChanges() {
		if c.GetEvent().GetBrokerId() != "b1" {
			t.Fatalf("filtered on b1's events: %v", c)
		}
	}

	// Bad requests name the field.
	for field, req := range map[string]*waldenv1.WatchRequest{
		"kinds[1]":             {Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_JOB, 9}},
		"progress_interval_ms": {ProgressIntervalMs: 10},
		"broker_id":            {BrokerId: "b 1"},
	} {
		st, err := watch.Watch(ctx, req)
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), field) {
			t.Fatalf("%s: %v", field, err)
		}
	}

	// The client helper follows from 0, then sees each new change once.
	var mu sync.Mutex
	var got []*waldenv1.WatchResponse
	waitGot := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			k := len(got)
			mu.Unlock()
			if k >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the helper got %d responses, want %d", k, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	client := coordclient.New([]string{admin}, slog.New(slog.DiscardHandler), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer client.Close()
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- client.Watch(wctx, &waldenv1.WatchRequest{Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_STREAM}}, coordclient.WatchOptions{}, func(r *waldenv1.WatchResponse) error {
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
			return nil
		})
	}()
	streamsSeen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, r := range got {
			for _, c := range r.GetChanges() {
				out = append(out, fmt.Sprintf("%v %s", r.GetSnapshot(), describeChange(c)))
			}
		}
		return out
	}
	waitGot(1) // the snapshot
	if _, err := catalog.CloseStream(ctx, &waldenv1.CloseStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: 2, StreamEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	want := "[true stream 1 opened by b2 true stream 2 opened by b2 false stream 2 closed by b2]"
	deadline := time.Now().Add(10 * time.Second)
	for fmt.Sprint(streamsSeen()) != want {
		if time.Now().After(deadline) {
			t.Fatalf("helper saw %v, want %v", streamsSeen(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	wcancel()
	if err := <-done; err != nil {
		t.Fatalf("helper returned %v after its context ended", err)
	}
}

// TestWatchCompactedAfterRestart restarts a member that took snapshots: a
// watch from before its snapshot is OUT_OF_RANGE COMPACTED, naming the
// revision it keeps changes after; the client helper then lists again.
func TestWatchCompactedAfterRestart(t *testing.T) {
	cfg := singleMember(t)
	cfg.Raft.SnapshotCount = 5
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopFirst := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	cfg.Listen.Admin = s.Addrs().Admin // the restart binds the same address
	conn, err := grpc.NewClient(cfg.Listen.Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 12; i++ {
		if _, err := waldenv1.NewAgentClient(conn).Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: fmt.Sprintf("b%d", i), AgentAddr: "127.0.0.1:1"}); err != nil {
			t.Fatal(err)
		}
	}
	stopFirst()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	startServer(t, cfg)
	waitServing(t, conn)

	st, err := waldenv1.NewWatchClient(conn).Watch(ctx, &waldenv1.WatchRequest{StartRevision: 1})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.OutOfRange || !coordclient.Compacted(err) || !strings.Contains(err.Error(), "list again by watching from revision 0") {
		t.Fatalf("watch from revision 1 after a restart: %v", err)
	}
	client := coordclient.New([]string{cfg.Listen.Admin}, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer client.Close()
	var first *waldenv1.WatchResponse
	errStop := fmt.Errorf("stop")
	err = client.Watch(ctx, &waldenv1.WatchRequest{StartRevision: 1, Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_BROKER}}, coordclient.WatchOptions{}, func(r *waldenv1.WatchResponse) error {
		first = r
		return errStop
	})
	if err != errStop || !first.GetSnapshot() || len(first.GetChanges()) != 12 {
		t.Fatalf("helper after COMPACTED: %v, first response %v", err, first)
	}
}
