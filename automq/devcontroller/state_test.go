package devcontroller

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// harness applies steps to a State at a time it controls, and checks after
// every refused step that nothing changed.
type harness struct {
	t   *testing.T
	s   *State
	now time.Time
}

func newHarness(t *testing.T, streams ...int64) *harness {
	t.Helper()
	s, err := NewState("c1", streams)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, s: s, now: t0}
}

// step is one request with the code it must get.
type step struct {
	name string
	do   func(h *harness) Code
	want Code
}

func (h *harness) run(steps []step) {
	h.t.Helper()
	for i, st := range steps {
		before := h.s.Snapshot()
		got := st.do(h)
		if got != st.want {
			h.t.Fatalf("step %d (%s): got %v, want %v", i, st.name, got, st.want)
		}
		if got != None {
			if after := h.s.Snapshot(); !reflect.DeepEqual(before, after) {
				h.t.Fatalf("step %d (%s): refused with %v but changed the state:\nbefore %+v\nafter  %+v", i, st.name, got, before, after)
			}
		}
	}
}

func opening(node int32, epoch int64, failover bool) step {
	return step{
		name: "GetOpeningStreams",
		do: func(h *harness) Code {
			_, c := h.s.GetOpeningStreams(node, epoch, failover)
			return c
		},
	}
}

func open(node int32, nodeEpoch, stream, epoch int64) step {
	return step{
		name: "OpenStream",
		do: func(h *harness) Code {
			_, c := h.s.OpenStream(node, nodeEpoch, stream, epoch)
			return c
		},
	}
}

func closeStream(node int32, nodeEpoch, stream, epoch int64) step {
	return step{
		name: "CloseStream",
		do:   func(h *harness) Code { return h.s.CloseStream(node, nodeEpoch, stream, epoch) },
	}
}

func prepare(node int32, count int32, ttl time.Duration) step {
	return step{
		name: "PrepareObjects",
		do: func(h *harness) Code {
			_, c := h.s.PrepareObjects(node, count, ttl, h.now)
			return c
		},
	}
}

func commit(c Commit) step {
	return step{
		name: "CommitStreamSetObject",
		do:   func(h *harness) Code { return h.s.CommitStreamSetObject(c, h.now) },
	}
}

func wait(d time.Duration) step {
	return step{name: "wait", do: func(h *harness) Code { h.now = h.now.Add(d); return None }}
}

func (st step) is(want Code) step { st.want = want; return st }

// rng is a commit range with AutoMQ's StreamEpoch −1.
func rng(stream, start, end int64) CommitRange {
	return CommitRange{StreamID: stream, StreamEpoch: -1, StartOffset: start, EndOffset: end}
}

func (h *harness) stream(id int64) StreamView {
	h.t.Helper()
	for _, v := range h.s.Snapshot().Streams {
		if v.StreamID == id {
			return v
		}
	}
	h.t.Fatalf("stream %d not in the snapshot", id)
	return StreamView{}
}

func (h *harness) object(id int64) ObjectView {
	h.t.Helper()
	for _, v := range h.s.Snapshot().Objects {
		if v.ObjectID == id {
			return v
		}
	}
	h.t.Fatalf("object %d not in the snapshot", id)
	return ObjectView{}
}

func TestNewStateStreamsAsCreateStreamsLeavesThem(t *testing.T) {
	h := newHarness(t, 3, 1)
	want := StreamView{StreamID: 1, Epoch: -1, State: StreamClosed, Owner: -1, RangeIndex: -1, Ranges: []RangeView{}}
	if got := h.stream(1); !reflect.DeepEqual(got, want) {
		t.Fatalf("stream 1 = %+v, want %+v", got, want)
	}
	if _, err := NewState("c", []int64{1, 1}); !errors.Is(err, ErrStreamExists) {
		t.Fatalf("duplicate stream: err = %v, want ErrStreamExists", err)
	}
	if _, err := NewState("c", []int64{-2}); !errors.Is(err, ErrInvalidStream) {
		t.Fatalf("negative stream: err = %v, want ErrInvalidStream", err)
	}
	for _, id := range []string{"", "a/b"} {
		if _, err := NewState(id, nil); !errors.Is(err, ErrInvalidClusterID) {
			t.Fatalf("cluster id %q: err = %v, want ErrInvalidClusterID", id, err)
		}
	}
}

