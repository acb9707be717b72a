package fsm_test

import (
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// legacyHistory drives h through every kind of state the named values
// appear in, spelling them as walden did before the enums: the strings of
// the deprecated fields only (ObserveBroker.state, the evidence's
// observations, CheckpointJob.step, FinishJob.state, RecordEvent's kind).
// The same history, applied by the walden that wrote
// testdata/snapshot-v2.bin (commit 6aba3a8, snapshot version 2), produced
// that snapshot.
func legacyHistory(h *harness) {
	h.t.Helper()
	// A decision's evidence copies the observations of the state, which
	// held strings then.
	legacyObservations := func(b *waldenv1.Broker) []*waldenv1.Observation {
		c := proto.Clone(b).(*waldenv1.Broker)
		waldenv1.ToLegacy(c)
		return c.GetObservations()
	}
	for _, id := range []string{"b1", "b2", "b3", "b4", "b5", "b6", "b7"} {
		h.register(id)
	}
	h.index++
	if err := h.s.ApplyConfChange(h.index, addLearner(rid("c4")), memberCtx("c4"), nil); err != nil {
		h.t.Fatal(err)
	}

	// b1: suspected, attested dead by every voter, failed over and recovered.
	h.nowMs += 1000
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", State: "suspect", Reason: "probe timeout"})
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c2", BrokerId: "b1", State: "dead", Reason: "gossip: dead", LeaseExpired: true})
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c3", BrokerId: "b1", State: "dead", LeaseExpired: true})
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", State: "dead", LeaseExpired: true})
	h.nowMs += 5000
	b1 := h.broker("b1")
	d1 := h.ok(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: b1.GetEpoch(), Term: h.term, LiveMembers: []string{"c1", "c2", "c3"},
		Evidence: &waldenv1.Evidence{Observations: legacyObservations(b1), SuspicionQuorum: 2, Reason: "quorum dead", DecidedBy: "c1"}}).GetDeclareFailed()
	j1 := h.job(d1.GetJobId())
	h.ok(&waldenv1.RenewJobLease{JobId: j1.GetJobId(), Attempt: 1, AssigneeId: j1.GetAssigneeId()})
	for _, step := range []string{"fence", "attach", "read", "upload", "commit", "close", "detach"} {
		h.nowMs += 100
		h.ok(&waldenv1.CheckpointJob{JobId: j1.GetJobId(), Attempt: 1, Step: step, StepDone: true, Detail: step + " ok",
			BytesUploaded: 4096, BytesTotal: 4096, RecoveredWalOffset: 4096})
	}
	h.ok(&waldenv1.FinishJob{JobId: j1.GetJobId(), Attempt: 1, State: "succeeded", RecoveredWalOffset: 4096})

	// b2: failed over, its recovery failed at the read step, retried, cancelled.
	for _, c := range []string{"c1", "c2", "c3"} {
		h.ok(&waldenv1.ObserveBroker{ObserverId: c, BrokerId: "b2", State: "dead", LeaseExpired: true})
	}
	b2 := h.broker("b2")
	d2 := h.ok(&waldenv1.DeclareFailed{BrokerId: "b2", Epoch: b2.GetEpoch(), Term: h.term, LiveMembers: []string{"c2", "c3"},
		Evidence: &waldenv1.Evidence{Observations: legacyObservations(b2), Reason: "quorum dead", DecidedBy: "c1"}}).GetDeclareFailed()
	h.ok(&waldenv1.CheckpointJob{JobId: d2.GetJobId(), Attempt: 1, Step: "fence", StepDone: true})
	h.ok(&waldenv1.CheckpointJob{JobId: d2.GetJobId(), Attempt: 1, Step: "read", Error: "read /wal: input/output error"})
	h.ok(&waldenv1.FinishJob{JobId: d2.GetJobId(), Attempt: 1, State: "failed", Error: "read /wal: input/output error"})
	h.ok(&waldenv1.RetryJob{JobId: d2.GetJobId(), Actor: "operator", LiveMembers: []string{"c3"}})
	h.ok(&waldenv1.CancelJob{JobId: d2.GetJobId(), Actor: "operator"})

	// b3: suspect by one coordinator, a manual failover requested, a
	// cooldown block acknowledged; b4 in maintenance.
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c2", BrokerId: "b3", State: "suspect", Reason: "probe timeout"})
	h.ok(&waldenv1.RequestFailover{BrokerId: "b3", Epoch: h.broker("b3").GetEpoch(), Reason: "disk slow", Actor: "operator"})
	h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{Kind: "freeze", Actor: "c1", Message: "3 of 4 brokers suspected"}})
	h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{Kind: "unfreeze", Actor: "c1", Message: "1 of 4 brokers suspected"}})
	h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{Kind: "cooldown", BrokerId: "b3", Actor: "c1", Message: "flapping"}})
	h.ok(&waldenv1.AckBroker{BrokerId: "b3", Actor: "operator"})
	h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{Kind: "recovery", BrokerId: "b1", JobId: j1.GetJobId(), Actor: "c2", Message: "attached"}})
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b4", On: true, Actor: "operator", Reason: "kernel upgrade"})
	// b5: recovery running at the attach step; b6: pending; b7: failed.
	for _, id := range []string{"b5", "b6", "b7"} {
		for _, c := range []string{"c1", "c2", "c3"} {
			h.ok(&waldenv1.ObserveBroker{ObserverId: c, BrokerId: id, State: "dead", LeaseExpired: true})
		}
		b := h.broker(id)
		h.ok(&waldenv1.DeclareFailed{BrokerId: id, Epoch: b.GetEpoch(), Term: h.term, LiveMembers: []string{"c1", "c2", "c3"},
			Evidence: &waldenv1.Evidence{Observations: legacyObservations(b), Reason: "quorum dead", DecidedBy: "c1"}})
	}
	h.ok(&waldenv1.CheckpointJob{JobId: h.broker("b5").GetLastJobId(), Attempt: 1, Step: "fence", StepDone: true, Detail: "fenced"})
	h.ok(&waldenv1.CheckpointJob{JobId: h.broker("b5").GetLastJobId(), Attempt: 1, Step: "attach", Detail: "attaching vol-b5"})
	h.ok(&waldenv1.FinishJob{JobId: h.broker("b7").GetLastJobId(), Attempt: 1, State: "failed", Error: "attach: volume busy"})
	h.ok(&waldenv1.SetPolicy{Set: map[string]string{"cooldown": "30m"}, Actor: "operator"})
}
