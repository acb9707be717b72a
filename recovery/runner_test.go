package recovery_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// blockingRun is a JobRunner that runs until its context ends.
type blockingRun struct{}

func (blockingRun) Run(ctx context.Context, _ string, _ uint32) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestNewLeaderRestartsJobLeaseClock: the assignee is down and never
// renews; the leader changes before the job lease runs out on the old
// leader's clock. The new leader reassigns no earlier than a full job_lease
// after it became leader, and then exactly once (attempt 2).
func TestNewLeaderRestartsJobLeaseClock(t *testing.T) {
	c := newTestCluster(t, "c1", "c2", "c3")
	c.setLeader("c2")
	cfg := testConfig()
	sc := newScenario(t, c, t.TempDir(), 2, 10)
	c.setDown("c1", true)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, id := range []string{"c2", "c3"} {
		r := recovery.NewRunner(cfg, id, c.s, c.Member(id), blockingRun{}, testLogger())
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()

	c.setDown("c1", false)
	j := c.declare(sc.broker, sc.epoch, "c1")
	c.setDown("c1", true)
	time.Sleep(cfg.JobLease * 2 / 3)
	c.setLeader("c3")
	elected := time.Now()
	j = waitJob(t, c, j.GetJobId(), 10*time.Second, "reassigned", func(j *waldenv1.Job) bool { return j.GetAttempt() >= 2 })
	if since := time.Since(elected); since < cfg.JobLease {
		t.Fatalf("reassigned %s after the new leader's election, before a full job_lease (%s)", since, cfg.JobLease)
	}
	if j.GetAttempt() != 2 || j.GetAssigneeId() == "c1" {
		t.Fatalf("attempt %d on %q", j.GetAttempt(), j.GetAssigneeId())
	}
	// The new assignee renews: no further reassignment.
	time.Sleep(2 * cfg.JobLease)
	if j2, _ := c.s.Job(j.GetJobId()); j2.GetAttempt() != 2 {
		t.Fatalf("attempt %d: reassigned although the assignee renews", j2.GetAttempt())
	}
}

// slowStop is a JobRunner whose attempts take a while to stop after their
// context ends (a plugin being killed and reaped); it records how many run
// at once.
type slowStop struct {
	mu           sync.Mutex
	active, most int
	starts       int
	stopTakes    time.Duration
	attemptsSeen []uint32
}

func (s *slowStop) Run(ctx context.Context, _ string, attempt uint32) error {
	s.mu.Lock()
	s.active++
	s.starts++
	s.most = max(s.most, s.active)
	s.attemptsSeen = append(s.attemptsSeen, attempt)
	s.mu.Unlock()
	<-ctx.Done()
	time.Sleep(s.stopTakes)
	s.mu.Lock()
	s.active--
	s.mu.Unlock()
	return ctx.Err()
}

// TestNextAttemptWaitsForThePreviousOne: a job reassigned back to the same
// member (the only live one) starts its next attempt there only after the
// previous attempt has stopped: two attempts of one job never run at once
// on a member.
func TestNextAttemptWaitsForThePreviousOne(t *testing.T) {
	c := newTestCluster(t, "c1")
	cfg := testConfig()
	sc := newScenario(t, c, t.TempDir(), 2, 10)
	run := &slowStop{stopTakes: 500 * time.Millisecond}
	r := recovery.NewRunner(cfg, "c1", c.s, c.Member("c1"), run, testLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	j := c.declare(sc.broker, sc.epoch, "c1")
	testutil.EventuallyTrue(t, 10*time.Second, "attempt 1 running", func() bool { return r.Running()[j.GetJobId()] == 1 })
	// Attempt 2, on c1 again.
	c.must(&waldenv1.ReassignJob{JobId: j.GetJobId(), Attempt: 1, LiveMembers: []string{"c1"}, Reason: "test"})
	testutil.EventuallyTrue(t, 10*time.Second, "attempt 2 running", func() bool { return r.Running()[j.GetJobId()] == 2 })
	run.mu.Lock()
	defer run.mu.Unlock()
	if run.most != 1 || run.starts != 2 {
		t.Fatalf("%d attempts ran at once (%d started: %v)", run.most, run.starts, run.attemptsSeen)
	}
}
