package fsm_test

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// TestRestoreSnapshotVersion2 restores testdata/snapshot-v2.bin, written
// by the walden before the enums (its states, steps, roles and kinds are
// strings): every one must read as its enum, and the state must be exactly
// the one this walden reaches by applying the same history.
func TestRestoreSnapshotVersion2(t *testing.T) {
	data, err := os.ReadFile("testdata/snapshot-v2.bin")
	if err != nil {
		t.Fatal(err)
	}
	old := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(data, old); err != nil {
		t.Fatal(err)
	}
	if old.GetVersion() != 2 || !waldenv1.HasLegacy(old) {
		t.Fatalf("testdata/snapshot-v2.bin is version %d, with strings %t", old.GetVersion(), waldenv1.HasLegacy(old))
	}
	s := fsm.New("demo")
	if err := s.Restore(data); err != nil {
		t.Fatalf("Restore: %v", err)
	}

	brokers := map[string]waldenv1.BrokerState{}
	for _, b := range s.Brokers() {
		brokers[b.GetBrokerId()] = b.GetBrokerState()
		for _, o := range b.GetObservations() {
			if want := waldenv1.ObservationState_OBSERVATION_STATE_DEAD; b.GetBrokerId() != "b3" && o.GetObservationState() != want {
				t.Errorf("broker %s: %s observes %v, want %v", b.GetBrokerId(), o.GetObserverId(), o.GetObservationState(), want)
			}
		}
	}
	B := func(s waldenv1.BrokerState) waldenv1.BrokerState { return s }
	wantBrokers := map[string]waldenv1.BrokerState{
		"b1": B(waldenv1.BrokerState_BROKER_STATE_RECOVERED), "b2": B(waldenv1.BrokerState_BROKER_STATE_FAILED),
		"b3": B(waldenv1.BrokerState_BROKER_STATE_SUSPECT), "b4": B(waldenv1.BrokerState_BROKER_STATE_MAINTENANCE),
		"b5": B(waldenv1.BrokerState_BROKER_STATE_RECOVERING), "b6": B(waldenv1.BrokerState_BROKER_STATE_FAILED),
		"b7": B(waldenv1.BrokerState_BROKER_STATE_FAILED),
	}
	if !maps2Equal(brokers, wantBrokers) {
		t.Errorf("brokers %v, want %v", brokers, wantBrokers)
	}
	if b3, _ := s.Broker("b3"); b3.GetObservations()[0].GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT {
		t.Errorf("b3's observation %v", b3.GetObservations())
	}

	type jobWant struct {
		state waldenv1.JobState
		step  waldenv1.JobStep
		steps []string
	}
	wantJobs := map[string]jobWant{
		"job-b1-8":  {waldenv1.JobState_JOB_STATE_SUCCEEDED, waldenv1.JobStep_JOB_STEP_DONE, []string{"fence", "attach", "read", "upload", "commit", "close", "detach"}},
		"job-b2-9":  {waldenv1.JobState_JOB_STATE_CANCELLED, waldenv1.JobStep_JOB_STEP_READ, []string{"fence"}},
		"job-b5-10": {waldenv1.JobState_JOB_STATE_RUNNING, waldenv1.JobStep_JOB_STEP_ATTACH, []string{"fence"}},
		"job-b6-11": {waldenv1.JobState_JOB_STATE_PENDING, waldenv1.JobStep_JOB_STEP_FENCE, nil},
		"job-b7-12": {waldenv1.JobState_JOB_STATE_FAILED, waldenv1.JobStep_JOB_STEP_FENCE, nil},
	}
	jobs := s.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED)
	if len(jobs) != len(wantJobs) {
		t.Fatalf("%d jobs, want %d", len(jobs), len(wantJobs))
	}
	for _, j := range jobs {
		w := wantJobs[j.GetJobId()]
		var steps []string
		for _, cp := range j.GetCheckpoints() {
			steps = append(steps, cp.GetJobStep().Name())
		}
		if j.GetJobState() != w.state || j.GetJobStep() != w.step || !slices.Equal(steps, w.steps) {
			t.Errorf("job %s: %s at %s, checkpoints %v; want %s at %s, %v", j.GetJobId(), j.GetJobState().Name(), j.GetJobStep().Name(),
				steps, w.state.Name(), w.step.Name(), w.steps)
		}
	}

	var kinds []string
	for _, e := range s.Events("", 0) {
		kinds = append(kinds, e.GetEventKind().Name())
		for _, o := range e.GetEvidence().GetObservations() {
			if o.GetObservationState() == waldenv1.ObservationState_OBSERVATION_STATE_UNSPECIFIED {
				t.Errorf("event %d: evidence without its observation's state: %v", e.GetIndex(), o)
			}
		}
	}
	wantKinds := "register register register register register register register " +
		"observation observation observation observation decision job job " +
		"observation observation observation decision job job job job " +
		"observation failover_requested freeze unfreeze cooldown ack recovery maintenance " +
		"observation observation observation decision observation observation observation decision " +
		"observation observation observation decision job job policy"
	if got := strings.Join(kinds, " "); got != wantKinds {
		t.Errorf("event kinds:\n got %s\nwant %s", got, wantKinds)
	}

	roles := map[string]waldenv1.MemberRole{}
	for _, m := range s.Members() {
		roles[m.GetId()] = m.GetMemberRole()
	}
	voter, learner := waldenv1.MemberRole_MEMBER_ROLE_VOTER, waldenv1.MemberRole_MEMBER_ROLE_LEARNER
	if !maps2Equal(roles, map[string]waldenv1.MemberRole{"c1": voter, "c2": voter, "c3": voter, "c4": learner}) {
		t.Errorf("member roles %v", roles)
	}
	if v := s.Voters(); !slices.Equal(v, []string{"c1", "c2", "c3"}) {
		t.Errorf("voters %v", v)
	}

	// The state is written back in this version's form, and is the state
	// the same history reaches here, byte for byte.
	restored := mustSnapshot(t, s)
	snap := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(restored, snap); err != nil {
		t.Fatal(err)
	}
	if snap.GetVersion() != 3 || waldenv1.HasLegacy(snap) {
		t.Fatalf("written back as version %d, with strings %t", snap.GetVersion(), waldenv1.HasLegacy(snap))
	}
	// An older walden recorded no incarnations: the members of its
	// snapshot have none, those of the same history replayed here do.
	h := newHarness(t)
	legacyHistory(h)
	replayedSnap := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(mustSnapshot(t, h.s), replayedSnap); err != nil {
		t.Fatal(err)
	}
	for _, m := range replayedSnap.GetMembers() {
		if m.GetIncarnation() == 0 {
			t.Errorf("member %s added by this walden has no incarnation", m.GetId())
		}
		m.Incarnation = 0
	}
	// Nor typed fields in its events: the same history replayed here
	// records them, and renders the very messages the older walden wrote
	// (compared below with everything else). The events an older leader or
	// executor recorded (RecordEvent) carry no fields in their entries, so
	// none when replayed either.
	untyped := []waldenv1.EventKind{waldenv1.EventKind_EVENT_KIND_FREEZE, waldenv1.EventKind_EVENT_KIND_UNFREEZE,
		waldenv1.EventKind_EVENT_KIND_COOLDOWN, waldenv1.EventKind_EVENT_KIND_RECOVERY}
	for _, e := range replayedSnap.GetEvents() {
		if e.GetDetail() == nil && !slices.Contains(untyped, e.GetEventKind()) {
			t.Errorf("event %d (%s) replayed by this walden has no detail", e.GetIndex(), e.GetEventKind().Name())
		}
		e.Detail = nil
	}
	if !proto.Equal(replayedSnap, snap) {
		t.Fatalf("restored version 2 snapshot differs from the state of the same history:\n%v\n%v", snap, replayedSnap)
	}
}