func TestNodeEpochRules(t *testing.T) {
	const e = 1000
	cases := []struct {
		name  string
		steps []step
	}{
		{"an unknown node cannot open", []step{
			open(1, e, 1, 0).is(NodeEpochNotExist),
		}},
		{"an unknown node cannot close", []step{
			closeStream(1, e, 1, 0).is(NodeEpochNotExist),
		}},
		{"an unknown node cannot commit, even in failover mode", []step{
			prepare(1, 1, time.Minute),
			commit(Commit{NodeID: 1, NodeEpoch: e, ObjectID: 0, FailoverMode: true}).is(NodeEpochNotExist),
		}},
		{"an older epoch is expired everywhere", []step{
			opening(1, e, false),
			open(1, e, 1, 0),
			opening(1, e-1, false).is(NodeEpochExpired),
			opening(1, e-1, true).is(NodeEpochExpired),
			open(1, e-1, 1, 0).is(NodeEpochExpired),
			closeStream(1, e-1, 1, 0).is(NodeEpochExpired),
			prepare(1, 1, time.Minute),
			commit(Commit{NodeID: 1, NodeEpoch: e - 1, ObjectID: 0, Ranges: []CommitRange{rng(1, 0, 1)}}).is(NodeEpochExpired),
			commit(Commit{NodeID: 1, NodeEpoch: e - 1, ObjectID: 0, Ranges: []CommitRange{rng(1, 0, 1)}, FailoverMode: true}).is(NodeEpochExpired),
		}},
		{"a newer epoch than the recorded one passes the check", []step{
			opening(1, e, false),
			open(1, e+5, 1, 0),
			closeStream(1, e+7, 1, 0),
		}},
		{"the failover flag fences opens and plain commits, not closes or failover commits", []step{
			opening(1, e, false),
			open(1, e, 1, 0),
			open(1, e, 2, 0),
			opening(1, e, true),
			open(1, e, 3, 0).is(NodeFenced),
			open(1, e, 1, 0).is(NodeFenced),
			prepare(1, 2, time.Minute),
			commit(Commit{NodeID: 1, NodeEpoch: e, ObjectID: 0, Ranges: []CommitRange{rng(1, 0, 5)}}).is(NodeFenced),
			commit(Commit{NodeID: 1, NodeEpoch: e, ObjectID: 0, Ranges: []CommitRange{rng(1, 0, 5)}, FailoverMode: true}),
			closeStream(1, e, 1, 0),
			closeStream(1, e, 2, 0),
		}},
		{"a newer epoch registered in failover mode fences the older one too", []step{
			opening(1, e, false),
			open(1, e, 1, 0),
			opening(1, e+1, true),
			open(1, e, 2, 0).is(NodeEpochExpired),
			open(1, e+1, 2, 0).is(NodeFenced),
			closeStream(1, e, 1, 0).is(NodeEpochExpired),
			closeStream(1, e+1, 1, 0),
		}},
		{"GetOpeningStreams without failover mode clears the flag", []step{
			opening(1, e, false),
			opening(1, e, true),
			open(1, e, 1, 0).is(NodeFenced),
			opening(1, e+1, false),
			open(1, e+1, 1, 0),
		}},
		{"GetOpeningStreams with the same epoch is accepted", []step{
			opening(1, e, false),
			opening(1, e, false),
			opening(1, e, true),
			opening(1, e, true),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			newHarness(t, 1, 2, 3).run(tc.steps)
		})
	}
}

func TestGetOpeningStreams(t *testing.T) {
	h := newHarness(t, 1, 2, 3, 4)
	h.run([]step{
		opening(1, 10, false),
		opening(2, 20, false),
		open(1, 10, 3, 0),
		open(1, 10, 1, 4),
		open(2, 20, 2, 0),
		open(1, 10, 4, 0),
		closeStream(1, 10, 4, 0),
		prepare(1, 1, time.Minute),
		commit(Commit{NodeID: 1, NodeEpoch: 10, ObjectID: 0, OrderID: 0, ObjectSize: 99, Ranges: []CommitRange{rng(1, 0, 7)}}),
	})
	got, code := h.s.GetOpeningStreams(1, 11, true)
	if code != None {
		t.Fatalf("code %v", code)
	}
	want := []OpeningStream{{StreamID: 1, Epoch: 4, EndOffset: 7}, {StreamID: 3, Epoch: 0}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("opening streams = %+v, want %+v", got, want)
	}
	n := h.s.Snapshot().Nodes[0]
	if n != (NodeView{NodeID: 1, NodeEpoch: 11, FailoverMode: true, OpeningStreams: 2}) {
		t.Fatalf("node 1 = %+v", n)
	}
	if got, _ := h.s.GetOpeningStreams(3, 1, false); len(got) != 0 {
		t.Fatalf("a new node holds %+v", got)
	}
}

