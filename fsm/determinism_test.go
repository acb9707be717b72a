package fsm_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
)

// randomOp draws a command, using s (read only) to make many of them valid.
func randomOp(r *rand.Rand, s *fsm.State) any {
	brokers := []string{"b1", "b2", "b3", "b4"}
	members := []string{"c1", "c2", "c3", "c4"}
	b := brokers[r.IntN(len(brokers))]
	epoch := uint64(r.IntN(3))
	if cur, ok := s.Broker(b); ok && r.IntN(4) > 0 {
		epoch = cur.GetEpoch()
	}
	live := func() []string {
		out := []string{}
		for _, m := range members {
			if r.IntN(2) == 0 {
				out = append(out, m)
			}
		}
		return out
	}
	var job *waldenv1.Job
	if jobs := s.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED); len(jobs) > 0 {
		job = jobs[r.IntN(len(jobs))]
		var active []*waldenv1.Job
		for _, j := range jobs {
			if j.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING || j.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING {
				active = append(active, j)
			}
		}
		if len(active) > 0 && r.IntN(4) > 0 {
			job = active[r.IntN(len(active))]
		}
	} else {
		job = &waldenv1.Job{JobId: "job-none", Attempt: 1}
	}
	var fc *waldenv1.FailoverContext
	if r.IntN(2) == 0 {
		fc = &waldenv1.FailoverContext{JobId: job.GetJobId(), Attempt: job.GetAttempt(), Token: job.GetToken()}
		b = job.GetBrokerId()
	}
	stream := uint64(r.IntN(6))
	var st *waldenv1.Stream
	if cur, ok := s.Stream(stream); ok {
		st = cur
	} else {
		st = &waldenv1.Stream{StreamId: stream}
	}
	switch r.IntN(17) {
	case 0:
		return &waldenv1.RegisterBroker{BrokerId: b, AgentAddr: fmt.Sprintf("a%d", r.IntN(9))}
	case 1:
		states := []waldenv1.ObservationState{waldenv1.ObservationState_OBSERVATION_STATE_ALIVE, waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT,
			waldenv1.ObservationState_OBSERVATION_STATE_DEAD, waldenv1.ObservationState(99)}
		return &waldenv1.ObserveBroker{BrokerId: b, ObserverId: members[r.IntN(4)], ObservationState: states[r.IntN(4)]}
	case 2:
		return &waldenv1.DeclareFailed{BrokerId: b, Epoch: epoch, DryRun: r.IntN(5) == 0, LiveMembers: live(),
			Evidence: &waldenv1.Evidence{Manual: r.IntN(3) == 0}}
	case 3:
		keys := []string{"failure_timeout", "cooldown", "dry_run", "bogus"}
		vals := []string{"7s", "1m", "true", "x"}
		k := keys[r.IntN(4)]
		if r.IntN(3) == 0 {
			return &waldenv1.SetPolicy{Unset: []string{k}}
		}
		return &waldenv1.SetPolicy{Set: map[string]string{k: vals[r.IntN(4)], "restart_grace": "1s"}}
	case 4:
		return &waldenv1.AckBroker{BrokerId: b}
	case 5:
		return &waldenv1.SetMaintenance{BrokerId: b, On: r.IntN(2) == 0}
	case 6:
		return &waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: []waldenv1.EventKind{waldenv1.EventKind_EVENT_KIND_COOLDOWN, waldenv1.EventKind_EVENT_KIND_FREEZE}[r.IntN(2)], BrokerId: b}}
	case 7, 8:
		return &waldenv1.OpenStreamRequest{BrokerId: b, BrokerEpoch: epoch, StreamId: stream}
	case 9, 10:
		if fc == nil && st.GetOwnerBrokerId() != "" && r.IntN(2) == 0 {
			b, epoch = st.GetOwnerBrokerId(), st.GetOwnerEpoch()
		}
		start := st.GetEndOffset()
		if r.IntN(5) == 0 {
			start++
		}
		end := start + uint64(1+r.IntN(9))
		var prods []*waldenv1.StreamProducers
		if n := r.IntN(3); n > 0 {
			sp := &waldenv1.StreamProducers{StreamId: stream}
			for p := 0; p < n; p++ {
				// A producer id 0 now and then: refused as a whole.
				sp.Producers = append(sp.Producers, &waldenv1.ProducerState{ProducerId: uint64(r.IntN(300)), Sequence: uint64(r.IntN(50)),
					Count: 1, Offset: start + uint64(r.IntN(int(end-start)))})
			}
			prods = append(prods, sp)
		}
		return &waldenv1.CommitObjectRequest{BrokerId: b, BrokerEpoch: epoch, Failover: fc, Producers: prods,
			Object: obj(fmt.Sprintf("o%d", r.IntN(400)), rng(stream, st.GetEpoch(), start, end))}
	case 11:
		return &waldenv1.CloseStreamRequest{BrokerId: b, BrokerEpoch: epoch, StreamId: stream, StreamEpoch: st.GetEpoch(), Failover: fc}
	case 12:
		return &waldenv1.RenewJobLease{JobId: job.GetJobId(), Attempt: job.GetAttempt(), AssigneeId: job.GetAssigneeId()}
	case 13:
		return &waldenv1.ReassignJob{JobId: job.GetJobId(), Attempt: job.GetAttempt(), LiveMembers: live()}
	case 14:
		return &waldenv1.CheckpointJob{JobId: job.GetJobId(), Attempt: job.GetAttempt(), JobStep: waldenv1.Values[waldenv1.JobStep]()[r.IntN(8)],
			StepDone: r.IntN(2) == 0, BytesUploaded: uint64(r.IntN(1000))}
	case 15:
		return &waldenv1.FinishJob{JobId: job.GetJobId(), Attempt: job.GetAttempt(),
			JobState: []waldenv1.JobState{waldenv1.JobState_JOB_STATE_SUCCEEDED, waldenv1.JobState_JOB_STATE_FAILED}[r.IntN(2)], RecoveredWalOffset: int64(r.IntN(5000))}
	default:
		if r.IntN(2) == 0 {
			return &waldenv1.CancelJob{JobId: job.GetJobId()}
		}
		return &waldenv1.RetryJob{JobId: job.GetJobId(), LiveMembers: live()}
	}
}

