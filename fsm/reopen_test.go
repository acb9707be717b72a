package fsm_test

import (
	"testing"

	waldenv1 "walden/proto/walden/v1"
)

// TestFailoverCountsReopenedStreams: the streams a recovery job closed in
// failover mode count as reopened on the job when another broker opens
// them, with the times of the first and the last; a stream the broker
// closed itself does not.
func TestFailoverCountsReopenedStreams(t *testing.T) {
	h := newHarness(t)
	e1 := h.register("b1")
	e2 := h.register("b2")
	for _, id := range []uint64{1, 2, 3} {
		h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: id})
	}
	// Stream 3 is closed by b1 itself, before the failover.
	h.ok(&waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 3, StreamEpoch: 1})
	res := h.ok(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: e1, LiveMembers: []string{"c1"}, Evidence: &waldenv1.Evidence{DecidedBy: "c1"}})
	jobID, token := res.GetDeclareFailed().GetJobId(), res.GetDeclareFailed().GetNewEpoch()
	fo := &waldenv1.FailoverContext{JobId: jobID, Attempt: 1, Token: token}
	for _, id := range []uint64{1, 2} {
		h.ok(&waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: id, StreamEpoch: 1, Failover: fo})
	}
	if st, _ := h.s.Stream(1); st.GetClosedByJobId() != jobID {
		t.Fatalf("stream 1 closed by %q, want %q", st.GetClosedByJobId(), jobID)
	}
	if j := h.job(jobID); j.GetStreamsReopened() != 0 || j.GetReopenedUnixMs() != 0 {
		t.Fatalf("reopened before any open: %v", j)
	}

	h.nowMs += 250
	first := h.nowMs
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: 1})
	h.nowMs += 500
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: 3})
	if j := h.job(jobID); j.GetStreamsReopened() != 1 || j.GetFirstReopenedUnixMs() != first || j.GetReopenedUnixMs() != first {
		t.Fatalf("after one reopen: reopened %d first %d last %d, want 1 %d %d", j.GetStreamsReopened(),
			j.GetFirstReopenedUnixMs(), j.GetReopenedUnixMs(), first, first)
	}
	h.nowMs += 250
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: 2})
	j := h.job(jobID)
	if j.GetStreamsReopened() != 2 || j.GetFirstReopenedUnixMs() != first || j.GetReopenedUnixMs() != h.nowMs {
		t.Fatalf("after both: reopened %d first %d last %d", j.GetStreamsReopened(), j.GetFirstReopenedUnixMs(), j.GetReopenedUnixMs())
	}
	// Closed and opened again later by b2 itself: not the failover's.
	h.ok(&waldenv1.CloseStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: 1, StreamEpoch: 2})
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b2", BrokerEpoch: e2, StreamId: 1})
	if got := h.job(jobID).GetStreamsReopened(); got != 2 {
		t.Fatalf("a later open counted on the failover: %d", got)
	}
	if st, _ := h.s.Stream(2); st.GetClosedByJobId() != "" {
		t.Fatalf("stream 2 still names the job after its reopen")
	}
}
