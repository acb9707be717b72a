package fsm_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

func TestOpenStream(t *testing.T) {
	h := newHarness(t)
	e1 := h.register("b1") // 1
	e2 := h.register("b2") // 2
	open := func(b string, e, id uint64) *waldenv1.OpenStreamRequest {
		return &waldenv1.OpenStreamRequest{BrokerId: b, BrokerEpoch: e, StreamId: id}
	}
	st := h.ok(open("b1", e1, 10)).GetOpenStream().GetStream()
	if st.GetEpoch() != 1 || st.GetState() != fsm.StreamOpened || st.GetOwnerBrokerId() != "b1" || st.GetOwnerEpoch() != e1 {
		t.Fatalf("created stream = %v", st)
	}
	// A retried open by the same owner and epoch answers the stream as is.
	if st := h.ok(open("b1", e1, 10)).GetOpenStream().GetStream(); st.GetEpoch() != 1 {
		t.Fatalf("retried open = %v", st)
	}
	h.refuse(open("b2", e2, 10), refusal.ErrStreamNotClosed)
	h.refuse(open("b9", 1, 10), refusal.ErrUnknownNode)
	h.refuse(open("b1", e1+1, 11), refusal.ErrEpochExpired)
	h.refuse(open("b1", 0, 11), refusal.ErrEpochExpired)

	// A restarted owner takes its stream back with a newer epoch.
	e1b := h.register("b1")
	st = h.ok(open("b1", e1b, 10)).GetOpenStream().GetStream()
	if st.GetEpoch() != 2 || st.GetOwnerEpoch() != e1b {
		t.Fatalf("taken back = %v", st)
	}
	// Closed → another broker opens it with epoch+1.
	h.ok(&waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: e1b, StreamId: 10, StreamEpoch: 2})
	st = h.ok(open("b2", e2, 10)).GetOpenStream().GetStream()
	if st.GetEpoch() != 3 || st.GetOwnerBrokerId() != "b2" {
		t.Fatalf("reopened = %v", st)
	}
	// A fenced broker's open is NODE_FENCED.
	h.declare("b2")
	h.refuse(open("b2", e2, 12), refusal.ErrNodeFenced)
}

func TestCommitObject(t *testing.T) {
	h := newHarness(t)
	e1 := h.register("b1")
	e2 := h.register("b2")
	for _, id := range []uint64{1, 2} {
		h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: id})
	}
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: 3})
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 4})
	h.ok(&waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 4, StreamEpoch: 1})
	commit := func(b string, e uint64, o *waldenv1.Object) *waldenv1.CommitObjectRequest {
		return &waldenv1.CommitObjectRequest{BrokerId: b, BrokerEpoch: e, Object: o}
	}

	res := h.ok(commit("b1", e1, obj("o1", rng(1, 1, 0, 10), rng(2, 1, 0, 5)))).GetCommitObject()
	if res.GetRedundant() || len(res.GetStreams()) != 2 || res.GetStreams()[0].GetEndOffset() != 10 || res.GetStreams()[1].GetEndOffset() != 5 {
		t.Fatalf("commit = %v", res)
	}
	if o := res.GetObject(); o.GetBrokerId() != "b1" || o.GetBrokerEpoch() != e1 || o.GetCommittedIndex() != h.index || o.GetFailover() {
		t.Fatalf("object = %v", o)
	}

	cases := []struct {
		name string
		op   *waldenv1.CommitObjectRequest
		want error
	}{
		{"no object id", commit("b1", e1, obj("", rng(1, 1, 10, 20))), refusal.ErrInvalidArgument},
		{"no ranges", commit("b1", e1, obj("o2")), refusal.ErrInvalidArgument},
		{"empty range", commit("b1", e1, obj("o2", rng(1, 1, 10, 10))), refusal.ErrInvalidArgument},
		{"stream twice", commit("b1", e1, obj("o2", rng(1, 1, 10, 20), rng(1, 1, 20, 30))), refusal.ErrInvalidArgument},
		{"unknown broker", commit("b9", 1, obj("o2", rng(1, 1, 10, 20))), refusal.ErrUnknownNode},
		{"epoch never issued", commit("b1", 100, obj("o2", rng(1, 1, 10, 20))), refusal.ErrEpochExpired},
		{"unknown stream", commit("b1", e1, obj("o2", rng(1, 1, 10, 20), rng(9, 1, 0, 1))), refusal.ErrUnknownStream},
		{"closed stream", commit("b1", e1, obj("o2", rng(4, 1, 0, 1))), refusal.ErrStreamNotOpened},
		{"other owner's stream", commit("b1", e1, obj("o2", rng(1, 1, 10, 20), rng(3, 1, 0, 1))), refusal.ErrNotOwner},
		{"old stream epoch", commit("b1", e1, obj("o2", rng(1, 0, 10, 20))), refusal.ErrEpochExpired},
		{"gap", commit("b1", e1, obj("o2", rng(1, 1, 11, 20))), refusal.ErrOffsetMismatch},
		{"overlap, second range bad (all or nothing)", commit("b1", e1, obj("o2", rng(1, 1, 10, 20), rng(2, 1, 4, 9))), refusal.ErrOffsetMismatch},
		{"failover context of no job", &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: e1, Object: obj("o2", rng(1, 1, 10, 20)),
			Failover: &waldenv1.FailoverContext{JobId: "job-b1-9", Attempt: 1, Token: 9}}, refusal.ErrUnknownJob},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			h.refuse(c.op, c.want)
		})
	}
	h.t = t

	// The same object id again is a redundant success that changes nothing.
	before := domainSnapshot(t, h.s)
	res = h.ok(commit("b1", e1, obj("o1", rng(1, 1, 0, 10), rng(2, 1, 0, 5)))).GetCommitObject()
	if !res.GetRedundant() || res.GetObject().GetCommittedIndex() == h.index {
		t.Fatalf("redundant commit = %v", res)
	}
	if !protoEqual(before, domainSnapshot(t, h.s)) {
		t.Fatal("redundant commit changed the state")
	}

	h.ok(commit("b1", e1, obj("o2", rng(1, 1, 10, 20))))
	h.ok(commit("b1", e1, obj("o3", rng(2, 1, 5, 6), rng(1, 1, 20, 25))))
	ids := func(objs []*waldenv1.Object) (out []string) {
		for _, o := range objs {
			out = append(out, o.GetObjectId())
		}
		return out
	}
	if got := ids(h.s.StreamObjects(1, 0, 0)); len(got) != 3 || got[0] != "o1" || got[2] != "o3" {
		t.Fatalf("StreamObjects(1) = %v", got)
	}
	if got := ids(h.s.StreamObjects(1, 10, 1)); len(got) != 1 || got[0] != "o2" {
		t.Fatalf("StreamObjects(1, from 10, max 1) = %v", got)
	}
	if st := h.stream(1); st.GetEndOffset() != 25 || st.GetObjects() != 3 {
		t.Fatalf("stream 1 = %v", st)
	}
	if _, ok := h.s.Object("o3"); !ok {
		t.Fatal("Object(o3) not found")
	}

	// A restarted broker must take its streams back before committing.
	e1b := h.register("b1")
	h.refuse(commit("b1", e1b, obj("o4", rng(1, 1, 25, 30))), refusal.ErrNotOwner)
	h.refuse(commit("b1", e1, obj("o4", rng(1, 1, 25, 30))), refusal.ErrEpochExpired)
}

