package controller_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"walden/automq/controller"
	"walden/automq/devcontroller"
	"walden/automq/protocol"
	"walden/internal/testutil"
)

// devQuorum starts the development AutoMQ controller with three voters on
// listeners of the test, voter 2 active.
func devQuorum(t *testing.T, cfg devcontroller.Config) *devcontroller.Controller {
	t.Helper()
	q, err := devcontroller.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lns := []net.Listener{testutil.Listen(t, "127.0.0.1"), testutil.Listen(t, "127.0.0.1"), testutil.Listen(t, "127.0.0.1")}
	if err := q.Start(lns...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if err := q.SetActive(2); err != nil {
		t.Fatal(err)
	}
	return q
}

// TestFailoverAgainstDevController runs AutoMQ's failover sequence through
// the client against the development controller: a broker opens and
// commits, the failover fences it, commits its WAL's records and closes its
// streams as it, and a new leader opens them at the new end offsets; the
// active voter moves in the middle.
func TestFailoverAgainstDevController(t *testing.T) {
	q := devQuorum(t, devcontroller.Config{
		ClusterID: "golden-cluster",
		Streams:   []int64{10, 11},
		Nodes:     []devcontroller.NodeRegistration{{NodeID: 1, NodeEpoch: 1000, WALConfig: "0@file:///wal"}},
	})
	c := newClient(t, q.Addrs())
	ctx := ctxFor(t, 60*time.Second)
	const dead, deadEpoch = int32(1), int64(1000)

	// The broker starts: it registers its epoch, opens its streams and
	// commits one object of its WAL.
	if _, err := c.GetOpeningStreams(ctx, dead, deadEpoch, false); err != nil {
		t.Fatal(err)
	}
	if c.Controller() != q.Addrs()[1] {
		t.Fatalf("Controller() = %q, want voter 2 %q", c.Controller(), q.Addrs()[1])
	}
	opened, err := c.OpenStreams(ctx, dead, deadEpoch, []controller.OpenStream{{StreamID: 10, StreamEpoch: 0}, {StreamID: 11, StreamEpoch: 0}})
	if err != nil || opened[0].NextOffset != 0 {
		t.Fatalf("open: %+v %v", opened, err)
	}
	id, err := c.PrepareS3Object(ctx, dead, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: dead, NodeEpoch: deadEpoch, ObjectID: id, OrderID: id, ObjectSize: 100,
		StreamRanges: []protocol.ObjectStreamRange{{StreamID: 10, StreamEpoch: -1, StartOffset: 0, EndOffset: 10}}}); err != nil {
		t.Fatal(err)
	}

	// The broker dies. The failover reads its epoch, fences it and gets
	// its open streams.
	nodes, err := c.GetNodes(ctx, []int32{dead})
	if err != nil || len(nodes) != 1 || nodes[0].NodeEpoch != deadEpoch {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	streams, err := c.GetOpeningStreams(ctx, dead, deadEpoch, true)
	if err != nil || len(streams) != 2 || streams[0].StreamID != 10 || streams[0].EndOffset != 10 || streams[1].EndOffset != 0 {
		t.Fatalf("opening streams: %+v %v", streams, err)
	}
	// A zombie's own commit is fenced now.
	_, err = c.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: dead, NodeEpoch: deadEpoch, ObjectID: id + 1, OrderID: id + 1,
		StreamRanges: []protocol.ObjectStreamRange{{StreamID: 10, StreamEpoch: -1, StartOffset: 10, EndOffset: 11}}})
	if !errors.Is(err, protocol.ErrNodeFenced) {
		t.Fatalf("zombie commit: %v", err)
	}

	// The active controller moves; the client finds it.
	if err := q.SetActive(3); err != nil {
		t.Fatal(err)
	}
	first, err := c.PrepareS3Object(ctx, dead, 2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if c.Controller() != q.Addrs()[2] {
		t.Fatalf("Controller() = %q after the move, want voter 3", c.Controller())
	}
	// A range that does not start at the stream's end offset.
	_, err = c.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: dead, NodeEpoch: deadEpoch, ObjectID: first, OrderID: first, FailoverMode: true,
		StreamRanges: []protocol.ObjectStreamRange{{StreamID: 10, StreamEpoch: -1, StartOffset: 9, EndOffset: 15}}})
	if !errors.Is(err, protocol.ErrOffsetNotMatched) {
		t.Fatalf("misplaced range: %v", err)
	}
	// The WAL's records: a stream-set object for stream 10, a stream
	// object for stream 11; committed twice, as after a lost answer.
	commit := controller.CommitRequest{NodeID: dead, NodeEpoch: deadEpoch, ObjectID: first, OrderID: first, ObjectSize: 500, FailoverMode: true,
		Attributes:    4,
		StreamRanges:  []protocol.ObjectStreamRange{{StreamID: 10, StreamEpoch: -1, StartOffset: 10, EndOffset: 15}},
		StreamObjects: []protocol.StreamObject{{ObjectID: first + 1, ObjectSize: 300, StreamID: 11, StartOffset: 0, EndOffset: 7, Attributes: 4}}}
	res, err := c.CommitStreamSetObject(ctx, commit)
	if err != nil || res.Version != 1 {
		t.Fatalf("failover commit: %+v %v", res, err)
	}
	if _, err := c.CommitStreamSetObject(ctx, commit); err != nil {
		t.Fatalf("repeated commit: %v", err)
	}

	// A new leader cannot open before the failover closed the streams.
	const leader, leaderEpoch = int32(2), int64(2000)
	if _, err := c.GetOpeningStreams(ctx, leader, leaderEpoch, false); err != nil {
		t.Fatal(err)
	}
	res2, err := c.OpenStreams(ctx, leader, leaderEpoch, []controller.OpenStream{{StreamID: 10, StreamEpoch: 1}})
	if !errors.Is(err, protocol.ErrStreamNotClosed) || !errors.Is(res2[0].Err, protocol.ErrStreamNotClosed) {
		t.Fatalf("open before close: %+v %v", res2, err)
	}

	// The failover closes them as the dead node, twice (a repeat after a
	// lost answer is harmless).
	for range 2 {
		closed, err := c.CloseStreams(ctx, dead, deadEpoch, []controller.CloseStream{{StreamID: 10, StreamEpoch: 0}, {StreamID: 11, StreamEpoch: 0}})
		if err != nil || len(closed) != 2 {
			t.Fatalf("close: %+v %v", closed, err)
		}
	}
	opened, err = c.OpenStreams(ctx, leader, leaderEpoch, []controller.OpenStream{{StreamID: 10, StreamEpoch: 1}, {StreamID: 11, StreamEpoch: 1}})
	if err != nil || opened[0].NextOffset != 15 || opened[1].NextOffset != 7 {
		t.Fatalf("open after the failover: %+v %v", opened, err)
	}
	// The closed streams were reopened: closing them again as the dead
	// node is refused, stream by stream.
	closed, err := c.CloseStreams(ctx, dead, deadEpoch, []controller.CloseStream{{StreamID: 10, StreamEpoch: 0}})
	if !errors.Is(err, protocol.ErrStreamFenced) || closed[0].Err == nil {
		t.Fatalf("stale close: %+v %v", closed, err)
	}
	// An older epoch of the dead node is expired.
	if _, err := c.GetOpeningStreams(ctx, dead, deadEpoch-1, true); !errors.Is(err, protocol.ErrNodeEpochExpired) {
		t.Fatalf("older epoch: %v", err)
	}
}

