package fsm_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
)

// stateView is every stream, job and broker of a state and its newest
// events (an entry appends a few at most).
func stateView(s *fsm.State) *waldenv1.StateSnapshot {
	return &waldenv1.StateSnapshot{Streams: s.Streams("", ""), Jobs: s.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED), Brokers: s.Brokers(), Events: s.Events("", 20)}
}

// changedObjects compares two views of the state and names every stream,
// job and broker whose value differs (or that is new), and the events that
// were appended: what a full comparison says an entry changed.
func changedObjects(before, after *waldenv1.StateSnapshot) []string {
	var out []string
	streams := map[uint64]*waldenv1.Stream{}
	for _, s := range before.GetStreams() {
		streams[s.GetStreamId()] = s
	}
	for _, s := range after.GetStreams() {
		if !proto.Equal(s, streams[s.GetStreamId()]) {
			out = append(out, fmt.Sprintf("stream %d", s.GetStreamId()))
		}
	}
	jobs := map[string]*waldenv1.Job{}
	for _, j := range before.GetJobs() {
		jobs[j.GetJobId()] = j
	}
	for _, j := range after.GetJobs() {
		if !proto.Equal(j, jobs[j.GetJobId()]) {
			out = append(out, "job "+j.GetJobId())
		}
	}
	brokers := map[string]*waldenv1.Broker{}
	for _, b := range before.GetBrokers() {
		brokers[b.GetBrokerId()] = b
	}
	for _, b := range after.GetBrokers() {
		if !proto.Equal(b, brokers[b.GetBrokerId()]) {
			out = append(out, "broker "+b.GetBrokerId())
		}
	}
	var last uint64
	if n := len(before.GetEvents()); n > 0 {
		last = before.GetEvents()[n-1].GetIndex()
	}
	for _, e := range after.GetEvents() {
		if e.GetIndex() > last {
			out = append(out, fmt.Sprintf("event %d %s %s", e.GetIndex(), e.GetEventKind().Name(), e.GetMessage()))
		}
	}
	sort.Strings(out)
	return out
}

func changeNames(cs []*waldenv1.Change) []string {
	var out []string
	for _, c := range cs {
		switch v := c.GetValue().(type) {
		case *waldenv1.Change_Stream:
			out = append(out, fmt.Sprintf("stream %d", v.Stream.GetStreamId()))
		case *waldenv1.Change_Job:
			out = append(out, "job "+v.Job.GetJobId())
		case *waldenv1.Change_Broker:
			out = append(out, "broker "+v.Broker.GetBrokerId())
		case *waldenv1.Change_Event:
			out = append(out, fmt.Sprintf("event %d %s %s", v.Event.GetIndex(), v.Event.GetEventKind().Name(), v.Event.GetMessage()))
		}
	}
	sort.Strings(out)
	return out
}

// TestWatchLogHasEveryChange applies random command sequences and checks,
// after every entry, that the watch log's changes at its revision are
// exactly what a full comparison of the state before and after says
// changed, each with the value the object has now.
func TestWatchLogHasEveryChange(t *testing.T) {
	for seed := uint64(1); seed <= 2; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			h := newHarness(t)
			changedSome := 0
			for i := 0; i < 1000; i++ {
				op := randomOp(r, h.s)
				h.nowMs += int64(r.IntN(2000))
				before := stateView(h.s)
				_, err := h.apply(op)
				after := stateView(h.s)
				got, rev, cerr := h.s.Changes(h.index)
				if cerr != nil || rev != h.index {
					t.Fatalf("step %d: Changes(%d) = revision %d, %v", i, h.index, rev, cerr)
				}
				want := changedObjects(before, after)
				if err != nil && len(want) > 0 {
					t.Fatalf("step %d %T refused (%v) but changed %v", i, op, err, want)
				}
				if fmt.Sprint(changeNames(got)) != fmt.Sprint(want) {
					t.Fatalf("step %d %T %v: watch log %v, the state changed %v", i, op, op, changeNames(got), want)
				}
				for _, c := range got {
					if c.GetRevision() != h.index {
						t.Fatalf("step %d: change at revision %d, entry %d", i, c.GetRevision(), h.index)
					}
				}
				if len(want) > 0 {
					changedSome++
				}
			}
			if changedSome < 200 {
				t.Fatalf("only %d of 1000 random commands changed something", changedSome)
			}
		})
	}
}

// TestWatchLogCompactsWholeRevisions: beyond MaxChanges the oldest
// revisions are dropped whole; a watch from a dropped revision is
// ErrCompacted, from the revision after the compacted one it gets every
// change kept; a restored state knows no change before its snapshot.
func TestWatchLogCompactsWholeRevisions(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	first := h.index
	for i := 0; h.s.CompactRevision() == 0; i++ {
		h.ok(&waldenv1.SetMaintenance{BrokerId: "b1", On: i%2 == 0}) // a broker and an event each
		if i > 2*fsm.MaxChanges {
			t.Fatal("the log never compacts")
		}
	}
	c := h.s.CompactRevision()
	if _, _, err := h.s.Changes(first); !errors.Is(err, fsm.ErrCompacted) {
		t.Fatalf("Changes(%d) after compaction at %d: %v", first, c, err)
	}
	got, rev, err := h.s.Changes(c + 1)
	if err != nil || len(got) == 0 || got[0].GetRevision() != c+1 || rev != h.index || len(got) > fsm.MaxChanges {
		t.Fatalf("Changes(%d): %d changes from %d, revision %d, %v", c+1, len(got), got[0].GetRevision(), rev, err)
	}
	if got[0].GetKind() != waldenv1.WatchKind_WATCH_KIND_BROKER || got[1].GetRevision() != c+1 {
		t.Fatalf("revision %d not whole: %v %v", c+1, got[0], got[1])
	}
	r := fsm.New("demo")
	if err := r.Restore(mustSnapshot(t, h.s)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Changes(h.index); !errors.Is(err, fsm.ErrCompacted) || r.CompactRevision() != h.index {
		t.Fatalf("restored: Changes(%d) %v, compacted %d", h.index, err, r.CompactRevision())
	}
	if got, _, err := r.Changes(h.index + 1); err != nil || len(got) != 0 {
		t.Fatalf("restored: Changes after the snapshot: %v %v", got, err)
	}
	snap, srev := r.WatchSnapshot()
	if srev != h.index || len(snap) == 0 {
		t.Fatalf("WatchSnapshot: %d changes at %d", len(snap), srev)
	}
}