// TestDeterminism feeds two states the same random command sequence and
// checks that every result is equal and the snapshots are byte-identical;
// a third state restored from a snapshot half way continues identically.
func TestDeterminismOfDomains(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 42))
			a, b := newHarness(t), newHarness(t)
			var c *harness
			const steps = 1500
			accepted := 0
			for i := 0; i < steps; i++ {
				op := randomOp(r, a.s)
				a.nowMs += int64(r.IntN(2000)) - 300 // proposers' clocks may disagree
				b.nowMs = a.nowMs
				ra, ea := a.apply(op)
				rb, eb := b.apply(proto.Clone(op.(proto.Message)))
				if !proto.Equal(ra, rb) || fmt.Sprint(ea) != fmt.Sprint(eb) {
					t.Fatalf("step %d %T: results differ: %v / %v, %v / %v", i, op, ra, rb, ea, eb)
				}
				if ea == nil {
					accepted++
				}
				if c != nil {
					c.nowMs = a.nowMs
					rc, ec := c.apply(proto.Clone(op.(proto.Message)))
					if !proto.Equal(ra, rc) || fmt.Sprint(ea) != fmt.Sprint(ec) {
						t.Fatalf("step %d %T: restored state differs: %v / %v, %v / %v", i, op, ra, rc, ea, ec)
					}
				}
				if i == steps/2 {
					c = newHarness(t)
					if err := c.s.Restore(mustSnapshot(t, a.s)); err != nil {
						t.Fatalf("Restore: %v", err)
					}
					c.index = a.index
				}
			}
			sa, sb, sc := mustSnapshot(t, a.s), mustSnapshot(t, b.s), mustSnapshot(t, c.s)
			if !bytes.Equal(sa, sb) || !bytes.Equal(sa, sc) {
				t.Fatal("snapshots are not byte-identical")
			}
			snap := domainSnapshot(t, a.s)
			t.Logf("%d of %d commands accepted; %d brokers, %d streams, %d objects, %d jobs, %d events",
				accepted, steps, len(snap.GetBrokers()), len(snap.GetStreams()), len(snap.GetObjects()), len(snap.GetJobs()), len(snap.GetEvents()))
			if accepted < steps/5 || len(snap.GetJobs()) == 0 || len(snap.GetObjects()) == 0 {
				t.Fatalf("the random history exercised too little: %d accepted, %d jobs, %d objects", accepted, len(snap.GetJobs()), len(snap.GetObjects()))
			}
			checkInvariants(t, a.s)
		})
	}
}

