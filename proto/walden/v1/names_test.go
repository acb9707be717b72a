package waldenv1

import (
	"slices"
	"testing"
)

func TestNames(t *testing.T) {
	cases := []struct {
		got, want string
	}{
		{BrokerState_BROKER_STATE_ALIVE.Name(), "alive"},
		{BrokerState_BROKER_STATE_MAINTENANCE.Name(), "maintenance"},
		{BrokerState_BROKER_STATE_UNSPECIFIED.Name(), ""},
		{BrokerState(99).Name(), "99"},
		{ObservationState_OBSERVATION_STATE_DEAD.Name(), "dead"},
		{JobState_JOB_STATE_CANCELLED.Name(), "cancelled"},
		{JobStep_JOB_STEP_DONE.Name(), "done"},
		{MemberRole_MEMBER_ROLE_VOTER.Name(), "voter"},
		{MemberRole_MEMBER_ROLE_LEARNER.Name(), "learner"},
		{EventKind_EVENT_KIND_DRY_RUN.Name(), "dry_run"},
		{EventKind_EVENT_KIND_FAILOVER_REQUESTED.Name(), "failover_requested"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("Name() = %q, want %q", c.got, c.want)
		}
	}
	// The names walden has always used, in the order it listed them.
	lists := []struct {
		got, want []string
	}{
		{Names[BrokerState](), []string{"alive", "suspect", "failed", "recovering", "recovered", "maintenance"}},
		{Names[ObservationState](), []string{"alive", "suspect", "dead"}},
		{Names[JobState](), []string{"pending", "running", "succeeded", "failed", "cancelled", "blocked"}},
		{Names[JobStep](), []string{"fence", "attach", "read", "upload", "commit", "close", "detach", "done"}},
		{Names[MemberRole](), []string{"voter", "learner", "leader", "follower"}},
		{Names[EventKind](), []string{"register", "observation", "decision", "dry_run", "freeze", "unfreeze", "cooldown",
			"policy", "maintenance", "ack", "lease", "job", "stream", "recovery", "remove", "failover_requested", "force_new_cluster",
			"restore"}},
		{Names[RestorePhase](), []string{"scan", "survey", "plan", "recover", "done"}},
	}
	for _, l := range lists {
		if !slices.Equal(l.got, l.want) {
			t.Errorf("Names = %q, want %q", l.got, l.want)
		}
	}
}

func TestParse(t *testing.T) {
	if v, ok := Parse[JobState]("running"); !ok || v != JobState_JOB_STATE_RUNNING {
		t.Fatalf("Parse(running) = %v, %t", v, ok)
	}
	if v, ok := Parse[EventKind]("dry_run"); !ok || v != EventKind_EVENT_KIND_DRY_RUN {
		t.Fatalf("Parse(dry_run) = %v, %t", v, ok)
	}
	for _, s := range []string{"", "RUNNING", "JOB_STATE_RUNNING", "unspecified", "alive"} {
		if v, ok := Parse[JobState](s); ok || v != 0 {
			t.Errorf("Parse[JobState](%q) = %v, %t", s, v, ok)
		}
	}
	for _, v := range Values[JobStep]() {
		if p, ok := Parse[JobStep](v.Name()); !ok || p != v {
			t.Errorf("Parse(%v.Name()) = %v, %t", v, p, ok)
		}
	}
	if got := Values[JobStep](); len(got) != 8 || got[0] != JobStep_JOB_STEP_FENCE || got[7] != JobStep_JOB_STEP_DONE {
		t.Errorf("Values[JobStep]() = %v", got)
	}
}