func TestOpenStreamRules(t *testing.T) {
	cases := []struct {
		name  string
		steps []step
		check func(h *harness)
	}{
		{"an unknown stream", []step{
			opening(1, 1, false),
			open(1, 1, 99, 0).is(StreamNotExist),
		}, nil},
		{"the first open starts a range at 0 under the request's epoch", []step{
			opening(1, 1, false),
			{name: "open with tags", do: func(h *harness) Code {
				_, c := h.s.OpenStream(1, 1, 1, 7, Tag{"topic", "orders"})
				return c
			}},
			closeStream(1, 1, 1, 7),
			{name: "open with other tags", do: func(h *harness) Code {
				_, c := h.s.OpenStream(1, 1, 1, 8, Tag{"topic", "other"})
				return c
			}},
		}, func(h *harness) {
			want := StreamView{StreamID: 1, Epoch: 8, State: StreamOpened, Owner: 1, RangeIndex: 1,
				Ranges: []RangeView{{Index: 0, NodeID: 1, Epoch: 7}, {Index: 1, NodeID: 1, Epoch: 8}},
				Tags:   []Tag{{"topic", "orders"}}}
			if got := h.stream(1); !reflect.DeepEqual(got, want) {
				h.t.Fatalf("stream = %+v, want %+v", got, want)
			}
		}},
		{"the initial epoch -1 has no range to retry", []step{
			opening(1, 1, false),
			open(1, 1, 1, -1).is(StreamInnerError),
		}, nil},
		{"a lower epoch is fenced", []step{
			opening(1, 1, false),
			open(1, 1, 1, 3),
			open(1, 1, 1, 2).is(StreamFenced),
		}, nil},
		{"the same epoch by the owner is a retry", []step{
			opening(1, 1, false),
			open(1, 1, 1, 3),
			prepare(1, 1, time.Minute),
			commit(Commit{NodeID: 1, NodeEpoch: 1, ObjectID: 0, Ranges: []CommitRange{rng(1, 0, 12)}}),
			open(1, 1, 1, 3),
		}, func(h *harness) {
			o, code := h.s.OpenStream(1, 1, 1, 3)
			if code != None || o != (Opened{StartOffset: 0, NextOffset: 12}) {
				h.t.Fatalf("retry = %+v %v", o, code)
			}
			if v := h.stream(1); v.RangeIndex != 0 || len(v.Ranges) != 1 {
				h.t.Fatalf("a retry added a range: %+v", v)
			}
		}},
		{"the same epoch by another node is fenced", []step{
			opening(1, 1, false),
			opening(2, 1, false),
			open(1, 1, 1, 3),
			open(2, 1, 1, 3).is(StreamFenced),
		}, nil},
		{"a higher epoch while another node holds it OPENED", []step{
			opening(1, 1, false),
			opening(2, 1, false),
			open(1, 1, 1, 3),
			open(2, 1, 1, 4).is(StreamNotClosed),
		}, nil},
		{"a higher epoch by the owner itself while OPENED", []step{
			opening(1, 1, false),
			open(1, 1, 1, 3),
			open(1, 1, 1, 4).is(StreamNotClosed),
		}, nil},
		{"the same epoch after the owner closed it reopens the same range", []step{
			opening(1, 1, false),
			open(1, 1, 1, 3),
			closeStream(1, 1, 1, 3),
			open(1, 1, 1, 3),
		}, func(h *harness) {
			if v := h.stream(1); v.State != StreamOpened || v.RangeIndex != 0 || v.Epoch != 3 {
				h.t.Fatalf("stream = %+v", v)
			}
		}},
		{"another node opens a closed stream at its end offset with a new range", []step{
			opening(1, 1, false),
			opening(2, 1, false),
			open(1, 1, 1, 3),
			prepare(1, 1, time.Minute),
			commit(Commit{NodeID: 1, NodeEpoch: 1, ObjectID: 0, Ranges: []CommitRange{rng(1, 0, 40)}}),
			closeStream(1, 1, 1, 3),
			open(2, 1, 1, 3).is(StreamFenced),
			open(2, 1, 1, 4),
		}, func(h *harness) {
			want := StreamView{StreamID: 1, Epoch: 4, State: StreamOpened, Owner: 2, EndOffset: 40, RangeIndex: 1,
				Ranges: []RangeView{
					{Index: 0, NodeID: 1, Epoch: 3, StartOffset: 0, EndOffset: 40},
					{Index: 1, NodeID: 2, Epoch: 4, StartOffset: 40, EndOffset: 40},
				}}
			if got := h.stream(1); !reflect.DeepEqual(got, want) {
				h.t.Fatalf("stream = %+v, want %+v", got, want)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 1, 2)
			h.run(tc.steps)
			if tc.check != nil {
				tc.check(h)
			}
		})
	}
}