func TestCloseStream(t *testing.T) {
	h := newHarness(t)
	e1 := h.register("b1")
	e2 := h.register("b2")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 1})
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 2})
	closeReq := func(b string, e, id, se uint64) *waldenv1.CloseStreamRequest {
		return &waldenv1.CloseStreamRequest{BrokerId: b, BrokerEpoch: e, StreamId: id, StreamEpoch: se}
	}
	h.refuse(closeReq("b1", e1, 9, 1), refusal.ErrUnknownStream)
	h.refuse(closeReq("b2", e2, 1, 1), refusal.ErrNotOwner)
	h.refuse(closeReq("b1", e1, 1, 2), refusal.ErrEpochExpired)
	h.refuse(closeReq("b1", e1+7, 1, 1), refusal.ErrEpochExpired)
	h.refuse(closeReq("b9", 1, 1, 1), refusal.ErrUnknownNode)
	st := h.ok(closeReq("b1", e1, 1, 1)).GetCloseStream().GetStream()
	if st.GetState() != fsm.StreamClosed {
		t.Fatalf("closed = %v", st)
	}
	// Closing a closed stream succeeds and changes nothing.
	before := domainSnapshot(t, h.s)
	h.ok(closeReq("b1", e1, 1, 1))
	if !protoEqual(before, domainSnapshot(t, h.s)) {
		t.Fatal("closing a closed stream changed the state")
	}
	if got := h.s.OpeningStreams("b1"); len(got) != 1 || got[0].GetStreamId() != 2 {
		t.Fatalf("OpeningStreams = %v", got)
	}
	if got := h.s.Streams("", fsm.StreamClosed); len(got) != 1 || got[0].GetStreamId() != 1 {
		t.Fatalf("Streams(closed) = %v", got)
	}
	// A fenced broker closes only in failover mode.
	h.declare("b1")
	h.refuse(closeReq("b1", e1, 2, 1), refusal.ErrNodeFenced)
}

