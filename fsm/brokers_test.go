package fsm_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

func TestRegisterBroker(t *testing.T) {
	h := newHarness(t)
	if e := h.register("b1"); e != 1 {
		t.Fatalf("first epoch = %d, want 1", e)
	}
	if e := h.register("b2"); e != 2 {
		t.Fatalf("second epoch = %d, want 2", e)
	}
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT})
	res := h.ok(&waldenv1.RegisterBroker{BrokerId: "b1", AgentAddr: "a"}).GetRegisterBroker()
	if res.GetEpoch() != 3 || res.GetRecoveredWalOffset() != -1 {
		t.Fatalf("re-register = %v, want epoch 3, offset -1", res)
	}
	b := h.broker("b1")
	if b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_ALIVE || len(b.GetObservations()) != 0 || b.GetFenced() || b.GetAgentAddr() != "a" || b.GetWal() != nil {
		t.Fatalf("re-registered broker = %v", b)
	}
	if h.s.NextEpoch() != 4 {
		t.Fatalf("NextEpoch = %d", h.s.NextEpoch())
	}
	h.refuse(&waldenv1.RegisterBroker{}, refusal.ErrInvalidArgument)

	// Maintenance survives a registration.
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b2", On: true})
	h.register("b2")
	if got := h.broker("b2").GetBrokerState(); got != waldenv1.BrokerState_BROKER_STATE_MAINTENANCE {
		t.Fatalf("state = %q, want maintenance", got)
	}

	// Refused while a recovery job is pending or running.
	h.declare("b1")
	h.refuse(&waldenv1.RegisterBroker{BrokerId: "b1"}, refusal.ErrRecoveryRunning)
}

func TestObserveBroker(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	cases := []struct {
		name      string
		op        *waldenv1.ObserveBroker
		want      error
		wantState waldenv1.BrokerState
	}{
		{"c1 suspects", &waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, Reason: "probe timeout"}, nil, waldenv1.BrokerState_BROKER_STATE_SUSPECT},
		{"c2 sees it dead", &waldenv1.ObserveBroker{ObserverId: "c2", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD}, nil, waldenv1.BrokerState_BROKER_STATE_SUSPECT},
		{"c1 sees it alive again", &waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_ALIVE}, nil, waldenv1.BrokerState_BROKER_STATE_SUSPECT},
		{"c2 sees it alive", &waldenv1.ObserveBroker{ObserverId: "c2", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_ALIVE}, nil, waldenv1.BrokerState_BROKER_STATE_ALIVE},
		{"unknown state", &waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", ObservationState: waldenv1.ObservationState(99)}, refusal.ErrInvalidArgument, 0},
		{"observer not a member", &waldenv1.ObserveBroker{ObserverId: "c9", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD}, refusal.ErrInvalidArgument, 0},
		{"unknown broker", &waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b9", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD}, refusal.ErrUnknownNode, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			if c.want != nil {
				h.refuse(c.op, c.want)
				return
			}
			got := h.ok(c.op).GetBroker().GetBrokerState()
			if got != c.wantState {
				t.Fatalf("state = %q, want %q", got, c.wantState)
			}
		})
	}
	h.t = t
	// The same state again keeps its since time and adds no event.
	h.nowMs += 1000
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c3", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT})
	since := h.broker("b1").GetObservations()[2].GetSinceUnixMs()
	events := len(h.s.Events("b1", 0))
	h.nowMs += 1000
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c3", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, Reason: "still"})
	obs := h.broker("b1").GetObservations()
	if len(obs) != 3 || obs[2].GetSinceUnixMs() != since || obs[2].GetReason() != "still" || len(h.s.Events("b1", 0)) != events {
		t.Fatalf("repeated observation changed since or logged: %v", obs)
	}
	if obs[0].GetObserverId() != "c1" || obs[1].GetObserverId() != "c2" {
		t.Fatalf("observations not sorted by observer: %v", obs)
	}
}