func TestOpenRemovesRangesCoveredByStreamObjects(t *testing.T) {
	h := newHarness(t, 1)
	h.run([]step{
		opening(1, 1, false),
		opening(2, 1, false),
		open(1, 1, 1, 0),
		prepare(1, 1, time.Minute),
		commit(Commit{NodeID: 1, NodeEpoch: 1, ObjectID: -1, StreamObjects: []CommitStreamObject{
			{ObjectID: 0, ObjectSize: 10, StreamID: 1, StartOffset: 0, EndOffset: 10}}}),
		closeStream(1, 1, 1, 0),
		open(2, 1, 1, 1), // range 0 [0,10) is now closed, range 1 starts at 10
		prepare(2, 1, time.Minute),
		commit(Commit{NodeID: 2, NodeEpoch: 1, ObjectID: -1, StreamObjects: []CommitStreamObject{
			{ObjectID: 1, ObjectSize: 10, StreamID: 1, StartOffset: 10, EndOffset: 20}}}),
		closeStream(2, 1, 1, 1),
		open(1, 1, 1, 2),
	})
	// Stream objects cover [0,20): range 0 [0,10) is removed; range 1 was
	// the current range when the third open checked, so it stays.
	got := h.stream(1).Ranges
	want := []RangeView{
		{Index: 1, NodeID: 2, Epoch: 1, StartOffset: 10, EndOffset: 20},
		{Index: 2, NodeID: 1, Epoch: 2, StartOffset: 20, EndOffset: 20},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ranges = %+v, want %+v", got, want)
	}
}

func TestCloseStreamRules(t *testing.T) {
	cases := []struct {
		name  string
		steps []step
	}{
		{"an unknown stream", []step{
			opening(1, 1, false),
			closeStream(1, 1, 99, 0).is(StreamNotExist),
		}},
		{"a stream never opened has no range", []step{
			opening(1, 1, false),
			closeStream(1, 1, 1, -1).is(StreamInnerError),
		}},
		{"a stale stream epoch is fenced", []step{
			opening(1, 1, false),
			open(1, 1, 1, 5),
			closeStream(1, 1, 1, 4).is(StreamFenced),
		}},
		{"a stream epoch above the stream's", []step{
			opening(1, 1, false),
			open(1, 1, 1, 5),
			closeStream(1, 1, 1, 6).is(StreamInnerError),
		}},
		{"only the owner closes", []step{
			opening(1, 1, false),
			opening(2, 1, false),
			open(1, 1, 1, 5),
			closeStream(2, 1, 1, 5).is(StreamFenced),
			closeStream(1, 1, 1, 5),
		}},
		{"closing a closed stream is harmless", []step{
			opening(1, 1, false),
			open(1, 1, 1, 5),
			closeStream(1, 1, 1, 5),
			closeStream(1, 1, 1, 5),
			closeStream(1, 1, 1, 5),
		}},
		{"a closed stream reopened by another node cannot be closed by the old owner", []step{
			opening(1, 1, false),
			opening(2, 1, false),
			open(1, 1, 1, 5),
			closeStream(1, 1, 1, 5),
			open(2, 1, 1, 6),
			closeStream(1, 1, 1, 5).is(StreamFenced),
			closeStream(1, 1, 1, 6).is(StreamFenced),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			newHarness(t, 1).run(tc.steps)
		})
	}
}

