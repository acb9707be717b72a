package recovery_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// TestMissingWALBlocksThenResolvedAsLost (issue 21, finding 6): a job
// whose WAL cannot be found retried forever. Now it retries for
// blocked_after, then enters blocked with the error; resolved with the WAL
// declared lost, its next attempt reads nothing and closes the broker's
// streams, and the job succeeds.
func TestMissingWALBlocksThenResolvedAsLost(t *testing.T) {
	c := newTestCluster(t, "c1")
	sc := newScenario(t, c, t.TempDir(), 4, 100)
	if err := os.Remove(sc.walPath); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.BlockedAfter = 600 * time.Millisecond
	store := newStore(t, s3test.StartFake(t))
	exe := newExecutor(c, "c1", cfg, store, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	r := recovery.NewRunner(cfg, "c1", c.s, c.Member("c1"), exe, testLogger())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	start := time.Now()
	j := c.declare(sc.broker, sc.epoch, "c1")
	j = waitJob(t, c, j.GetJobId(), 20*time.Second, "blocked", func(j *waldenv1.Job) bool {
		return j.GetJobState() == waldenv1.JobState_JOB_STATE_BLOCKED
	})
	if since := time.Since(start); since < cfg.BlockedAfter {
		t.Fatalf("blocked %s after the decision, before blocked_after (%s)", since, cfg.BlockedAfter)
	}
	if !strings.Contains(j.GetError(), "no such file") || j.GetAttempt() != 1 {
		t.Fatalf("blocked job: attempt %d, error %q", j.GetAttempt(), j.GetError())
	}
	// Nothing runs it any more.
	time.Sleep(3 * cfg.RetryMax)
	if j2, _ := c.s.Job(j.GetJobId()); j2.GetJobState() != waldenv1.JobState_JOB_STATE_BLOCKED || j2.GetUpdatedUnixMs() != j.GetUpdatedUnixMs() {
		t.Fatalf("a blocked job kept being worked on: %v", j2)
	}

	c.must(&waldenv1.ResolveJob{JobId: j.GetJobId(), Reason: "broker host lost with its disk", WalLost: true, LiveMembers: []string{"c1"}})
	j = waitJob(t, c, j.GetJobId(), 20*time.Second, "succeeded without the WAL", func(j *waldenv1.Job) bool {
		return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED
	})
	if j.GetAttempt() != 2 || j.GetRecoveredWalOffset() != -1 {
		t.Fatalf("resolved job: %v", j)
	}
	if open := c.s.OpeningStreams(sc.broker); len(open) != 0 {
		t.Fatalf("streams still opened after the resolution: %v", open)
	}
}

// TestEpochNeverGrantedNeedsNoWAL (issue 21): a broker killed before any
// majority granted its epoch a lease acknowledged nothing under it; with
// its earlier epochs recovered, its job reads no WAL: a WAL that was never
// written does not block it. The job says why in an event and succeeds.
func TestEpochNeverGrantedNeedsNoWAL(t *testing.T) {
	c := newTestCluster(t, "c1", "c2", "c3")
	epoch := c.must(&waldenv1.RegisterBroker{BrokerId: "b9", Wal: &waldenv1.WalLocation{Path: "/nonexistent/b9.wal"}}).GetRegisterBroker().GetEpoch()
	c.must(&waldenv1.OpenStreamRequest{BrokerId: "b9", BrokerEpoch: epoch, StreamId: 9})
	for _, id := range []string{"c1", "c2"} {
		if _, err := c.apply(id, op(&waldenv1.ObserveBroker{ObserverId: id, BrokerId: "b9", Epoch: epoch, LeaseExpired: true, NeverGranted: true,
			ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD})); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig()
	cfg.BlockedAfter = 600 * time.Millisecond
	exe := newExecutor(c, "c1", cfg, newStore(t, s3test.StartFake(t)), nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	r := recovery.NewRunner(cfg, "c1", c.s, c.Member("c1"), exe, testLogger())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	j := c.declare("b9", epoch, "c1")
	if !j.GetAcknowledgedNothing() {
		t.Fatalf("job: %v", j)
	}
	j = waitJob(t, c, j.GetJobId(), 20*time.Second, "succeeded without its WAL", func(j *waldenv1.Job) bool {
		return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED || j.GetJobState() == waldenv1.JobState_JOB_STATE_BLOCKED
	})
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED || j.GetAttempt() != 1 || j.GetBlockedUnixMs() != 0 {
		t.Fatalf("job of an epoch never granted: %v", j)
	}
	if open := c.s.OpeningStreams("b9"); len(open) != 0 {
		t.Fatalf("streams still opened: %v", open)
	}
	found := false
	for _, e := range c.s.Events("b9", 0) {
		if e.GetEventKind() == waldenv1.EventKind_EVENT_KIND_RECOVERY && strings.Contains(e.GetMessage(), "never granted") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no event says why the WAL was not read: %v", c.s.Events("b9", 0))
	}
}
