package fsm_test

import (
	"strings"
	"testing"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// TestBlockedJobAndItsResolution (issue 21, finding 6): a job whose step
// failed for too long enters blocked with the reason and stops being
// executed; only an operator's resolution with a reason (an audited event)
// or a retry starts it again; --wal-lost is recorded in the job.
func TestBlockedJobAndItsResolution(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	d := h.declare("b1")
	id := d.GetJobId()
	if err := h.refuse(&waldenv1.BlockJob{JobId: id, Attempt: 1}, refusal.ErrInvalidArgument); err == nil {
		t.Fatal("a block without its reason was applied")
	}
	h.refuse(&waldenv1.BlockJob{JobId: id, Attempt: 2, Error: "x"}, refusal.ErrStaleAttempt)
	h.refuse(&waldenv1.ResolveJob{JobId: id, Reason: "gone", WalLost: true}, refusal.ErrRecoveryRunning)

	h.ok(&waldenv1.BlockJob{JobId: id, Attempt: 1, JobStep: waldenv1.JobStep_JOB_STEP_ATTACH,
		Error: "stat /var/lib/broker/b1.wal: no such file or directory", FailingMs: 600_000})
	j := h.job(id)
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_BLOCKED || !strings.Contains(j.GetError(), "no such file") || j.GetBlockedUnixMs() == 0 {
		t.Fatalf("job after block: %v", j)
	}
	if b := h.broker("b1"); b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_FAILED || !b.GetFenced() {
		t.Fatalf("broker of a blocked job: %v", b)
	}
	// A blocked attempt is not current any more: its checkpoints are refused.
	h.refuse(&waldenv1.CheckpointJob{JobId: id, Attempt: 1, JobStep: waldenv1.JobStep_JOB_STEP_ATTACH}, refusal.ErrJobNotRunning)

	before := domainSnapshot(t, h.s)
	h.refuse(&waldenv1.ResolveJob{JobId: id, WalLost: true}, refusal.ErrInvalidArgument)
	if after := domainSnapshot(t, h.s); len(after.GetEvents()) != len(before.GetEvents()) || h.job(id).GetJobState() != waldenv1.JobState_JOB_STATE_BLOCKED {
		t.Fatal("a resolution without a reason changed the job")
	}
	h.ok(&waldenv1.ResolveJob{JobId: id, Reason: "host lost with its disk", Actor: "alice", WalLost: true, LiveMembers: []string{"c2"}})
	j = h.job(id)
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_PENDING || j.GetAttempt() != 2 || !j.GetWalLost() ||
		j.GetResolution() != "host lost with its disk" || j.GetAssigneeId() != "c2" || j.GetError() != "" {
		t.Fatalf("job after resolve: %v", j)
	}
	events := domainSnapshot(t, h.s).GetEvents()
	last := events[len(events)-1]
	if last.GetActor() != "alice" || last.GetEventKind() != waldenv1.EventKind_EVENT_KIND_JOB ||
		!strings.Contains(last.GetMessage(), "WAL declared lost") || !strings.Contains(last.GetMessage(), "host lost with its disk") {
		t.Fatalf("resolution event: %v", last)
	}

	// Blocked again, then retried by an operator: wal_lost stays.
	h.ok(&waldenv1.BlockJob{JobId: id, Attempt: 2, Error: "s3: access denied"})
	h.ok(&waldenv1.RetryJob{JobId: id, LiveMembers: []string{"c1"}})
	if j := h.job(id); j.GetAttempt() != 3 || j.GetJobState() != waldenv1.JobState_JOB_STATE_PENDING || !j.GetWalLost() {
		t.Fatalf("job retried after a block: %v", j)
	}
	// A blocked job may be cancelled.
	h.ok(&waldenv1.BlockJob{JobId: id, Attempt: 3, Error: "s3: access denied"})
	h.ok(&waldenv1.CancelJob{JobId: id, Actor: "alice"})
	if j := h.job(id); j.GetJobState() != waldenv1.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("job cancelled after a block: %v", j)
	}
}

