package waldenv1

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// jsonSamples are messages spelled with the deprecated strings, as a
// walden before the enums held them.
func jsonSamples() map[string]proto.Message {
	obs := []*Observation{
		{ObserverId: "c1", State: "suspect", SinceUnixMs: 1700000001000, Reason: "probe timeout", Index: 12, Epoch: 3},
		{ObserverId: "c2", State: "dead", SinceUnixMs: 1700000002000, Index: 13, Epoch: 3, LeaseExpired: true, UnheardForMs: 4000},
	}
	return map[string]proto.Message{
		"broker": &Broker{BrokerId: "b1", State: "suspect", Epoch: 3, LeaseRemainingMs: -1, AgentAddr: "127.0.0.1:7001",
			Wal: &WalLocation{Path: "/wal/b1"}, Observations: obs, RecoveredWalOffset: -1, Hold: "quorum", HoldDetail: "1 of 2"},
		"brokers": &ListBrokersResponse{Brokers: []*Broker{{BrokerId: "b1", State: "alive"}, {BrokerId: "b2", State: "maintenance", Maintenance: true}}},
		"job": &Job{JobId: "job-b1-4", BrokerId: "b1", Token: 4, Attempt: 2, AssigneeId: "c2", State: "running", Step: "upload",
			Checkpoints:        []*Checkpoint{{Step: "fence", Attempt: 2, Index: 40, UnixMs: 1700000005000, Detail: "fenced"}, {Step: "attach", Attempt: 2, Index: 41}},
			RecoveredWalOffset: -1},
		"jobs": &ListJobsResponse{Jobs: []*Job{{JobId: "j1", State: "succeeded", Step: "done"}, {JobId: "j2", State: "cancelled", Step: "fence"}}},
		"events": &ListEventsResponse{Events: []*Event{
			{Index: 7, UnixMs: 1700000006000, Kind: "decision", BrokerId: "b1", Message: "declared failed", Actor: "c1", JobId: "job-b1-4",
				Evidence: &Evidence{Observations: obs, SuspicionQuorum: 2, Reason: "quorum dead", DecidedBy: "c1"}},
			{Index: 8, Kind: "dry_run"}, {Index: 9, Kind: "failover_requested"}, {Index: 10, Kind: "freeze"}}},
		"status": &StatusResponse{ClusterName: "demo", NodeId: "c1", LeaderId: "c1", Term: 2, RaftState: "leader", Members: []*Member{
			{Id: "c1", RaftId: 101, Role: "leader", Reachable: true}, {Id: "c2", RaftId: 102, Role: "follower"}, {Id: "c4", RaftId: 104, Role: "learner"}}},
		"failover": &GetFailoverResponse{Failover: &Failover{Id: "job-b1-4", BrokerId: "b1", State: "failed", Step: "read", Error: "io",
			Phases: []*FailoverPhase{{Kind: "observe", Actor: "c1"}, {Kind: "fence", Actor: "c2"}}}},
		"empty-broker": &Broker{},
	}
}

// TestLegacyFieldsComplete checks legacyFields against the .proto files:
// every deprecated string field of the package is listed with an enum
// field of the same message, and nothing else is.
func TestLegacyFieldsComplete(t *testing.T) {
	listed := map[protoreflect.FullName]bool{}
	for msg, fields := range legacyFields {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(msg)
		if err != nil {
			t.Fatalf("legacyFields names %s: %v", msg, err)
		}
		md := d.(protoreflect.MessageDescriptor)
		for _, f := range fields {
			e, s := md.Fields().ByName(f.enum), md.Fields().ByName(f.str)
			switch {
			case e == nil || e.Kind() != protoreflect.EnumKind || e.Enum().ParentFile() != File_walden_v1_types_proto:
				t.Errorf("%s.%s is not a field of an enum of types.proto", msg, f.enum)
			case s == nil || s.Kind() != protoreflect.StringKind || s.Cardinality() == protoreflect.Repeated:
				t.Errorf("%s.%s is not a string field", msg, f.str)
			default:
				listed[s.FullName()] = true
			}
		}
	}
	protoregistry.GlobalFiles.RangeFilesByPackage("walden.v1", func(fd protoreflect.FileDescriptor) bool {
		var check func(mds protoreflect.MessageDescriptors)
		check = func(mds protoreflect.MessageDescriptors) {
			for i := range mds.Len() {
				md := mds.Get(i)
				for j := range md.Fields().Len() {
					f := md.Fields().Get(j)
					deprecated := f.Options().(*descriptorpb.FieldOptions).GetDeprecated()
					if deprecated && !listed[f.FullName()] {
						t.Errorf("%s is deprecated but not in legacyFields", f.FullName())
					}
					if !deprecated && listed[f.FullName()] {
						t.Errorf("%s is in legacyFields but not marked deprecated", f.FullName())
					}
				}
				check(md.Messages())
			}
		}
		check(fd.Messages())
		return true
	})
}

