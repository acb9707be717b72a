package controller_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"walden/automq/controller"
	"walden/automq/protocol"
	"walden/internal/testutil"
)

// newClient returns a client of the voters with short timings, closed when
// the test ends.
func newClient(t *testing.T, voters []string, mod ...func(*controller.Config)) *controller.Client {
	t.Helper()
	cfg := controller.DefaultConfig()
	cfg.Voters = voters
	cfg.DialTimeout = testutil.Deadline(time.Second)
	cfg.RequestTimeout = testutil.Deadline(2 * time.Second)
	cfg.Attempts = 2
	cfg.RetryBackoff = 10 * time.Millisecond
	cfg.MaxRetryBackoff = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	for _, m := range mod {
		m(&cfg)
	}
	c, err := controller.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline(d))
	t.Cleanup(cancel)
	return ctx
}

// deadAddr is an address where nothing listens: a port below the kernel's
// ephemeral range, checked free.
func deadAddr(t *testing.T) string { return testutil.Addrs(t, "127.0.0.1", 1)[0] }

// recorder is a handler answering as a healthy controller, recording the
// requests it answered.
type recorder struct {
	mu   sync.Mutex
	reqs []kmsg.Request
}

func (r *recorder) last() kmsg.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) == 0 {
		return nil
	}
	return r.reqs[len(r.reqs)-1]
}

func (r *recorder) handle(_ protocol.RequestHeader, req kmsg.Request) reply {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	switch q := req.(type) {
	case *protocol.GetOpeningStreamsRequest:
		return reply{resp: &protocol.GetOpeningStreamsResponse{StreamMetadataList: []protocol.StreamMetadata{
			{StreamID: 3, Epoch: 1, StartOffset: 0, EndOffset: 64},
			{StreamID: 1 << 62, Epoch: 1<<62 - 1, StartOffset: 1 << 62, EndOffset: 1<<62 + 2},
		}}}
	case *protocol.PrepareS3ObjectRequest:
		return reply{resp: &protocol.PrepareS3ObjectResponse{FirstS3ObjectID: 4660}}
	case *protocol.CommitStreamSetObjectRequest:
		return reply{resp: &protocol.CommitStreamSetObjectResponse{Attributes: q.Attributes}}
	case *protocol.CloseStreamsRequest:
		return reply{resp: &protocol.CloseStreamsResponse{CloseStreamResponses: make([]protocol.CloseStreamResponse, len(q.CloseStreamRequests))}}
	case *protocol.OpenStreamsRequest:
		resp := &protocol.OpenStreamsResponse{}
		for i := range q.OpenStreamRequests {
			resp.OpenStreamResponses = append(resp.OpenStreamResponses, protocol.OpenStreamResponse{StartOffset: 0, NextOffset: int64(100 + i)})
		}
		return reply{resp: resp}
	case *protocol.AutomqGetNodesRequest:
		resp := &protocol.AutomqGetNodesResponse{}
		for _, id := range q.NodeIDs {
			resp.Nodes = append(resp.Nodes, protocol.NodeMetadata{NodeID: id, NodeEpoch: 1717171717171, WALConfig: "0@file:///wal", State: "ACTIVE",
				HasOpeningStreams: true, Tags: []protocol.Tag{{Key: "zone", Value: "a"}}})
		}
		return reply{resp: resp}
	}
	return reply{close: true}
}

func healthy(t *testing.T, opts ...func(*fakeController)) (*fakeController, *recorder) {
	f := newFake(t, opts...)
	r := &recorder{}
	f.setHandler(r.handle)
	return f, r
}