func TestDeclareFailed(t *testing.T) {
	h := newHarness(t)
	e1 := h.register("b1")
	h.register("b2")
	ev := &waldenv1.Evidence{Reason: "quorum suspects for 5s", DecidedBy: "c2", SuspectForMs: 5200}

	h.refuse(&waldenv1.DeclareFailed{BrokerId: "b9", Epoch: 1}, refusal.ErrUnknownNode)
	h.refuse(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: e1 + 5}, refusal.ErrEpochExpired)

	// Dry run: an event, nothing fenced.
	res := h.ok(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: e1, Evidence: ev, DryRun: true}).GetDeclareFailed()
	if !res.GetDryRun() || res.GetNewEpoch() != 0 || h.broker("b1").GetFenced() || h.s.ActiveJobs() != 0 {
		t.Fatalf("dry run = %v, broker %v", res, h.broker("b1"))
	}
	if evs := h.s.Events("b1", 1); evs[0].GetEventKind() != waldenv1.EventKind_EVENT_KIND_DRY_RUN || evs[0].GetEvidence().GetSuspectForMs() != 5200 {
		t.Fatalf("dry run event = %v", evs)
	}

	// Maintenance blocks an automatic decision, not a manual one.
	h.ok(&waldenv1.SetMaintenance{BrokerId: "b2", On: true})
	h.refuse(&waldenv1.DeclareFailed{BrokerId: "b2", Epoch: 2, Evidence: ev}, refusal.ErrMaintenance)
	res = h.ok(&waldenv1.DeclareFailed{BrokerId: "b2", Epoch: 2, Evidence: &waldenv1.Evidence{Manual: true, LeaseWaitMs: 2500}, LiveMembers: []string{"c1"}}).GetDeclareFailed()
	if res.GetNewEpoch() != 3 || res.GetJobId() != "job-b2-3" {
		t.Fatalf("manual decision = %v", res)
	}
	// The recovery of a broker failed over while it held a lease waits for
	// that lease to run out before it reads the WAL.
	if w := h.job("job-b2-3").GetLeaseWaitMs(); w != 2500 {
		t.Fatalf("manual decision: job lease_wait_ms = %d, want 2500", w)
	}

	// The decision: new epoch, fenced, failed, job assigned to the least
	// loaded live member (c1 has b2's job; c2 and c3 tie, c2 wins).
	res = h.ok(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: e1, Evidence: ev, LiveMembers: []string{"c3", "c1", "c2", "c9"}}).GetDeclareFailed()
	if res.GetNewEpoch() != 4 || res.GetJobId() != "job-b1-4" {
		t.Fatalf("decision = %v", res)
	}
	b := h.broker("b1")
	if b.GetEpoch() != 4 || !b.GetFenced() || b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_FAILED || b.GetFailovers() != 1 || b.GetLastJobId() != "job-b1-4" {
		t.Fatalf("broker after decision = %v", b)
	}
	j := h.job("job-b1-4")
	if j.GetAssigneeId() != "c2" || j.GetJobState() != waldenv1.JobState_JOB_STATE_PENDING || j.GetAttempt() != 1 || j.GetToken() != 4 ||
		j.GetWal().GetPath() != "/var/lib/broker/b1.wal" || j.GetRecoveredWalOffset() != -1 || j.GetLeaseWaitMs() != 0 {
		t.Fatalf("job = %v", j)
	}
	evs := h.s.Events("b1", 1)
	if evs[0].GetEventKind() != waldenv1.EventKind_EVENT_KIND_DECISION || evs[0].GetActor() != "c2" || evs[0].GetJobId() != "job-b1-4" || evs[0].GetEvidence().GetReason() != ev.GetReason() {
		t.Fatalf("decision event = %v", evs[0])
	}

	// At most once per epoch: the same decision proposed again (a new
	// leader) is refused; so is one at the new epoch while fenced.
	h.refuse(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: e1, Evidence: ev, LiveMembers: []string{"c1"}}, refusal.ErrEpochExpired)
	h.refuse(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: 4, Evidence: ev, LiveMembers: []string{"c1"}}, refusal.ErrEpochExpired)

	// No live member: the job is created unassigned.
	h.register("b3")
	res = h.ok(&waldenv1.DeclareFailed{BrokerId: "b3", Epoch: 5, LiveMembers: []string{"c7"}}).GetDeclareFailed()
	if got := h.job(res.GetJobId()).GetAssigneeId(); got != "" {
		t.Fatalf("assignee without live members = %q", got)
	}
}