// TestForceNewClusterRevokesAndMovesEpochs (issue 21, finding 4): after a
// lost quorum the survivor's log may lack registrations, failovers and
// stream opens the lost members committed: every broker epoch is revoked
// and the fencing token and stream epochs move past what the log issued;
// the event says what may be lost.
func TestForceNewClusterRevokesAndMovesEpochs(t *testing.T) {
	h := newHarness(t)
	e1 := h.register("b1")
	h.register("b2")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 7})
	streamEpoch := h.stream(7).GetEpoch()
	h.refuse(&waldenv1.ForceNewCluster{NodeId: "c3", LastIndex: 9}, refusal.ErrInvalidArgument)
	h.ok(&waldenv1.ForceNewCluster{NodeId: "c3", LastIndex: 9, CommitIndex: 8, Term: 4, EpochBump: 1000, Removed: []string{"c1", "c2"}})
	for _, id := range []string{"b1", "b2"} {
		if b := h.broker(id); !b.GetFenced() || b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_FAILED {
			t.Fatalf("%s after force new cluster: %v", id, b)
		}
	}
	if got := h.stream(7).GetEpoch(); got != streamEpoch+1000 {
		t.Fatalf("stream epoch %d, want %d", got, streamEpoch+1000)
	}
	if e := h.register("b1"); e <= 1000 {
		t.Fatalf("epoch %d issued after force new cluster, want beyond the bump", e)
	}
	events := domainSnapshot(t, h.s).GetEvents()
	var ev *waldenv1.Event
	for _, e := range events {
		if e.GetEventKind() == waldenv1.EventKind_EVENT_KIND_FORCE_NEW_CLUSTER {
			ev = e
		}
	}
	if ev == nil || !strings.Contains(ev.GetMessage(), "index 9") || !strings.Contains(ev.GetMessage(), "is lost") || !strings.Contains(ev.GetMessage(), "c1, c2") {
		t.Fatalf("force new cluster event: %v", ev)
	}
}

// TestDecisionOfAnEpochNeverGrantedNeedsNoWAL (issue 21): a broker epoch
// that no majority of the voters ever granted a lease acknowledged
// nothing: when the broker's earlier epochs were recovered before it
// registered, its job reads no WAL (a WAL never written or gone blocks
// nothing), and the decision says why. One voter's word is not enough,
// nor a majority's for a broker that restarted without a failover (its old
// WAL's tail may not be committed yet).
func TestDecisionOfAnEpochNeverGrantedNeedsNoWAL(t *testing.T) {
	attest := func(h *harness, broker string, never ...bool) {
		for i, n := range never {
			h.ok(&waldenv1.ObserveBroker{ObserverId: []string{"c1", "c2", "c3"}[i], BrokerId: broker,
				ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD, LeaseExpired: true, NeverGranted: n})
		}
	}
	decide := func(h *harness, broker string) *waldenv1.Job {
		b := h.broker(broker)
		res := h.ok(&waldenv1.DeclareFailed{BrokerId: broker, Epoch: b.GetEpoch(), Term: 1, LiveMembers: []string{"c1"},
			Evidence: &waldenv1.Evidence{Reason: "test"}})
		return h.job(res.GetDeclareFailed().GetJobId())
	}
	h := withChecks(newHarness(t))
	h.register("b1")
	if !h.broker("b1").GetPriorRecovered() || h.broker("b1").GetRegisteredIndex() != h.index {
		t.Fatalf("first registration: %v", h.broker("b1"))
	}
	attest(h, "b1", true, true, false)
	j := decide(h, "b1")
	if !j.GetAcknowledgedNothing() {
		t.Fatalf("job of an epoch two of three never granted: %v", j)
	}
	events := h.s.Events("b1", 0)
	if msg := events[len(events)-1].GetMessage(); !strings.Contains(msg, "reads no WAL") || !strings.Contains(msg, "c1, c2") {
		t.Fatalf("decision event: %q", msg)
	}

	// One voter of three: the WAL is read.
	h.register("b2")
	attest(h, "b2", true, false, false)
	if j := decide(h, "b2"); j.GetAcknowledgedNothing() {
		t.Fatalf("job of an epoch one of three never granted: %v", j)
	}

	// A broker registered again without a failover (a restart): its old
	// WAL's tail may be in the WAL only; the WAL is read.
	h.register("b3")
	h.register("b3")
	if h.broker("b3").GetPriorRecovered() {
		t.Fatalf("a restart without failover: %v", h.broker("b3"))
	}
	attest(h, "b3", true, true, true)
	if j := decide(h, "b3"); j.GetAcknowledgedNothing() {
		t.Fatalf("job of a restarted broker: %v", j)
	}
	// c3 replaced under its name after b4 registered: the former c3 may
	// have granted b4's epoch, so the new c3's word does not count.
	h.register("b4")
	h.index++
	if err := h.s.ApplyConfChange(h.index, remove(rid("c3")), nil, nil); err != nil {
		t.Fatal(err)
	}
	h.index++
	if err := h.s.ApplyConfChange(h.index, addVoter(rid("c3")), memberCtx("c3"), nil); err != nil {
		t.Fatal(err)
	}
	attest(h, "b4", false, true, true)
	if j := decide(h, "b4"); j.GetAcknowledgedNothing() {
		t.Fatalf("job counting a replacement's word for an epoch registered before it: %v", j)
	}
	// After a failover whose job succeeded, the next registration is clean.
	j3 := h.s.Jobs("b3", 0)[0]
	h.ok(&waldenv1.FinishJob{JobId: j3.GetJobId(), Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED})
	h.register("b3")
	if !h.broker("b3").GetPriorRecovered() {
		t.Fatalf("registration after a recovered failover: %v", h.broker("b3"))
	}
}