// checkInvariants checks what must hold after any history: every stream's
// committed ranges are contiguous from 0 to its end offset (nothing twice,
// no gap), at most one active job per broker, epochs below next_epoch.
func checkInvariants(t *testing.T, s *fsm.State) {
	t.Helper()
	for _, st := range s.Streams("", "") {
		next := uint64(0)
		for _, o := range s.StreamObjects(st.GetStreamId(), 0, 0) {
			for _, r := range o.GetRanges() {
				if r.GetStreamId() != st.GetStreamId() {
					continue
				}
				if r.GetStartOffset() != next {
					t.Fatalf("stream %d: object %s starts at %d, want %d", st.GetStreamId(), o.GetObjectId(), r.GetStartOffset(), next)
				}
				next = r.GetEndOffset()
			}
		}
		if next != st.GetEndOffset() {
			t.Fatalf("stream %d: objects end at %d, end offset %d", st.GetStreamId(), next, st.GetEndOffset())
		}
	}
	active := map[string]int{}
	for _, j := range s.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED) {
		if j.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING || j.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING {
			active[j.GetBrokerId()]++
			if active[j.GetBrokerId()] > 1 {
				t.Fatalf("broker %s has two active jobs", j.GetBrokerId())
			}
		}
	}
	for _, b := range s.Brokers() {
		if b.GetEpoch() >= s.NextEpoch() {
			t.Fatalf("broker %s epoch %d, next epoch %d", b.GetBrokerId(), b.GetEpoch(), s.NextEpoch())
		}
	}
}

func TestEventLogBound(t *testing.T) {
	h := newHarness(t)
	const n = fsm.MaxEvents + 150
	for i := 0; i < n; i++ {
		h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_FREEZE, Message: fmt.Sprint(i)}})
	}
	evs := h.s.Events("", 0)
	if len(evs) != fsm.MaxEvents || evs[0].GetMessage() != "150" || evs[len(evs)-1].GetMessage() != fmt.Sprint(n-1) {
		t.Fatalf("%d events, first %q, last %q", len(evs), evs[0].GetMessage(), evs[len(evs)-1].GetMessage())
	}
	if got := h.s.Events("", 3); len(got) != 3 || got[2].GetMessage() != fmt.Sprint(n-1) {
		t.Fatalf("Events(limit 3) = %v", got)
	}
	r := fsm.New("demo")
	if err := r.Restore(mustSnapshot(t, h.s)); err != nil {
		t.Fatal(err)
	}
	if got := len(r.Events("", 0)); got != fsm.MaxEvents {
		t.Fatalf("restored %d events", got)
	}
}

func TestChanged(t *testing.T) {
	h := newHarness(t)
	ch := h.s.Changed()
	h.refuse(&waldenv1.AckBroker{BrokerId: "b9"}, errUnknownNode)
	select {
	case <-ch:
		t.Fatal("Changed closed by a refused command")
	default:
	}
	h.register("b1")
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by a registration")
	}
	ch2 := h.s.Changed()
	if ch2 == ch {
		t.Fatal("Changed returned the closed channel again")
	}
	if err := h.s.Restore(mustSnapshot(t, h.s)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch2:
	default:
		t.Fatal("Changed not closed by a restore")
	}
}