func TestAckMaintenanceRecordEvent(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	h.refuse(&waldenv1.AckBroker{BrokerId: "b9"}, refusal.ErrUnknownNode)
	h.refuse(&waldenv1.SetMaintenance{BrokerId: "b9", On: true}, refusal.ErrUnknownNode)
	h.refuse(&waldenv1.RecordEvent{Event: &waldenv1.Event{}}, refusal.ErrInvalidArgument)
	h.refuse(&waldenv1.RecordEvent{}, refusal.ErrInvalidArgument)
	h.refuse(&waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_COOLDOWN, BrokerId: "b9"}}, refusal.ErrUnknownNode)

	e := h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_COOLDOWN, BrokerId: "b1", Message: "flapping"}}).GetEvent()
	if e.GetIndex() != h.index || e.GetUnixMs() != h.nowMs || e.GetActor() != "c1" || !h.broker("b1").GetCooldownBlocked() {
		t.Fatalf("cooldown event %v, broker %v", e, h.broker("b1"))
	}
	h.ok(&waldenv1.RecordEvent{Event: &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_FREEZE, Message: "3 of 4 brokers suspected"}})
	h.nowMs += 5
	b := h.ok(&waldenv1.AckBroker{BrokerId: "b1", Actor: "operator"}).GetBroker()
	if b.GetCooldownBlocked() || b.GetAckedUnixMs() != h.nowMs {
		t.Fatalf("after ack = %v", b)
	}
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD})
	if got := h.ok(&waldenv1.SetMaintenance{BrokerId: "b1", On: true}).GetBroker().GetBrokerState(); got != waldenv1.BrokerState_BROKER_STATE_MAINTENANCE {
		t.Fatalf("maintenance on: %q", got)
	}
	if got := h.ok(&waldenv1.SetMaintenance{BrokerId: "b1", On: false}).GetBroker().GetBrokerState(); got != waldenv1.BrokerState_BROKER_STATE_SUSPECT {
		t.Fatalf("maintenance off: %q, want suspect (c1 observes dead)", got)
	}
	kinds := []string{}
	for _, e := range h.s.Events("", 0) {
		kinds = append(kinds, e.GetEventKind().Name())
	}
	if got := strings.Join(kinds, ","); got != "register,cooldown,freeze,ack,observation,maintenance,maintenance" {
		t.Fatalf("events = %s", got)
	}
	if got := h.s.Events("b1", 2); len(got) != 2 || got[1].GetMessage() != "maintenance off" {
		t.Fatalf("Events(b1, 2) = %v", got)
	}
}

func TestSetPolicy(t *testing.T) {
	h := newHarness(t)
	res := h.ok(&waldenv1.SetPolicy{Set: map[string]string{"failure_timeout": "7000ms", "dry_run": "true"}, Actor: "operator"}).GetPolicy()
	if res.GetValues()["failure_timeout"] != "7s" || res.GetValues()["dry_run"] != "true" || res.GetSetIndex()["dry_run"] != h.index {
		t.Fatalf("overrides = %v", res)
	}
	h.refuse(&waldenv1.SetPolicy{}, refusal.ErrInvalidArgument)
	h.refuse(&waldenv1.SetPolicy{Set: map[string]string{"failure_timeout": "soon"}}, refusal.ErrInvalidArgument)
	h.refuse(&waldenv1.SetPolicy{Set: map[string]string{"lease_ttl": "10ms"}}, refusal.ErrInvalidArgument)
	h.refuse(&waldenv1.SetPolicy{Set: map[string]string{"cooldown": "1m", "nope": "1"}}, refusal.ErrInvalidArgument)
	h.refuse(&waldenv1.SetPolicy{Unset: []string{"nope"}}, refusal.ErrInvalidArgument)
	h.refuse(&waldenv1.SetPolicy{Set: map[string]string{"cooldown": "1m"}, Unset: []string{"cooldown"}}, refusal.ErrInvalidArgument)
	h.ok(&waldenv1.SetPolicy{Unset: []string{"dry_run"}, Set: map[string]string{"cooldown": "60s"}})
	ov := h.s.PolicyOverrides()
	if len(ov.GetValues()) != 2 || ov.GetValues()["cooldown"] != "1m" || ov.GetSetIndex()["dry_run"] != 0 {
		t.Fatalf("overrides = %v", ov)
	}
	if e := h.s.Events("", 1)[0]; e.GetEventKind() != waldenv1.EventKind_EVENT_KIND_POLICY || e.GetMessage() != "cooldown=1m, unset dry_run" {
		t.Fatalf("policy event = %v", e)
	}
}

// TestReadsAreCopies checks that callers cannot change the state through
// the read methods.
func TestReadsAreCopies(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: 1, StreamId: 7})
	h.ok(&waldenv1.SetPolicy{Set: map[string]string{"dry_run": "true"}})
	before := domainSnapshot(t, h.s)
	h.broker("b1").Epoch = 99
	h.s.Brokers()[0].BrokerState = waldenv1.BrokerState_BROKER_STATE_FAILED
	h.stream(7).EndOffset = 99
	h.s.Streams("", "")[0].State = "x"
	h.s.PolicyOverrides().Values["dry_run"] = "false"
	h.s.Events("", 0)[0].EventKind = waldenv1.EventKind_EVENT_KIND_STREAM
	if after := domainSnapshot(t, h.s); !protoEqual(before, after) {
		t.Fatal("a read method returned the state's own data")
	}
}