// TestCalls makes each of the six calls against a controller speaking the
// highest versions and checks what went on the wire and what came back.
func TestCalls(t *testing.T) {
	f, rec := healthy(t)
	c := newClient(t, []string{f.addr})
	ctx := ctxFor(t, 20*time.Second)

	streams, err := c.GetOpeningStreams(ctx, 3, 1717171717171, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []controller.OpeningStream{{StreamID: 3, Epoch: 1, EndOffset: 64}, {StreamID: 1 << 62, Epoch: 1<<62 - 1, StartOffset: 1 << 62, EndOffset: 1<<62 + 2}}
	if !reflect.DeepEqual(streams, want) {
		t.Fatalf("opening streams %+v", streams)
	}
	if got := rec.last().(*protocol.GetOpeningStreamsRequest); got.NodeID != 3 || got.NodeEpoch != 1717171717171 || !got.FailoverMode {
		t.Fatalf("sent %+v", got)
	}
	if c.Controller() != f.addr {
		t.Fatalf("Controller() = %q", c.Controller())
	}

	first, err := c.PrepareS3Object(ctx, 3, 4, time.Hour)
	if err != nil || first != 4660 {
		t.Fatalf("prepare: %d, %v", first, err)
	}
	if got := rec.last().(*protocol.PrepareS3ObjectRequest); got.PreparedCount != 4 || got.TimeToLiveMillis != 3600000 {
		t.Fatalf("sent %+v", got)
	}

	res, err := c.CommitStreamSetObject(ctx, controller.CommitRequest{
		NodeID: 3, NodeEpoch: 1717171717171, ObjectID: 4660, OrderID: 4660, ObjectSize: 5273,
		StreamRanges:  []protocol.ObjectStreamRange{{StreamID: 3, StreamEpoch: -1, StartOffset: 64, EndOffset: 100}},
		StreamObjects: []protocol.StreamObject{{ObjectID: 4661, ObjectSize: 10, StreamID: 4, EndOffset: 5, Attributes: 4}},
		FailoverMode:  true, Attributes: 12,
	})
	if err != nil || res.Version != 1 || res.Attributes != 12 || res.Redundant {
		t.Fatalf("commit: %+v, %v", res, err)
	}
	if got := rec.last().(*protocol.CommitStreamSetObjectRequest); got.Version != 1 || got.Attributes != 12 || got.StreamObjects[0].Attributes != 4 || !got.FailoverMode {
		t.Fatalf("sent %+v", got)
	}

	closed, err := c.CloseStreams(ctx, 3, 1717171717171, []controller.CloseStream{{StreamID: 3, StreamEpoch: 1}, {StreamID: 1 << 62, StreamEpoch: 1<<62 - 1}})
	if err != nil || len(closed) != 2 || closed[1].StreamID != 1<<62 || closed[1].Err != nil {
		t.Fatalf("close: %+v, %v", closed, err)
	}

	opened, err := c.OpenStreams(ctx, 4, 99, []controller.OpenStream{{StreamID: 3, StreamEpoch: 2, Tags: []protocol.Tag{{Key: "topic", Value: "orders"}}}, {StreamID: 5, StreamEpoch: 1}})
	if err != nil || len(opened) != 2 || opened[1].NextOffset != 101 {
		t.Fatalf("open: %+v, %v", opened, err)
	}
	if got := rec.last().(*protocol.OpenStreamsRequest); got.Version != 1 || got.OpenStreamRequests[0].Tags[0].Value != "orders" {
		t.Fatalf("sent %+v", got)
	}

	nodes, err := c.GetNodes(ctx, []int32{3, 1000})
	if err != nil || len(nodes) != 2 || nodes[1].NodeID != 1000 || nodes[0].NodeEpoch != 1717171717171 || nodes[0].Tags[0].Key != "zone" {
		t.Fatalf("nodes: %+v, %v", nodes, err)
	}

	// Nothing to close or open sends nothing.
	before := f.count(protocol.KeyCloseStreams)
	if r, err := c.CloseStreams(ctx, 3, 1, nil); err != nil || r != nil || f.count(protocol.KeyCloseStreams) != before {
		t.Fatalf("empty close: %v %v", r, err)
	}
}

func TestInvalidArguments(t *testing.T) {
	f, _ := healthy(t)
	c := newClient(t, []string{f.addr})
	ctx := ctxFor(t, 10*time.Second)
	for name, call := range map[string]func() error{
		"negative node": func() error { _, err := c.GetOpeningStreams(ctx, -1, 1, false); return err },
		"count 0":       func() error { _, err := c.PrepareS3Object(ctx, 1, 0, time.Hour); return err },
		"ttl 0":         func() error { _, err := c.PrepareS3Object(ctx, 1, 1, 0); return err },
		"object -2": func() error {
			_, err := c.CommitStreamSetObject(ctx, controller.CommitRequest{ObjectID: -2})
			return err
		},
		"ranges without object": func() error {
			_, err := c.CommitStreamSetObject(ctx, controller.CommitRequest{ObjectID: -1, StreamRanges: []protocol.ObjectStreamRange{{}}})
			return err
		},
		"tag not UTF-8": func() error {
			_, err := c.OpenStreams(ctx, 1, 1, []controller.OpenStream{{Tags: []protocol.Tag{{Key: "\xff"}}}})
			return err
		},
	} {
		if err := call(); !errors.Is(err, controller.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if n := f.count(protocol.KeyPrepareS3Object) + f.count(protocol.KeyCommitStreamSetObject) + f.count(protocol.KeyOpenStreams); n != 0 {
		t.Fatalf("%d invalid requests reached the controller", n)
	}
}

// TestWalksVoters: a dead address and a standby come first; the call finds
// the active controller, and the next call goes to it directly.
func TestWalksVoters(t *testing.T) {
	standby, _ := healthy(t)
	standby.setStandby(true)
	active, rec := healthy(t)
	dead := deadAddr(t)
	c := newClient(t, []string{dead, standby.addr, active.addr})
	ctx := ctxFor(t, 20*time.Second)

	if _, err := c.GetNodes(ctx, []int32{1}); err != nil {
		t.Fatal(err)
	}
	if c.Controller() != active.addr || standby.count(protocol.KeyAutomqGetNodes) != 1 {
		t.Fatalf("controller %q, standby asked %d times", c.Controller(), standby.count(protocol.KeyAutomqGetNodes))
	}
	// OpenStreams is not repeatable, but a standby's NOT_CONTROLLER and a
	// refused connection did nothing: it walks them too, and from the
	// remembered controller first.
	if _, err := c.OpenStreams(ctx, 1, 1, []controller.OpenStream{{StreamID: 7, StreamEpoch: 1}}); err != nil {
		t.Fatal(err)
	}
	if standby.count(protocol.KeyOpenStreams) != 0 || len(rec.reqs) != 2 {
		t.Fatalf("the remembered controller was not asked first (standby saw %d opens)", standby.count(protocol.KeyOpenStreams))
	}
	// Leadership moves: the old controller becomes a standby and the
	// standby the controller.
	active.setStandby(true)
	rec2 := &recorder{}
	standby.setHandler(rec2.handle)
	standby.setStandby(false)
	if _, err := c.GetOpeningStreams(ctx, 1, 1, false); err != nil {
		t.Fatal(err)
	}
	if c.Controller() != standby.addr {
		t.Fatalf("controller %q after the move, want %q", c.Controller(), standby.addr)
	}
}

// TestNoController: every voter is dead or a standby; the call gives up
// after its rounds and says what each voter did.
func TestNoController(t *testing.T) {
	standby, _ := healthy(t)
	standby.setStandby(true)
	dead := deadAddr(t)
	c := newClient(t, []string{standby.addr, dead}, func(c *controller.Config) { c.Attempts = 3 })
	_, err := c.GetOpeningStreams(ctxFor(t, 20*time.Second), 1, 1, true)
	var nc *controller.NoControllerError
	if !errors.Is(err, controller.ErrNoController) || !errors.As(err, &nc) || !errors.Is(err, protocol.ErrNotController) || !errors.Is(err, kerr.NotController) {
		t.Fatalf("err %v", err)
	}
	if nc.Rounds != 3 || len(nc.Failures) != 2 || standby.count(protocol.KeyGetOpeningStreams) != 3 {
		t.Fatalf("rounds %d, failures %+v, standby asked %d times", nc.Rounds, nc.Failures, standby.count(protocol.KeyGetOpeningStreams))
	}
	msg := err.Error()
	for _, want := range []string{"get the opening streams of node 1", standby.addr + ": GetOpeningStreams answered NOT_CONTROLLER (41)", dead + ": "} {
		if !strings.Contains(msg, want) {
			t.Fatalf("%q does not say %q", msg, want)
		}
	}
	if c.Controller() != "" {
		t.Fatalf("Controller() = %q with none found", c.Controller())
	}
}

// TestDeadlines: a controller that never answers costs each attempt its
// request timeout, and the call's context ends it early.
func TestDeadlines(t *testing.T) {
	f := newFake(t)
	f.setHandler(func(protocol.RequestHeader, kmsg.Request) reply { return reply{hang: true} })
	// Long enough for a loaded machine to connect within it.
	timeout := testutil.Deadline(time.Second)
	c := newClient(t, []string{f.addr}, func(c *controller.Config) { c.RequestTimeout = timeout; c.Attempts = 2 })

	start := time.Now()
	_, err := c.GetOpeningStreams(ctxFor(t, 60*time.Second), 1, 1, true)
	if !errors.Is(err, controller.ErrNoController) || !strings.Contains(err.Error(), f.addr+": no answer within the request timeout of "+timeout.String()) {
		t.Fatalf("err %v", err)
	}
	if f.count(protocol.KeyGetOpeningStreams) != 2 {
		t.Fatalf("a repeatable call was sent %d times in 2 rounds", f.count(protocol.KeyGetOpeningStreams))
	}
	if d := time.Since(start); d < 2*timeout || d > testutil.Deadline(60*time.Second) {
		t.Fatalf("two attempts of %s took %s", timeout, d)
	}

	// The caller's deadline is shorter than an attempt.
	c2 := newClient(t, []string{f.addr}, func(c *controller.Config) { c.RequestTimeout = 10 * time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = c2.GetNodes(ctx, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, controller.ErrNoController) {
		t.Fatalf("err %v", err)
	}

	// A request that is not safe to repeat is sent once: its outcome is
	// unknown.
	before := f.count(protocol.KeyOpenStreams)
	_, err = c.OpenStreams(ctxFor(t, 60*time.Second), 1, 1, []controller.OpenStream{{StreamID: 1, StreamEpoch: 1}})
	if !errors.Is(err, controller.ErrOutcomeUnknown) || f.count(protocol.KeyOpenStreams) != before+1 {
		t.Fatalf("err %v, sent %d times", err, f.count(protocol.KeyOpenStreams)-before)
	}
}

// TestBadAnswers: garbage, a frame cut in the middle, an unknown error
// code and a list of the wrong length are clear errors.
func TestBadAnswers(t *testing.T) {
	cases := []struct {
		name  string
		reply reply
		call  func(*controller.Client, context.Context) error
		want  []error
		sent  int // times the request reached the controller (2 rounds)
	}{
		{"garbage, repeatable", reply{raw: []byte{0xde, 0xad, 0xbe, 0xef, 0xff, 0xff}},
			func(c *controller.Client, ctx context.Context) error {
				_, err := c.GetOpeningStreams(ctx, 1, 1, true)
				return err
			},
			[]error{controller.ErrNoController, protocol.ErrTruncated}, 2},
		{"garbage, not repeatable", reply{raw: []byte{0, 0, 0, 0, 0, 0, 0x07, 0xff}},
			func(c *controller.Client, ctx context.Context) error {
				_, err := c.OpenStreams(ctx, 1, 1, []controller.OpenStream{{StreamID: 1}})
				return err
			},
			[]error{controller.ErrOutcomeUnknown, protocol.ErrTruncated}, 1},
		{"cut in the middle", reply{cut: true, resp: &protocol.GetOpeningStreamsResponse{StreamMetadataList: make([]protocol.StreamMetadata, 20)}},
			func(c *controller.Client, ctx context.Context) error {
				_, err := c.GetOpeningStreams(ctx, 1, 1, true)
				return err
			},
			[]error{controller.ErrNoController, io.ErrUnexpectedEOF}, 2},
		{"unknown error code", reply{resp: &protocol.PrepareS3ObjectResponse{ErrorCode: 777}},
			func(c *controller.Client, ctx context.Context) error {
				_, err := c.PrepareS3Object(ctx, 1, 1, time.Hour)
				return err
			},
			[]error{protocol.ErrUnknownCode}, 1},
		{"final error code", reply{resp: &protocol.GetOpeningStreamsResponse{ErrorCode: protocol.ErrNodeEpochExpired.Code}},
			func(c *controller.Client, ctx context.Context) error {
				_, err := c.GetOpeningStreams(ctx, 1, 1, true)
				return err
			},
			[]error{protocol.ErrNodeEpochExpired}, 1},
		{"retriable code, repeatable", reply{resp: &protocol.CommitStreamSetObjectResponse{ErrorCode: kerr.RequestTimedOut.Code}},
			func(c *controller.Client, ctx context.Context) error {
				_, err := c.CommitStreamSetObject(ctx, controller.CommitRequest{ObjectID: 5})
				return err
			},
			[]error{controller.ErrNoController, protocol.ErrRequestTimedOut, kerr.RequestTimedOut}, 2},
		{"retriable code, not repeatable", reply{resp: &protocol.OpenStreamsResponse{ErrorCode: kerr.RequestTimedOut.Code}},
			func(c *controller.Client, ctx context.Context) error {
				_, err := c.OpenStreams(ctx, 1, 1, []controller.OpenStream{{StreamID: 1}})
				return err
			},
			[]error{protocol.ErrRequestTimedOut}, 1},
		{"wrong number of results", reply{resp: &protocol.CloseStreamsResponse{CloseStreamResponses: make([]protocol.CloseStreamResponse, 1)}},
			func(c *controller.Client, ctx context.Context) error {
				_, err := c.CloseStreams(ctx, 1, 1, []controller.CloseStream{{StreamID: 1}, {StreamID: 2}})
				return err
			},
			[]error{controller.ErrBadAnswer}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			var key int16
			f.setHandler(func(h protocol.RequestHeader, req kmsg.Request) reply {
				key = h.APIKey
				return tc.reply
			})
			c := newClient(t, []string{f.addr})
			err := tc.call(c, ctxFor(t, 30*time.Second))
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Fatalf("err %v\nis not %v", err, w)
				}
			}
			if got := f.count(key); got != tc.sent {
				t.Fatalf("sent %d times, want %d", got, tc.sent)
			}
		})
	}
}

// TestPerStreamResults: a close that fails for some streams says which.
func TestPerStreamResults(t *testing.T) {
	f := newFake(t)
	f.setHandler(func(_ protocol.RequestHeader, req kmsg.Request) reply {
		n := len(req.(*protocol.CloseStreamsRequest).CloseStreamRequests)
		resp := &protocol.CloseStreamsResponse{CloseStreamResponses: make([]protocol.CloseStreamResponse, n)}
		resp.CloseStreamResponses[4].ErrorCode = protocol.ErrStreamFenced.Code
		resp.CloseStreamResponses[7].ErrorCode = protocol.ErrRedundantOperation.Code
		return reply{resp: resp}
	})
	c := newClient(t, []string{f.addr})
	var streams []controller.CloseStream
	for i := range 10 {
		streams = append(streams, controller.CloseStream{StreamID: int64(100 + i), StreamEpoch: 2})
	}
	res, err := c.CloseStreams(ctxFor(t, 20*time.Second), 3, 77, streams)
	if !errors.Is(err, protocol.ErrStreamFenced) || len(res) != 10 {
		t.Fatalf("err %v, %d results", err, len(res))
	}
	for i, r := range res {
		switch {
		case r.StreamID != int64(100+i):
			t.Fatalf("result %d is stream %d", i, r.StreamID)
		case i == 4:
			var api *protocol.APIError
			if !errors.Is(r.Err, protocol.ErrStreamFenced) || !errors.As(r.Err, &api) || api.Item != "stream 104 (epoch 2)" {
				t.Fatalf("stream 104: %v", r.Err)
			}
		case i == 7:
			if r.Err != nil || !r.Redundant {
				t.Fatalf("stream 107: %+v", r)
			}
		case r.Err != nil || r.Redundant:
			t.Fatalf("stream %d: %+v", r.StreamID, r)
		}
	}
	if !strings.Contains(err.Error(), "close 10 streams of node 3 (epoch 77): 1 refused: CloseStreams answered STREAM_FENCED (503) for stream 104 (epoch 2)") {
		t.Fatalf("message %q", err)
	}
}

// TestVersionZeroController: a controller that speaks
// CommitStreamSetObject and OpenStreams v0 only gets v0, and what v0 cannot
// carry is refused before anything is sent.
func TestVersionZeroController(t *testing.T) {
	f, rec := healthy(t, func(f *fakeController) {
		f.apis[protocol.KeyCommitStreamSetObject] = 0
		f.apis[protocol.KeyOpenStreams] = 0
	})
	c := newClient(t, []string{f.addr})
	ctx := ctxFor(t, 20*time.Second)
	_, err := c.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: 1, ObjectID: 5, Attributes: 4})
	if !errors.Is(err, controller.ErrUnsupportedByController) || !errors.Is(err, protocol.ErrFieldNotInVersion) || !strings.Contains(err.Error(), "speaks CommitStreamSetObject up to v0") {
		t.Fatalf("err %v", err)
	}
	_, err = c.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: 1, ObjectID: 5,
		StreamObjects: []protocol.StreamObject{{ObjectID: 6, Attributes: 262153}}})
	if !errors.Is(err, controller.ErrUnsupportedByController) || !strings.Contains(err.Error(), "streamObjects[0].attributes") {
		t.Fatalf("err %v", err)
	}
	_, err = c.OpenStreams(ctx, 1, 1, []controller.OpenStream{{StreamID: 1, Tags: []protocol.Tag{{Key: "k"}}}})
	if !errors.Is(err, controller.ErrUnsupportedByController) {
		t.Fatalf("err %v", err)
	}
	if f.count(protocol.KeyCommitStreamSetObject)+f.count(protocol.KeyOpenStreams) != 0 {
		t.Fatal("a refused request reached the controller")
	}
	res, err := c.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: 1, ObjectID: 5})
	if err != nil || res.Version != 0 || rec.last().(*protocol.CommitStreamSetObjectRequest).Version != 0 {
		t.Fatalf("v0 commit: %+v %v", res, err)
	}
}