// TestSnapshotRoundTripAllDomains restores a snapshot of a state with every
// domain populated and checks that it snapshots to the same bytes.
func TestSnapshotRoundTripAllDomains(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	h.register("b2")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: 1, StreamId: 3})
	h.ok(&waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: 1, Object: obj("o1", rng(3, 1, 0, 10)),
		Producers: []*waldenv1.StreamProducers{{StreamId: 3, Producers: []*waldenv1.ProducerState{{ProducerId: 7, Sequence: 4, Count: 2, Offset: 8}}}}})
	h.ok(&waldenv1.SetPolicy{Set: map[string]string{"cooldown": "5m"}})
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c2", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD})
	h.declare("b1")
	data := mustSnapshot(t, h.s)
	r := fsm.New("demo")
	if err := r.Restore(data); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, mustSnapshot(t, r)) {
		t.Fatal("restored snapshot differs")
	}
	snap := domainSnapshot(t, r)
	if snap.GetNextEpoch() != 4 || len(snap.GetBrokers()) != 2 || len(snap.GetJobs()) != 1 || len(snap.GetObjects()) != 1 ||
		len(snap.GetStreams()) != 1 || snap.GetPolicy().GetValues()["cooldown"] != "5m" || len(snap.GetEvents()) == 0 ||
		len(snap.GetProducers()) != 1 || len(r.Producers(3)) != 1 {
		t.Fatalf("snapshot = %v", snap)
	}
	if got := r.StreamObjects(3, 0, 0); len(got) != 1 {
		t.Fatalf("restored StreamObjects = %v", got)
	}
}

func TestRestoreRefusesBadDomains(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: 1, StreamId: 3})
	h.ok(&waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: 1, Object: obj("o1", rng(3, 1, 0, 10)),
		Producers: []*waldenv1.StreamProducers{{StreamId: 3, Producers: []*waldenv1.ProducerState{{ProducerId: 7, Sequence: 4, Count: 2, Offset: 8}}}}})
	h.declare("b1")
	good := domainSnapshot(t, h.s)
	cases := []struct {
		name string
		edit func(s *waldenv1.StateSnapshot)
		text string
	}{
		{"broker twice", func(s *waldenv1.StateSnapshot) { s.Brokers = append(s.Brokers, s.Brokers[0]) }, `broker "b1" twice`},
		{"broker without id", func(s *waldenv1.StateSnapshot) { s.Brokers[0].BrokerId = "" }, "broker without id"},
		{"epoch not issued", func(s *waldenv1.StateSnapshot) { s.NextEpoch = 2 }, "next epoch is 2"},
		{"stream twice", func(s *waldenv1.StateSnapshot) { s.Streams = append(s.Streams, s.Streams[0]) }, "stream 3 twice"},
		{"object of unknown stream", func(s *waldenv1.StateSnapshot) { s.Objects[0].Ranges[0].StreamId = 9 }, "unknown stream 9"},
		{"object twice", func(s *waldenv1.StateSnapshot) { s.Objects = append(s.Objects, s.Objects[0]) }, `object "o1" twice`},
		{"job of unknown broker", func(s *waldenv1.StateSnapshot) { s.Jobs[0].BrokerId = "b7" }, `unknown broker "b7"`},
		{"job twice", func(s *waldenv1.StateSnapshot) { s.Jobs = append(s.Jobs, s.Jobs[0]) }, "twice"},
		{"producers of unknown stream", func(s *waldenv1.StateSnapshot) { s.Producers[0].StreamId = 9 }, "producers of unknown stream 9"},
		{"producers twice", func(s *waldenv1.StateSnapshot) { s.Producers = append(s.Producers, s.Producers[0]) }, "producers of stream 3 twice"},
		{"producer id 0", func(s *waldenv1.StateSnapshot) { s.Producers[0].Producers[0].ProducerId = 0 }, "producer 0"},
		{"too many events", func(s *waldenv1.StateSnapshot) {
			for len(s.Events) <= fsm.MaxEvents {
				s.Events = append(s.Events, s.Events[0])
			}
		}, "events"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			snap := proto.Clone(good).(*waldenv1.StateSnapshot)
			c.edit(snap)
			data, err := proto.Marshal(snap)
			if err != nil {
				t.Fatal(err)
			}
			before := mustSnapshot(t, h.s)
			err = h.s.Restore(data)
			if !errorsIs(err, fsm.ErrInvalidSnapshot) || !bytesContains(err.Error(), c.text) {
				t.Fatalf("Restore = %v, want ErrInvalidSnapshot saying %q", err, c.text)
			}
			if !bytes.Equal(before, mustSnapshot(t, h.s)) {
				t.Fatal("a refused Restore changed the state")
			}
		})
	}
}

