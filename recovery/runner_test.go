package recovery_test

import (
	"context"
	"sync"
	"testing"
	"time"

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
		r := recovery.NewRunner(cfg, id, c.s, member{c, id}, blockingRun{}, testLogger())
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