func TestCheckBroker(t *testing.T) {
	h := newHarness(t)
	e1 := h.register("b1")
	h.register("b2")
	if err := h.s.CheckBroker("b1", e1, nil); err != nil {
		t.Fatalf("CheckBroker current = %v", err)
	}
	d := h.declare("b1")
	j := h.job(d.GetJobId())
	cases := []struct {
		name   string
		broker string
		epoch  uint64
		fo     *waldenv1.FailoverContext
		want   error
	}{
		{"zombie", "b1", e1, nil, refusal.ErrNodeFenced},
		{"zombie with the new epoch", "b1", j.GetToken(), nil, refusal.ErrNodeFenced},
		{"unknown broker", "b9", 1, nil, refusal.ErrUnknownNode},
		{"failover", "b1", e1, fo(j), nil},
		{"job of another broker", "b2", 2, fo(j), refusal.ErrUnknownJob},
		{"stale attempt", "b1", e1, &waldenv1.FailoverContext{JobId: j.GetJobId(), Attempt: 2, Token: j.GetToken()}, refusal.ErrStaleAttempt},
		{"old token", "b1", e1, &waldenv1.FailoverContext{JobId: j.GetJobId(), Attempt: 1, Token: e1}, refusal.ErrEpochExpired},
	}
	for _, c := range cases {
		err := h.s.CheckBroker(c.broker, c.epoch, c.fo)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errorsIs(err, c.want)) {
			t.Errorf("%s: CheckBroker = %v, want %v", c.name, err, c.want)
		}
	}
	h.ok(&waldenv1.CancelJob{JobId: j.GetJobId()})
	if err := h.s.CheckBroker("b1", e1, fo(j)); !errorsIs(err, refusal.ErrJobNotRunning) {
		t.Fatalf("CheckBroker after cancel = %v", err)
	}
}

// TestProducerTables: a commit's producer summary is merged into the
// stream's table, which the next open hands to the new owner; a summary
// that does not fit the object is refused and changes nothing.
func TestProducerTables(t *testing.T) {
	h := newHarness(t)
	e1 := h.register("b1")
	e2 := h.register("b2")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 1})
	ps := func(id, seq uint64, count uint32, off uint64) *waldenv1.ProducerState {
		return &waldenv1.ProducerState{ProducerId: id, Sequence: seq, Count: count, Offset: off}
	}
	commit := func(id string, r *waldenv1.ObjectRange, sps ...*waldenv1.StreamProducers) *waldenv1.CommitObjectRequest {
		return &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: e1, Object: obj(id, r), Producers: sps}
	}
	h.ok(commit("o1", rng(1, 1, 0, 10), &waldenv1.StreamProducers{StreamId: 1, Producers: []*waldenv1.ProducerState{ps(5, 0, 4, 0), ps(6, 0, 6, 4)}}))
	h.ok(commit("o2", rng(1, 1, 10, 12), &waldenv1.StreamProducers{StreamId: 1, Producers: []*waldenv1.ProducerState{ps(5, 4, 2, 10)}}))
	for name, op := range map[string]*waldenv1.CommitObjectRequest{
		"stream not in the object": commit("o3", rng(1, 1, 12, 14), &waldenv1.StreamProducers{StreamId: 2, Producers: []*waldenv1.ProducerState{ps(5, 6, 1, 12)}}),
		"batch outside the range":  commit("o3", rng(1, 1, 12, 14), &waldenv1.StreamProducers{StreamId: 1, Producers: []*waldenv1.ProducerState{ps(5, 6, 3, 12)}}),
		"producer id 0":            commit("o3", rng(1, 1, 12, 14), &waldenv1.StreamProducers{StreamId: 1, Producers: []*waldenv1.ProducerState{ps(0, 6, 1, 12)}}),
		"count 0":                  commit("o3", rng(1, 1, 12, 14), &waldenv1.StreamProducers{StreamId: 1, Producers: []*waldenv1.ProducerState{ps(5, 6, 0, 12)}}),
		"producer twice": commit("o3", rng(1, 1, 12, 14), &waldenv1.StreamProducers{StreamId: 1,
			Producers: []*waldenv1.ProducerState{ps(5, 6, 1, 12), ps(5, 7, 1, 13)}}),
	} {
		t.Run(name, func(t *testing.T) { h.refuse(op, refusal.ErrInvalidArgument) })
	}
	// The recovery's commit of a fenced broker's tail carries its
	// producers too.
	h.declare("b1")
	j := h.s.Jobs("b1", waldenv1.JobState_JOB_STATE_UNSPECIFIED)[0]
	h.ok(&waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: j.GetToken(), Failover: fo(j), Object: obj("o4", rng(1, 1, 12, 13)),
		Producers: []*waldenv1.StreamProducers{{StreamId: 1, Producers: []*waldenv1.ProducerState{ps(6, 6, 1, 12)}}}})
	h.ok(&waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: j.GetToken(), StreamId: 1, StreamEpoch: 1, Failover: fo(j)})
	res := h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: 1}).GetOpenStream()
	want := []*waldenv1.ProducerState{ps(5, 4, 2, 10), ps(6, 6, 1, 12)}
	if len(res.GetProducers()) != 2 || !proto.Equal(res.GetProducers()[0], want[0]) || !proto.Equal(res.GetProducers()[1], want[1]) {
		t.Fatalf("producers handed to the new owner: %v, want %v", res.GetProducers(), want)
	}
}