func TestRedundantCommitIsDone(t *testing.T) {
	f := newFake(t)
	f.setHandler(func(protocol.RequestHeader, kmsg.Request) reply {
		return reply{resp: &protocol.CommitStreamSetObjectResponse{ErrorCode: protocol.ErrRedundantOperation.Code}}
	})
	c := newClient(t, []string{f.addr})
	res, err := c.CommitStreamSetObject(ctxFor(t, 20*time.Second), controller.CommitRequest{NodeID: 1, ObjectID: 5, FailoverMode: true})
	if err != nil || !res.Redundant || res.Version != 1 {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestNotAutoMQ(t *testing.T) {
	f, _ := healthy(t, func(f *fakeController) { delete(f.apis, protocol.KeyCommitStreamSetObject) })
	c := newClient(t, []string{f.addr})
	_, err := c.CommitStreamSetObject(ctxFor(t, 20*time.Second), controller.CommitRequest{NodeID: 1, ObjectID: 5})
	if !errors.Is(err, controller.ErrNotAutoMQ) || !errors.Is(err, controller.ErrNoController) ||
		!strings.Contains(err.Error(), "lists no CommitStreamSetObject (key 506)") {
		t.Fatalf("err %v", err)
	}
}

func TestClosedClient(t *testing.T) {
	f, _ := healthy(t)
	c := newClient(t, []string{f.addr})
	c.Close()
	if _, err := c.GetNodes(context.Background(), nil); !errors.Is(err, controller.ErrClosed) {
		t.Fatalf("err %v", err)
	}
}

// TestConcurrentCalls runs calls from several goroutines (under -race).
func TestConcurrentCalls(t *testing.T) {
	standby, _ := healthy(t)
	standby.setStandby(true)
	active, _ := healthy(t)
	c := newClient(t, []string{standby.addr, active.addr})
	ctx := ctxFor(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				if _, err := c.GetOpeningStreams(ctx, int32(i), 1, false); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