func TestUpgradeLegacy(t *testing.T) {
	j := &Job{State: "running", Step: "upload", Checkpoints: []*Checkpoint{{Step: "fence"}, {Step: "attach"}}}
	if err := UpgradeLegacy(j); err != nil {
		t.Fatal(err)
	}
	want := &Job{JobState: JobState_JOB_STATE_RUNNING, JobStep: JobStep_JOB_STEP_UPLOAD,
		Checkpoints: []*Checkpoint{{JobStep: JobStep_JOB_STEP_FENCE}, {JobStep: JobStep_JOB_STEP_ATTACH}}}
	if !proto.Equal(j, want) {
		t.Fatalf("upgraded job = %v, want %v", j, want)
	}

	// Nested in lists, maps' absence and oneofs: a command and a snapshot.
	cmd := &Command{Op: &Command_RecordEvent{RecordEvent: &RecordEvent{Event: &Event{Kind: "cooldown",
		Evidence: &Evidence{Observations: []*Observation{{State: "dead"}}}}}}}
	if err := UpgradeLegacy(cmd); err != nil {
		t.Fatal(err)
	}
	e := cmd.GetRecordEvent().GetEvent()
	if e.GetEventKind() != EventKind_EVENT_KIND_COOLDOWN || e.GetKind() != "" ||
		e.GetEvidence().GetObservations()[0].GetObservationState() != ObservationState_OBSERVATION_STATE_DEAD {
		t.Fatalf("upgraded command = %v", cmd)
	}

	// A writer that set both meant the enum.
	b := &Broker{State: "alive", BrokerState: BrokerState_BROKER_STATE_FAILED}
	if err := UpgradeLegacy(b); err != nil || b.GetBrokerState() != BrokerState_BROKER_STATE_FAILED || b.GetState() != "" {
		t.Fatalf("upgraded broker = %v, %v", b, err)
	}

	// A string that names nothing stays, and is reported; the rest is
	// upgraded.
	s := &StateSnapshot{Brokers: []*Broker{{BrokerId: "b1", State: "zombie"}, {BrokerId: "b2", State: "alive"}}}
	err := UpgradeLegacy(s)
	if err == nil || err.Error() != `state "zombie" is not alive, suspect, failed, recovering, recovered or maintenance` {
		t.Fatalf("UpgradeLegacy(zombie) = %v", err)
	}
	if s.Brokers[0].GetState() != "zombie" || s.Brokers[1].GetBrokerState() != BrokerState_BROKER_STATE_ALIVE {
		t.Fatalf("snapshot after a failed upgrade = %v", s)
	}
}

func TestAddAndToLegacy(t *testing.T) {
	m := &Member{Id: "c1", MemberRole: MemberRole_MEMBER_ROLE_LEARNER}
	AddLegacy(m)
	if m.GetRole() != "learner" || m.GetMemberRole() != MemberRole_MEMBER_ROLE_LEARNER {
		t.Fatalf("AddLegacy = %v", m)
	}
	ToLegacy(m)
	if m.GetRole() != "learner" || m.GetMemberRole() != 0 {
		t.Fatalf("ToLegacy = %v", m)
	}
	// An unspecified enum leaves the string (what an older walden sent).
	f := &FinishJob{State: "failed"}
	ToLegacy(f)
	if f.GetState() != "failed" {
		t.Fatalf("ToLegacy(unspecified) = %v", f)
	}
	// Round trip: what ToLegacy writes, UpgradeLegacy reads back.
	for name, s := range jsonSamples() {
		up := proto.Clone(s)
		if err := UpgradeLegacy(up); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		down := proto.Clone(up)
		ToLegacy(down)
		if !proto.Equal(down, s) {
			t.Errorf("%s: ToLegacy(UpgradeLegacy(m)) = %v, want %v", name, down, s)
		}
	}
}

