package fsm_test

import (
	"testing"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// TestRemoveBroker: a registration goes only when nothing depends on it:
// refused (changing nothing) while a recovery job of the broker is pending
// or running and while it owns an opened stream; removed with an event
// naming the actor otherwise; the id registers again with a new epoch.
func TestRemoveBroker(t *testing.T) {
	h := newHarness(t)
	h.refuse(&waldenv1.RemoveBroker{BrokerId: "nobody"}, refusal.ErrUnknownNode)

	// A bogus registration with nothing attached goes.
	ghost := h.register("b9")
	res := h.ok(&waldenv1.RemoveBroker{BrokerId: "b9", Actor: "root"})
	if res.GetBroker().GetBrokerId() != "b9" || res.GetBroker().GetEpoch() != ghost {
		t.Fatalf("removed %v", res.GetBroker())
	}
	if _, ok := h.s.Broker("b9"); ok {
		t.Fatal("b9 still registered")
	}
	ev := h.s.Events("b9", 1)
	if len(ev) != 1 || ev[0].GetEventKind() != waldenv1.EventKind_EVENT_KIND_REMOVE || ev[0].GetActor() != "root" {
		t.Fatalf("event %v", ev)
	}

	// A broker that owns an opened stream stays.
	epoch := h.register("b1")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: 7})
	err := h.refuse(&waldenv1.RemoveBroker{BrokerId: "b1"}, refusal.ErrStreamNotClosed)
	if refusal.Of(err) != "STREAM_NOT_CLOSED" || !bytesContains(err.Error(), "opened streams 7") {
		t.Fatalf("refusal %v", err)
	}

	// Failed over: its recovery job is pending, then running; it stays.
	d := h.declare("b1")
	h.refuse(&waldenv1.RemoveBroker{BrokerId: "b1"}, refusal.ErrRecoveryRunning)
	j := h.job(d.GetJobId())
	h.ok(&waldenv1.RenewJobLease{JobId: j.GetJobId(), Attempt: j.GetAttempt(), AssigneeId: j.GetAssigneeId()})
	if h.job(d.GetJobId()).GetJobState() != waldenv1.JobState_JOB_STATE_RUNNING {
		t.Fatalf("job %v", h.job(d.GetJobId()))
	}
	h.refuse(&waldenv1.RemoveBroker{BrokerId: "b1"}, refusal.ErrRecoveryRunning)
	// The job closes the stream and finishes: now the registration may go.
	j = h.job(d.GetJobId())
	h.ok(&waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: 7, StreamEpoch: 1, Failover: fo(j)})
	h.ok(&waldenv1.FinishJob{JobId: j.GetJobId(), Attempt: j.GetAttempt(), JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED})
	h.ok(&waldenv1.RemoveBroker{BrokerId: "b1", Actor: "root"})
	if again := h.register("b1"); again <= d.GetNewEpoch() {
		t.Fatalf("registered again with epoch %d, after %d", again, d.GetNewEpoch())
	}
	if st := h.stream(7); st.GetState() != fsm.StreamClosed {
		t.Fatalf("stream %v", st)
	}
}