// TestStandbyAnswersStreamByStream: AutoMQ 1.4.1's standby controllers
// answer OpenStreams and CloseStreams with NOT_CONTROLLER in every stream's
// code (0 at the top); the client moves to the active one, as it does for
// the other APIs' top-level NOT_CONTROLLER.
func TestStandbyAnswersStreamByStream(t *testing.T) {
	q := devQuorum(t, devcontroller.Config{ClusterID: "c", Streams: []int64{10, 11}})
	c := newClient(t, q.Addrs())
	ctx := ctxFor(t, 30*time.Second)
	if _, err := c.GetOpeningStreams(ctx, 1, 1000, false); err != nil {
		t.Fatal(err)
	}
	// The client knows voter 2; the active one moves before the open.
	if err := q.SetActive(1); err != nil {
		t.Fatal(err)
	}
	opened, err := c.OpenStreams(ctx, 1, 1000, []controller.OpenStream{{StreamID: 10, StreamEpoch: 0}, {StreamID: 11, StreamEpoch: 0}})
	if err != nil || len(opened) != 2 || c.Controller() != q.Addrs()[0] {
		t.Fatalf("open after the move: %+v %v (controller %s)", opened, err, c.Controller())
	}
	if err := q.SetActive(3); err != nil {
		t.Fatal(err)
	}
	closed, err := c.CloseStreams(ctx, 1, 1000, []controller.CloseStream{{StreamID: 10, StreamEpoch: 0}, {StreamID: 11, StreamEpoch: 0}})
	if err != nil || len(closed) != 2 || c.Controller() != q.Addrs()[2] {
		t.Fatalf("close after the move: %+v %v (controller %s)", closed, err, c.Controller())
	}
}

func TestDevControllerSASL(t *testing.T) {
	q := devQuorum(t, devcontroller.Config{
		ClusterID: "c",
		Streams:   []int64{1},
		SASL:      &devcontroller.SASLConfig{Users: map[string]string{"walden": "s3cret"}},
	})
	for _, mech := range []string{controller.SASLPlain, controller.SASLScramSHA256, controller.SASLScramSHA512} {
		c := newClient(t, q.Addrs(), func(c *controller.Config) {
			c.SASL = controller.SASL{Mechanism: mech, Username: "walden", Password: "s3cret"}
		})
		if _, err := c.GetOpeningStreams(ctxFor(t, 30*time.Second), 5, 1, false); err != nil {
			t.Fatalf("%s: %v", mech, err)
		}
	}
}