// addedFields are the fields added to the samples' messages after the
// testdata was written: new keys, which a script reading the old ones never
// sees. Every other key must print exactly as before.
var addedFields = []string{`,"automq":null`, `,"version":""`, `,"commits":false`, `,"incarnation":"0"`, `,"progress_by":""`,
	`,"target_report":null`, `,"blocked_unix_ms":"0"`, `,"wal_lost":false`, `,"resolution":""`,
	`,"restore":false`, `,"survey":null`, `,"tails":[]`, `,"restore":null`, `,"reconciled":false`,
	`,"registered_index":"0"`, `,"prior_recovered":false`, `,"never_granted":false`, `,"acknowledged_nothing":false`,
	`,"detail":null`}

// withoutAddedFields drops addedFields from the compacted JSON js.
func withoutAddedFields(t *testing.T, js []byte) []byte {
	t.Helper()
	var c bytes.Buffer
	if err := json.Compact(&c, js); err != nil {
		t.Fatal(err)
	}
	out := c.String()
	for _, f := range addedFields {
		out = strings.ReplaceAll(out, f, "")
	}
	return []byte(out)
}

// TestMarshalJSONAsBefore checks that MarshalJSON prints what walden printed
// before the enums: testdata/json-before-enums.json is the proto JSON of
// jsonSamples (UseProtoNames, EmitUnpopulated, compacted) written by the
// walden before them (commit 6aba3a8).
func TestMarshalJSONAsBefore(t *testing.T) {
	data, err := os.ReadFile("testdata/json-before-enums.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]json.RawMessage
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	samples := jsonSamples()
	if len(want) != len(samples) {
		t.Fatalf("%d samples, %d in the testdata", len(samples), len(want))
	}
	for name, s := range samples {
		m := proto.Clone(s)
		if err := UpgradeLegacy(m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := MarshalJSON(m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got = withoutAddedFields(t, got)
		var c bytes.Buffer
		if err := json.Compact(&c, got); err != nil {
			t.Fatal(err)
		}
		if c.String() != string(want[name]) {
			t.Errorf("%s:\n got %s\nwant %s", name, c.String(), want[name])
		}
	}
	// Messages of other packages are plain proto JSON.
	got, err := MarshalJSON(&descriptorpb.FieldOptions{Deprecated: proto.Bool(true)})
	if err != nil || !strings.Contains(string(got), `"deprecated"`) {
		t.Fatalf("MarshalJSON(FieldOptions) = %s, %v", got, err)
	}
}

// TestMarshalJSONNamesEnumsWithoutStrings: an enum field added without a
// deprecated string beside it prints its value's name in its own field, ""
// for none, in messages at any depth and in lists.
func TestMarshalJSONNamesEnumsWithoutStrings(t *testing.T) {
	for _, tc := range []struct {
		m    proto.Message
		want []string
	}{
		{&ListEventsResponse{Events: []*Event{{EventKind: EventKind_EVENT_KIND_JOB, Detail: &EventDetail{
			FromState: BrokerState_BROKER_STATE_FAILED, ToState: BrokerState_BROKER_STATE_RECOVERING, JobState: JobState_JOB_STATE_RUNNING,
			JobStep: JobStep_JOB_STEP_ATTACH, ObservationState: ObservationState_OBSERVATION_STATE_DEAD}}}},
			[]string{`"kind":"job"`, `"from_state":"failed"`, `"to_state":"recovering"`, `"job_state":"running"`, `"from_job_state":""`,
				`"job_step":"attach"`, `"observation_state":"dead"`, `"from_observation_state":""`}},
		{&RestoreState{RestorePhase: RestorePhase_RESTORE_PHASE_SURVEY}, []string{`"restore_phase":"survey"`}},
	} {
		b, err := MarshalJSON(tc.m)
		if err != nil {
			t.Fatal(err)
		}
		var c bytes.Buffer
		if err := json.Compact(&c, b); err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(c.String(), w) {
				t.Errorf("%s: no %s", c.String(), w)
			}
		}
		if strings.Contains(c.String(), "_STATE_") || strings.Contains(c.String(), "RESTORE_PHASE") {
			t.Errorf("%s: an enum identifier instead of its name", c.String())
		}
	}
}