func TestPrepareObjects(t *testing.T) {
	h := newHarness(t)
	first, code := h.s.PrepareObjects(1, 3, time.Hour, t0)
	if code != None || first != 0 {
		t.Fatalf("first prepare = %d %v", first, code)
	}
	first, _ = h.s.PrepareObjects(2, 2, time.Hour, t0)
	if first != 3 {
		t.Fatalf("second prepare starts at %d, want 3", first)
	}
	first, code = h.s.PrepareObjects(2, 0, time.Hour, t0)
	if code != None || first != 5 {
		t.Fatalf("count 0 = %d %v, want 5 NONE", first, code)
	}
	h.run([]step{prepare(1, -1, time.Hour).is(InvalidRequest)})
	if first, _ = h.s.PrepareObjects(1, 1, time.Hour, t0); first != 5 {
		t.Fatalf("after count 0 and a refusal the next id is %d, want 5", first)
	}
	o := h.object(4)
	if o.State != ObjectPrepared || o.PreparedBy != 2 || !o.ExpiresAt.Equal(t0.Add(time.Hour)) || o.Key != "40000000/_kafka_c1/4" {
		t.Fatalf("object 4 = %+v", o)
	}
	if got := h.s.Expire(t0.Add(time.Hour)); len(got) != 0 {
		t.Fatalf("expired at the deadline itself: %v", got)
	}
	if got := h.s.Expire(t0.Add(time.Hour + time.Millisecond)); !reflect.DeepEqual(got, []int64{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("expired = %v", got)
	}
	if h.object(4).State != ObjectMarkDestroyed {
		t.Fatalf("object 4 = %+v", h.object(4))
	}
}

// opened is the common start of the commit cases: node 1 (epoch 1) holds
// streams 1 and 2 OPENED at epoch 0, node 2 (epoch 1) holds stream 3, and
// objects 0..4 are prepared for an hour.
func opened() []step {
	return []step{
		opening(1, 1, false),
		opening(2, 1, false),
		open(1, 1, 1, 0),
		open(1, 1, 2, 0),
		open(2, 1, 3, 0),
		prepare(1, 5, time.Hour),
	}
}

func TestCommitStreamSetObjectRules(t *testing.T) {
	ok := Commit{NodeID: 1, NodeEpoch: 1, ObjectID: 0, OrderID: 0, ObjectSize: 100,
		Ranges: []CommitRange{rng(1, 0, 10), rng(2, 0, 5)}}
	with := func(f func(c *Commit)) Commit {
		c := ok
		c.Ranges = append([]CommitRange(nil), ok.Ranges...)
		f(&c)
		return c
	}
	cases := []struct {
		name  string
		steps []step
		check func(h *harness)
	}{
		{"a prepared object commits and moves the end offsets", []step{commit(ok)}, func(h *harness) {
			if e := h.stream(1).EndOffset; e != 10 {
				h.t.Fatalf("stream 1 end %d", e)
			}
			if e := h.stream(2).EndOffset; e != 5 {
				h.t.Fatalf("stream 2 end %d", e)
			}
			o := h.object(0)
			if o.State != ObjectCommitted || o.Kind != KindStreamSet || o.Size != 100 || o.NodeID != 1 ||
				!reflect.DeepEqual(o.Ranges, []ObjectRange{{1, 0, 10}, {2, 0, 5}}) {
				h.t.Fatalf("object = %+v", o)
			}
		}},
		{"an object never prepared", []step{
			commit(with(func(c *Commit) { c.ObjectID = 77 })).is(ObjectNotExist),
		}, nil},
		{"an object past its deadline", []step{
			wait(time.Hour + time.Millisecond),
			commit(ok).is(ObjectNotExist),
		}, nil},
		{"an object at its deadline still commits", []step{
			wait(time.Hour),
			commit(ok),
		}, nil},
		{"an expired object that Expire destroyed", []step{
			wait(2 * time.Hour),
			{name: "expire", do: func(h *harness) Code { h.s.Expire(h.now); return None }},
			commit(ok).is(ObjectNotExist),
		}, nil},
		{"the same object again is a redundant success that changes nothing", []step{
			commit(ok),
			{name: "commit again", do: func(h *harness) Code {
				before := h.s.Snapshot()
				again := with(func(c *Commit) { c.Ranges = []CommitRange{rng(1, 10, 20)} })
				if code := h.s.CommitStreamSetObject(again, h.now); code != None {
					return code
				}
				if !reflect.DeepEqual(before, h.s.Snapshot()) {
					h.t.Fatalf("a redundant commit changed the state")
				}
				return None
			}},
		}, nil},
		{"a stream that does not exist", []step{
			commit(with(func(c *Commit) { c.Ranges = append(c.Ranges, rng(99, 0, 1)) })).is(StreamNotExist),
		}, nil},
		{"a stream that is closed", []step{
			closeStream(1, 1, 2, 0),
			commit(ok).is(StreamNotOpened),
		}, nil},
		{"a stream another node owns", []step{
			commit(with(func(c *Commit) { c.Ranges = append(c.Ranges, rng(3, 0, 1)) })).is(StreamInnerError),
		}, nil},
		{"a range that does not start at the end offset", []step{
			commit(ok),
			prepare(1, 1, time.Hour),
			commit(with(func(c *Commit) { c.ObjectID = 1; c.Ranges = []CommitRange{rng(1, 10, 20), rng(2, 6, 9)} })).is(OffsetNotMatched),
			commit(with(func(c *Commit) { c.ObjectID = 1; c.Ranges = []CommitRange{rng(1, 11, 20)} })).is(OffsetNotMatched),
			commit(with(func(c *Commit) { c.ObjectID = 1; c.Ranges = []CommitRange{rng(1, 10, 20), rng(2, 5, 9)} })),
		}, func(h *harness) {
			if e := h.stream(1).EndOffset; e != 20 {
				h.t.Fatalf("stream 1 end %d", e)
			}
		}},
		{"a range at or below the start offset passes, as AutoMQ's fix for issue 1222 lets it", []step{
			commit(ok),
			prepare(1, 1, time.Hour),
			commit(with(func(c *Commit) { c.ObjectID = 1; c.Ranges = []CommitRange{rng(1, 0, 4)} })),
		}, func(h *harness) {
			if e := h.stream(1).EndOffset; e != 10 {
				h.t.Fatalf("the end offset went back to %d", e)
			}
		}},
		{"every range is checked against the state before the commit", []step{
			commit(with(func(c *Commit) { c.Ranges = []CommitRange{rng(1, 0, 10), rng(1, 10, 20)} })).is(OffsetNotMatched),
		}, nil},
		{"stream objects commit with the stream-set object", []step{
			commit(with(func(c *Commit) {
				c.Ranges = []CommitRange{rng(1, 0, 10)}
				c.StreamObjects = []CommitStreamObject{{ObjectID: 1, ObjectSize: 50, StreamID: 2, StartOffset: 0, EndOffset: 30, Attributes: 4}}
			})),
		}, func(h *harness) {
			if e := h.stream(2).EndOffset; e != 30 {
				h.t.Fatalf("stream 2 end %d", e)
			}
			o := h.object(1)
			if o.Kind != KindStream || o.Size != 50 || o.Attributes != 4 || !reflect.DeepEqual(o.Ranges, []ObjectRange{{2, 0, 30}}) {
				h.t.Fatalf("stream object = %+v", o)
			}
			if so := h.stream(2).StreamObjects; !reflect.DeepEqual(so, []int64{1}) {
				h.t.Fatalf("stream 2 objects %v", so)
			}
		}},
		{"stream objects alone with object id -1", []step{
			commit(Commit{NodeID: 1, NodeEpoch: 1, ObjectID: -1, StreamObjects: []CommitStreamObject{
				{ObjectID: 0, ObjectSize: 5, StreamID: 1, StartOffset: 0, EndOffset: 3},
				{ObjectID: 1, ObjectSize: 5, StreamID: 2, StartOffset: 0, EndOffset: 4},
			}}),
		}, func(h *harness) {
			if h.stream(1).EndOffset != 3 || h.stream(2).EndOffset != 4 {
				h.t.Fatalf("ends %d %d", h.stream(1).EndOffset, h.stream(2).EndOffset)
			}
		}},
		{"a stream object never prepared refuses the whole commit", []step{
			commit(with(func(c *Commit) {
				c.StreamObjects = []CommitStreamObject{{ObjectID: 70, StreamID: 3, StartOffset: 0, EndOffset: 1}}
			})).is(ObjectNotExist),
		}, nil},
		{"a stream object already committed makes the commit a redundant success", []step{
			commit(Commit{NodeID: 1, NodeEpoch: 1, ObjectID: -1, StreamObjects: []CommitStreamObject{
				{ObjectID: 1, StreamID: 1, StartOffset: 0, EndOffset: 3}}}),
			{name: "again", do: func(h *harness) Code {
				before := h.s.Snapshot()
				code := h.s.CommitStreamSetObject(with(func(c *Commit) {
					c.Ranges = []CommitRange{rng(2, 0, 5)}
					c.StreamObjects = []CommitStreamObject{{ObjectID: 1, StreamID: 1, StartOffset: 0, EndOffset: 3}}
				}), h.now)
				if !reflect.DeepEqual(before, h.s.Snapshot()) {
					h.t.Fatalf("changed the state")
				}
				return code
			}},
		}, nil},
		{"a stream object's range is checked like a range", []step{
			commit(with(func(c *Commit) {
				c.StreamObjects = []CommitStreamObject{{ObjectID: 1, StreamID: 1, StartOffset: 10, EndOffset: 20}}
			})).is(OffsetNotMatched),
		}, nil},
		{"compacted objects that do not exist", []step{
			commit(with(func(c *Commit) { c.CompactedObjectIDs = []int64{40, 41} })).is(CompactedObjectsNotFound),
		}, nil},
		{"compaction replaces the node's stream-set objects", []step{
			commit(ok),
			commit(with(func(c *Commit) { c.ObjectID = 1; c.OrderID = 1; c.Ranges = []CommitRange{rng(1, 10, 20)} })),
			commit(with(func(c *Commit) {
				c.ObjectID = 2
				c.OrderID = -1
				c.Ranges = []CommitRange{rng(1, 0, 20), rng(2, 0, 5)}
				c.CompactedObjectIDs = []int64{0, 1}
			})),
			commit(with(func(c *Commit) { c.ObjectID = 3; c.CompactedObjectIDs = []int64{0, 4} })).is(CompactedObjectsNotFound),
		}, func(h *harness) {
			if h.object(0).State != ObjectMarkDestroyed || h.object(1).State != ObjectMarkDestroyed {
				h.t.Fatalf("compacted objects not destroyed")
			}
			if o := h.object(2); o.State != ObjectCommitted || o.OrderID != 0 {
				h.t.Fatalf("compacted object = %+v", o)
			}
		}},
		{"compacting another node's object", []step{
			commit(ok),
			{name: "node 2 compacts node 1's object", do: func(h *harness) Code {
				return h.s.CommitStreamSetObject(Commit{NodeID: 2, NodeEpoch: 1, ObjectID: 1, CompactedObjectIDs: []int64{0, 88}}, h.now)
			}, want: CompactedObjectsNotFound},
			{name: "node 2 compacts node 1's committed object", do: func(h *harness) Code {
				return h.s.CommitStreamSetObject(Commit{NodeID: 2, NodeEpoch: 1, ObjectID: 1, CompactedObjectIDs: []int64{0}}, h.now)
			}, want: UnknownServerError},
		}, nil},
		{"a single compacted id equal to the object id replaces its attributes", []step{
			commit(with(func(c *Commit) { c.ObjectID = 3; c.CompactedObjectIDs = []int64{3}; c.Attributes = 4 })).is(ObjectNotCommitted),
			commit(with(func(c *Commit) { c.ObjectID = 70; c.CompactedObjectIDs = []int64{70} })).is(ObjectNotExist),
			commit(ok),
			commit(with(func(c *Commit) { c.CompactedObjectIDs = []int64{0}; c.Attributes = 12 })),
		}, func(h *harness) {
			if o := h.object(0); o.Attributes != 12 || h.stream(1).EndOffset != 10 {
				h.t.Fatalf("object %+v", o)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 1, 2, 3)
			h.run(append(opened(), tc.steps...))
			if tc.check != nil {
				tc.check(h)
			}
		})
	}
}

func TestRegisterAndGetNodes(t *testing.T) {
	h := newHarness(t, 1)
	for _, r := range []NodeRegistration{
		{NodeID: 2, NodeEpoch: 50, WALConfig: "0@file:///wal/2"},
		{NodeID: 1, NodeEpoch: 40, Tags: []Tag{{"zone", "a"}}},
	} {
		if code, err := h.s.RegisterNode(r); code != None || err != nil {
			t.Fatalf("register %+v: %v %v", r, code, err)
		}
	}
	if code, _ := h.s.RegisterNode(NodeRegistration{NodeID: 2, NodeEpoch: 49}); code != NodeEpochExpired {
		t.Fatalf("older registration: %v", code)
	}
	if _, err := h.s.RegisterNode(NodeRegistration{NodeID: 3, State: "DEAD"}); !errors.Is(err, ErrInvalidNode) {
		t.Fatalf("bad state: %v", err)
	}
	h.run([]step{opening(1, 40, false), open(1, 40, 1, 0)})
	if ok, err := h.s.SetNodeState(2, NodeFencedState); !ok || err != nil {
		t.Fatalf("set state: %v %v", ok, err)
	}
	all := h.s.GetNodes(nil)
	want := []NodeInfo{
		{NodeRegistration: NodeRegistration{NodeID: 1, NodeEpoch: 40, State: NodeActive, Tags: []Tag{{"zone", "a"}}}, HasOpeningStreams: true},
		{NodeRegistration: NodeRegistration{NodeID: 2, NodeEpoch: 50, WALConfig: "0@file:///wal/2", State: NodeFencedState}},
	}
	if !reflect.DeepEqual(all, want) {
		t.Fatalf("all nodes = %+v, want %+v", all, want)
	}
	some := h.s.GetNodes([]int32{2, 9, 1})
	if len(some) != 2 || some[0].NodeID != 2 || some[1].NodeID != 1 {
		t.Fatalf("asked 2, 9, 1: %+v", some)
	}
}

// TestFailoverSequence plays the failover of the reference: node 1 dies with
// streams OPENED; the failover fences it, commits its WAL's records and
// closes its streams as node 1; node 2's opens get STREAM_NOT_CLOSED until
// then and succeed at the new end offsets after.
func TestFailoverSequence(t *testing.T) {
	const dead, e1 = int32(1), int64(1_700_000_000_000)
	const heir, e2 = int32(2), int64(1_700_000_000_500)
	h := newHarness(t, 10, 11, 12)
	h.run([]step{
		opening(dead, e1, false),
		opening(heir, e2, false),
		open(dead, e1, 10, 3),
		open(dead, e1, 11, 0),
		prepare(dead, 1, time.Minute),
		commit(Commit{NodeID: dead, NodeEpoch: e1, ObjectID: 0, OrderID: 0, ObjectSize: 10, Ranges: []CommitRange{rng(10, 0, 100)}}),
		// node 1 is killed; the controller moves leadership to node 2.
		open(heir, e2, 10, 4).is(StreamNotClosed),
		open(heir, e2, 11, 1).is(StreamNotClosed),
	})
	streams, code := h.s.GetOpeningStreams(dead, e1, true)
	want := []OpeningStream{{StreamID: 10, Epoch: 3, EndOffset: 100}, {StreamID: 11, Epoch: 0}}
	if code != None || !reflect.DeepEqual(streams, want) {
		t.Fatalf("failover GetOpeningStreams = %+v %v", streams, code)
	}
	h.run([]step{
		// The zombie is fenced now.
		open(dead, e1, 12, 0).is(NodeFenced),
		commit(Commit{NodeID: dead, NodeEpoch: e1, ObjectID: 0, Ranges: []CommitRange{rng(10, 100, 101)}}).is(NodeFenced),
		prepare(dead, 1, time.Hour),
		commit(Commit{NodeID: dead, NodeEpoch: e1, ObjectID: 1, OrderID: 1, ObjectSize: 20, FailoverMode: true,
			Ranges: []CommitRange{rng(10, 100, 130), rng(11, 0, 7)}}),
		// A retry after a lost answer is a redundant success.
		commit(Commit{NodeID: dead, NodeEpoch: e1, ObjectID: 1, OrderID: 1, ObjectSize: 20, FailoverMode: true,
			Ranges: []CommitRange{rng(10, 100, 130), rng(11, 0, 7)}}),
		open(heir, e2, 10, 4).is(StreamNotClosed),
		closeStream(dead, e1, 10, 3),
		closeStream(dead, e1, 11, 0),
		closeStream(dead, e1, 11, 0),
	})
	o, code := h.s.OpenStream(heir, e2, 10, 4)
	if code != None || o != (Opened{StartOffset: 0, NextOffset: 130}) {
		t.Fatalf("heir's open of 10 = %+v %v", o, code)
	}
	o, code = h.s.OpenStream(heir, e2, 11, 1)
	if code != None || o != (Opened{StartOffset: 0, NextOffset: 7}) {
		t.Fatalf("heir's open of 11 = %+v %v", o, code)
	}
	// The dead node restarts with a new epoch: it holds nothing and is no
	// longer fenced.
	streams, code = h.s.GetOpeningStreams(dead, e1+10_000, false)
	if code != None || len(streams) != 0 {
		t.Fatalf("restart GetOpeningStreams = %+v %v", streams, code)
	}
	h.run([]step{open(dead, e1+10_000, 12, 0)})
}
