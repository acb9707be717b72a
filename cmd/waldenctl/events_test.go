package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
)

// growingLog is a Brokers server whose event log grows by one event per
// ListEvents call.
type growingLog struct {
	fakeBrokers
	mu     sync.Mutex
	events []*waldenv1.Event
	next   uint64
}

func (g *growingLog) ListEvents(_ context.Context, r *waldenv1.ListEventsRequest) (*waldenv1.ListEventsResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next++
	kind := []string{"observation", "decision", "job"}[g.next%3]
	k, _ := waldenv1.Parse[waldenv1.EventKind](kind)
	g.events = append(g.events, &waldenv1.Event{Index: 100 + g.next, UnixMs: time.Now().UnixMilli(), EventKind: k, BrokerId: "b1", Message: kind})
	var out []*waldenv1.Event
	for _, e := range g.events {
		if r.GetBrokerId() == "" || e.GetBrokerId() == r.GetBrokerId() {
			out = append(out, e)
		}
	}
	return &waldenv1.ListEventsResponse{Events: out}, nil
}

func TestEventsFilters(t *testing.T) {
	now := time.Now()
	f := &fakeBrokers{}
	addr := serveBrokers(t, &eventsServer{fakeBrokers: f, events: []*waldenv1.Event{
		{Index: 1, UnixMs: now.Add(-time.Hour).UnixMilli(), EventKind: waldenv1.EventKind_EVENT_KIND_REGISTER, BrokerId: "b1", Message: "registered"},
		{Index: 2, UnixMs: now.Add(-time.Minute).UnixMilli(), EventKind: waldenv1.EventKind_EVENT_KIND_OBSERVATION, BrokerId: "b1", Message: "c1 observes dead"},
		{Index: 3, UnixMs: now.Add(-30 * time.Second).UnixMilli(), EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", Message: "declared failed"},
		{Index: 4, UnixMs: now.Add(-10 * time.Second).UnixMilli(), EventKind: waldenv1.EventKind_EVENT_KIND_JOB, BrokerId: "b1", Message: "attempt 1 running on c2"},
	}})
	for args, want := range map[string]string{
		"events":                                 "1,2,3,4",
		"events --kind decision,job":             "3,4",
		"events --kind observation --kind job":   "2,4",
		"events --since 2m":                      "2,3,4",
		"events --since 45s --kind job,decision": "3,4",
		"events --limit 2":                       "3,4",
	} {
		code, out, errOut := runCtl(t, append([]string{"--endpoints", addr, "-o", "json"}, strings.Fields(args)...)...)
		var doc struct {
			Events []struct {
				Index string `json:"index"`
			} `json:"events"`
		}
		if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil {
			t.Fatalf("%s: exit %d %v %s %s", args, code, err, out, errOut)
		}
		var got []string
		for _, e := range doc.Events {
			got = append(got, e.Index)
		}
		if strings.Join(got, ",") != want {
			t.Errorf("%s: %v, want %s", args, got, want)
		}
	}
	code, _, errOut := runCtl(t, "--endpoints", addr, "events", "--kind", "decisoin")
	if code != exitUsage || errOut != "waldenctl: --kind: \"decisoin\" is not a kind of event ("+strings.Join(eventKinds, ", ")+")\ndid you mean decision?\n" {
		t.Errorf("bad kind: %d %q", code, errOut)
	}
	if code, _, errOut = runCtl(t, "--endpoints", addr, "events", "--since", "yesterday"); code != exitUsage || !strings.Contains(errOut, "--since") {
		t.Errorf("bad since: %d %q", code, errOut)
	}
}

type eventsServer struct {
	*fakeBrokers
	events []*waldenv1.Event
}

func (e *eventsServer) ListEvents(_ context.Context, r *waldenv1.ListEventsRequest) (*waldenv1.ListEventsResponse, error) {
	return &waldenv1.ListEventsResponse{Events: e.events}, nil
}

func TestEventsFollow(t *testing.T) {
	g := &growingLog{}
	addr := serveBrokers(t, g)
	for _, output := range []string{"table", "json"} {
		var out bytes.Buffer
		c := &cli{stdout: &out, stderr: &out, endpoints: []string{addr}, output: output, timeout: 2 * time.Second}
		root, _ := newRootCmd(&out, &out)
		if err := c.complete(root); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 1800*time.Millisecond)
		err := c.followEvents(ctx, "b1", eventFilter{kinds: []string{"decision", "job"}}, 0)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if output == "json" {
			seen := map[string]bool{}
			for _, l := range lines {
				var e map[string]any
				if err := json.Unmarshal([]byte(l), &e); err != nil {
					t.Fatalf("not one JSON object per line: %q", l)
				}
				if e["kind"] == "observation" || seen[e["index"].(string)] {
					t.Fatalf("filtered or repeated: %q", l)
				}
				seen[e["index"].(string)] = true
			}
			if len(seen) < 2 {
				t.Fatalf("followed %d events:\n%s", len(seen), out.String())
			}
			continue
		}
		if !strings.HasPrefix(lines[0], "INDEX") || len(lines) < 3 {
			t.Fatalf("table follow:\n%s", out.String())
		}
	}
}