func maps2Equal[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestLegacyEntriesApplyAsNew applies the history spelled as the walden
// before the enums wrote its entries (strings only), and spelled with the
// enums only: the results and the states must be the same.
func TestLegacyEntriesApplyAsNew(t *testing.T) {
	legacy := newHarness(t)
	legacyHistory(legacy)
	upgraded := newHarness(t)
	upgraded.form = func(c *waldenv1.Command) {
		if err := waldenv1.UpgradeLegacy(c); err != nil {
			t.Fatal(err)
		}
		if waldenv1.HasLegacy(c) {
			t.Fatalf("command %v still has strings", c)
		}
	}
	legacyHistory(upgraded)
	if a, b := mustSnapshot(t, legacy.s), mustSnapshot(t, upgraded.s); string(a) != string(b) {
		t.Fatalf("legacy and enum entries applied differently:\n%v\n%v", domainSnapshot(t, legacy.s), domainSnapshot(t, upgraded.s))
	}
	// An entry carrying both (this version's proposals during a rolling
	// upgrade) applies as the enum says.
	both := newHarness(t)
	both.form = func(c *waldenv1.Command) {
		if err := waldenv1.UpgradeLegacy(c); err != nil {
			t.Fatal(err)
		}
		waldenv1.AddLegacy(c)
	}
	legacyHistory(both)
	if a, b := mustSnapshot(t, legacy.s), mustSnapshot(t, both.s); string(a) != string(b) {
		t.Fatal("entries with both the strings and the enums applied differently")
	}
}

// TestLegacyEntryRefusals: a string that names no value is refused as an
// invalid argument naming it, and changes nothing.
func TestLegacyEntryRefusals(t *testing.T) {
	h := newHarness(t)
	h.register("b1")
	cases := []struct {
		op   any
		text string
	}{
		{&waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", State: "zombie"}, `observe broker "b1": state "zombie" is not alive, suspect or dead`},
		{&waldenv1.RecordEvent{Event: &waldenv1.Event{Kind: "party"}}, `record event: kind "party" is not register, observation,`},
		{&waldenv1.FinishJob{JobId: "j", Attempt: 1, State: "done"}, `finish job j: state "done" is not pending, running, succeeded, failed, cancelled or blocked`},
		{&waldenv1.CheckpointJob{JobId: "j", Attempt: 1, Step: "teleport"}, `checkpoint job j: step "teleport" is not fence, attach,`},
	}
	for _, c := range cases {
		err := h.refuse(c.op, refusal.ErrInvalidArgument)
		if !strings.Contains(err.Error(), c.text) {
			t.Errorf("refusal %q, want it to say %q", err, c.text)
		}
	}
	if !errors.Is(h.refuse(&waldenv1.ObserveBroker{ObserverId: "c1", BrokerId: "b1", State: "bogus"}, refusal.ErrInvalidArgument), refusal.ErrInvalidArgument) {
		t.Fatal("not refused")
	}
}

// TestRestoreRefusesUnknownLegacyNames: a version 2 snapshot with a string
// that names no value is invalid.
func TestRestoreRefusesUnknownLegacyNames(t *testing.T) {
	data, err := os.ReadFile("testdata/snapshot-v2.bin")
	if err != nil {
		t.Fatal(err)
	}
	snap := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(data, snap); err != nil {
		t.Fatal(err)
	}
	snap.Jobs[0].State = "lost"
	bad, err := proto.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	s := fsm.New("demo")
	err = s.Restore(bad)
	if !errors.Is(err, fsm.ErrInvalidSnapshot) || !strings.Contains(err.Error(), `state "lost" is not pending`) {
		t.Fatalf("Restore = %v", err)
	}
	if s.AppliedIndex() != 0 {
		t.Fatal("a refused restore changed the state")
	}
}