// TestRestoreVersion1 reads a snapshot written before brokers existed.
func TestRestoreVersion1(t *testing.T) {
	old := &waldenv1.StateSnapshot{Version: 1, ClusterName: "demo", AppliedIndex: 9, NoopCount: 4,
		Members: []*waldenv1.Member{{Id: "c1", RaftId: 1}}}
	data, err := proto.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	s := fsm.New("demo")
	if err := s.Restore(data); err != nil {
		t.Fatalf("Restore v1: %v", err)
	}
	if s.NextEpoch() != 1 || s.NoopCount() != 4 || len(s.Brokers()) != 0 || s.AppliedIndex() != 9 {
		t.Fatalf("restored v1: next epoch %d, noops %d", s.NextEpoch(), s.NoopCount())
	}
	res, err := s.Apply(10, 1, &waldenv1.Command{Op: &waldenv1.Command_RegisterBroker{RegisterBroker: &waldenv1.RegisterBroker{BrokerId: "b1"}}})
	if err != nil || res.GetRegisterBroker().GetEpoch() != 1 {
		t.Fatalf("register after v1 restore = %v, %v", res, err)
	}
}

// TestConcurrentReads runs the read methods, which mutate what they get,
// while commands are applied (meaningful under -race): the state must end
// exactly as a twin fed the same commands without readers.
func TestConcurrentReads(t *testing.T) {
	h, twin := newHarness(t), newHarness(t)
	r := rand.New(rand.NewPCG(7, 7))
	done := make(chan struct{})
	started := make(chan struct{}, 2)
	finished := make(chan struct{}, 2)
	readAndMutate := func() {
		for _, b := range h.s.Brokers() {
			b.Observations = nil
			b.Epoch++
		}
		for _, j := range h.s.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED) {
			j.Checkpoints = nil
			j.Objects = nil
		}
		for _, st := range h.s.Streams("", "") {
			st.EndOffset++
		}
		for _, e := range h.s.Events("", 10) {
			e.EventKind = waldenv1.EventKind_EVENT_KIND_STREAM
		}
		_ = h.s.StreamObjects(1, 0, 0)
		_ = h.s.CheckBroker("b1", 1, nil)
		_ = h.s.ActiveJobs()
	}
	for range 2 {
		go func() {
			defer func() { finished <- struct{}{} }()
			for i := 0; ; i++ {
				readAndMutate()
				if i == 0 {
					started <- struct{}{}
				}
				select {
				case <-h.s.Changed():
				case <-done:
					return
				}
			}
		}()
	}
	<-started
	<-started
	for range 400 {
		op := randomOp(r, h.s)
		h.nowMs += 10
		twin.nowMs = h.nowMs
		_, _ = h.apply(op)
		_, _ = twin.apply(proto.Clone(op.(proto.Message)))
	}
	close(done)
	<-finished
	<-finished
	readAndMutate()
	if !bytes.Equal(mustSnapshot(t, h.s), mustSnapshot(t, twin.s)) {
		t.Fatal("readers changed the state through the values they read")
	}
}