// watchingLog serves Watch: a snapshot of two events, then a stream that
// breaks after one more; the resumed watch must start after it and gets
// one more event.
type watchingLog struct {
	waldenv1.UnimplementedWatchServer
	mu     sync.Mutex
	starts []uint64
}

func (w *watchingLog) Watch(r *waldenv1.WatchRequest, st grpc.ServerStreamingServer[waldenv1.WatchResponse]) error {
	w.mu.Lock()
	w.starts = append(w.starts, r.GetStartRevision())
	n := len(w.starts)
	w.mu.Unlock()
	ev := func(i uint64, kind string) *waldenv1.Change {
		k, _ := waldenv1.Parse[waldenv1.EventKind](kind)
		return &waldenv1.Change{Revision: i, Kind: waldenv1.WatchKind_WATCH_KIND_EVENT,
			Value: &waldenv1.Change_Event{Event: &waldenv1.Event{Index: i, UnixMs: time.Now().UnixMilli(), EventKind: k, BrokerId: "b1", Message: kind}}}
	}
	switch n {
	case 1:
		_ = st.Send(&waldenv1.WatchResponse{Revision: 11, Snapshot: true, Changes: []*waldenv1.Change{ev(10, "decision"), ev(11, "observation")}})
		_ = st.Send(&waldenv1.WatchResponse{Revision: 12, Changes: []*waldenv1.Change{ev(12, "job")}})
		return status.Error(codes.Unavailable, "the member stops")
	case 2:
		_ = st.Send(&waldenv1.WatchResponse{Revision: 13, Changes: []*waldenv1.Change{ev(13, "decision")}})
	}
	<-st.Context().Done()
	return nil
}

// TestEventsFollowWatches: events --follow prints what the Watch sends,
// filtered, and goes on after a broken stream from the revision after the
// last one it printed.
func TestEventsFollowWatches(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	w := &watchingLog{}
	waldenv1.RegisterWatchServer(s, w)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	out := &lockedBuffer{}
	c := &cli{stdout: out, stderr: out, endpoints: []string{l.Addr().String()}, output: "json", timeout: 2 * time.Second}
	root, _ := newRootCmd(out, out)
	if err := c.complete(root); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.followEvents(ctx, "b1", eventFilter{kinds: []string{"decision", "job"}}, 0) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		n := len(w.starts)
		w.mu.Unlock()
		if n >= 2 && strings.Count(out.String(), "\n") >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("followed:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var idx []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("not one JSON object per line: %q", line)
		}
		idx = append(idx, e["index"].(string))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if strings.Join(idx, ",") != "10,12,13" || w.starts[0] != 0 || w.starts[1] != 13 {
		t.Fatalf("printed %v, watches started at %v", idx, w.starts)
	}
}

// lockedBuffer is a bytes.Buffer written by one goroutine and read by
// another.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestEventsWideReadsFields: -o wide shows an event's epoch and the
// broker's state change from its typed fields, and dashes for an event
// an older walden recorded without them.
func TestEventsWideReadsFields(t *testing.T) {
	var b bytes.Buffer
	printEvents(&b, []*waldenv1.Event{
		{Index: 3, EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", JobId: "job-b1-7", Message: "declared failed",
			Detail: &waldenv1.EventDetail{Epoch: 4, NewEpoch: 7, FromState: waldenv1.BrokerState_BROKER_STATE_SUSPECT, ToState: waldenv1.BrokerState_BROKER_STATE_FAILED}},
		{Index: 4, EventKind: waldenv1.EventKind_EVENT_KIND_ACK, BrokerId: "b2", Message: "cooldown block cleared",
			Detail: &waldenv1.EventDetail{Epoch: 2, FromState: waldenv1.BrokerState_BROKER_STATE_ALIVE, ToState: waldenv1.BrokerState_BROKER_STATE_ALIVE}},
		{Index: 2, EventKind: waldenv1.EventKind_EVENT_KIND_OBSERVATION, BrokerId: "b1", Message: "c1 observes dead"},
	}, true)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	for i, want := range []string{"JOB\tEPOCH\tSTATE", "job-b1-7\t4→7\tsuspect→failed", "-\t2\talive", "-\t-\t-"} {
		if !strings.HasSuffix(lines[i], want) {
			t.Errorf("line %d %q does not end with %q", i, lines[i], want)
		}
	}
}