// A member that leaves takes its observations with it: its attestation must
// not count for a decision made after it left.
func TestRemovedMemberObservationsDropped(t *testing.T) {
	h := newHarness(t)
	h.ok(&waldenv1.RegisterBroker{BrokerId: "b1"})
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c3", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD, LeaseExpired: true})
	h.ok(&waldenv1.ObserveBroker{ObserverId: "c2", BrokerId: "b1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD, LeaseExpired: true})
	h.index++
	confIndex := h.index
	if err := h.s.ApplyConfChange(h.index, remove(rid("c3")), nil, nil); err != nil {
		t.Fatal(err)
	}
	b, _ := h.s.Broker("b1")
	if len(b.GetObservations()) != 1 || b.GetObservations()[0].GetObserverId() != "c2" {
		t.Fatalf("observations after c3 left: %v", b.GetObservations())
	}
	// Voters c1, c2: c2 alone is not a majority of two.
	if _, err := h.apply(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: 1, Term: 1, LiveMembers: []string{"c1"}}); !errors.Is(err, refusal.ErrLeaseNotExpired) {
		t.Fatalf("decision with c3's attestation gone: %v", err)
	}
	if got := h.s.ConfIndex(); got != confIndex {
		t.Fatalf("conf index %d, want %d", got, confIndex)
	}
}

func TestReassignJobRefusedInAnotherTerm(t *testing.T) {
	h := newHarness(t)
	h.ok(&waldenv1.RegisterBroker{BrokerId: "b1"})
	r := h.ok(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: 1, LiveMembers: []string{"c1"}})
	job := r.GetDeclareFailed().GetJobId()
	h.term = 3
	if _, err := h.apply(&waldenv1.ReassignJob{JobId: job, Attempt: 1, LiveMembers: []string{"c2"}, Term: 2}); !errors.Is(err, refusal.ErrDecidedInAnotherTerm) {
		t.Fatalf("reassign decided in term 2 applied in term 3: %v", err)
	}
	if _, err := h.apply(&waldenv1.ReassignJob{JobId: job, Attempt: 1, LiveMembers: []string{"c2"}, Term: 3}); err != nil {
		t.Fatal(err)
	}
}

// TestRegisterBrokerAutomqNode: a registration keeps the AutoMQ node its
// agent reported; one without it (an older walden's entry, or a broker no
// longer AutoMQ's) leaves none; a negative id or epoch changes nothing.
func TestRegisterBrokerAutomqNode(t *testing.T) {
	h := newHarness(t)
	h.ok(&waldenv1.RegisterBroker{BrokerId: "b1", AgentAddr: "a", Automq: &waldenv1.AutomqNode{NodeId: 0, NodeEpoch: 1732870000000}})
	if a := h.broker("b1").GetAutomq(); a == nil || a.GetNodeId() != 0 || a.GetNodeEpoch() != 1732870000000 {
		t.Fatalf("automq after registration = %v", a)
	}
	for _, bad := range []*waldenv1.AutomqNode{{NodeId: -1}, {NodeId: 3, NodeEpoch: -5}} {
		h.refuse(&waldenv1.RegisterBroker{BrokerId: "b1", Automq: bad}, refusal.ErrInvalidArgument)
	}
	if a := h.broker("b1").GetAutomq(); a.GetNodeEpoch() != 1732870000000 || h.broker("b1").GetEpoch() != 1 {
		t.Fatalf("a refused registration changed the broker: %v", h.broker("b1"))
	}
	h.ok(&waldenv1.RegisterBroker{BrokerId: "b1", AgentAddr: "a"})
	if a := h.broker("b1").GetAutomq(); a != nil {
		t.Fatalf("automq after a registration without it = %v", a)
	}
}

// TestDecisionWithoutTermRefusedOnceSeeded (issue 21, finding 7): a
// DeclareFailed without a term skips the term check and the attestations;
// only a walden from before quorum leases proposed one, and it never seeded
// a policy. In a seeded cluster it is refused and changes nothing; a dry
// run still records its event.
func TestDecisionWithoutTermRefusedOnceSeeded(t *testing.T) {
	h := newHarness(t)
	h.ok(&waldenv1.SeedPolicy{Policy: policy.Defaults(), SeededBy: "c1"})
	epoch := h.register("b1")
	before := domainSnapshot(t, h.s)
	h.refuse(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: epoch, LiveMembers: []string{"c1"}}, refusal.ErrInvalidArgument)
	after := domainSnapshot(t, h.s)
	after.AppliedIndex, after.LastAppliedUnixMs = before.GetAppliedIndex(), before.GetLastAppliedUnixMs()
	if !proto.Equal(before, after) {
		t.Fatal("a refused decision without a term changed the state")
	}
	if b := h.broker("b1"); b.GetFenced() || b.GetEpoch() != epoch {
		t.Fatalf("broker after a refused decision: %v", b)
	}
	if !h.ok(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: epoch, DryRun: true}).GetDeclareFailed().GetDryRun() {
		t.Fatal("a dry run without a term was not applied as a dry run")
	}
}
