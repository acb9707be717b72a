package recovery_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// fourthTarget is a target written outside package recovery, as a fourth
// one would be: it attaches, fails its first run after the read step (the
// executor retries it), reports progress, and finishes.
type fourthTarget struct {
	runs     atomic.Int32
	attached atomic.Value // string
}

func (f *fourthTarget) Recover(ctx context.Context, r *recovery.Run) (waldenv1.JobStep, error) {
	n := f.runs.Add(1)
	path, err := r.Attach(ctx)
	if err != nil {
		return waldenv1.JobStep_JOB_STEP_ATTACH, err
	}
	f.attached.Store(path)
	if err := r.StepDone(ctx, waldenv1.JobStep_JOB_STEP_READ, "read the test WAL"); err != nil {
		return waldenv1.JobStep_JOB_STEP_READ, err
	}
	if n == 1 {
		return waldenv1.JobStep_JOB_STEP_UPLOAD, errors.New("the first upload fails")
	}
	p := r.Progress(ctx, waldenv1.JobStep_JOB_STEP_UPLOAD, 100, nil)
	for i := 0; i < 10; i++ {
		p.Add(10)
		time.Sleep(2 * time.Millisecond)
	}
	p.Stop()
	if err := r.Checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: waldenv1.JobStep_JOB_STEP_UPLOAD, StepDone: true,
		BytesUploaded: p.Done(), BytesTotal: 100, Detail: "uploaded by the fourth target"}); err != nil {
		return waldenv1.JobStep_JOB_STEP_UPLOAD, err
	}
	if err := r.Detach(ctx); err != nil {
		return waldenv1.JobStep_JOB_STEP_DETACH, err
	}
	return waldenv1.JobStep_JOB_STEP_DONE, r.Finish(ctx, 42)
}

// TestFourthTargetIsOneRegistration registers a target from outside the
// package and runs a job through it: the executor's fence step, retries
// with the error shown in the job, attach and detach plugins, checkpoints
// and the finish serve it as they serve the builtin and exec targets.
func TestFourthTargetIsOneRegistration(t *testing.T) {
	f := &fourthTarget{}
	recovery.RegisterTarget("fourth-test", func(context.Context, recovery.TargetDeps) (recovery.Target, error) { return f, nil })
	if !strings.Contains(strings.Join(recovery.RegisteredTargets(), ","), "fourth-test") {
		t.Fatalf("registered targets %v lack fourth-test", recovery.RegisteredTargets())
	}
	c := newTestCluster(t, "c1", "c2", "c3")
	walPath := filepath.Join(t.TempDir(), "b9.wal")
	if err := os.WriteFile(walPath, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	epoch := c.must(&waldenv1.RegisterBroker{BrokerId: "b9", Wal: &waldenv1.WalLocation{Path: walPath}}).GetRegisterBroker().GetEpoch()

	cfg := testConfig()
	cfg.Action = "fourth-test"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a registered target's name is a valid recovery.action: %v", err)
	}
	target, err := recovery.NewTarget(context.Background(), recovery.TargetDeps{Config: cfg, NodeID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	exe := recovery.NewExecutor(recovery.ExecutorConfig{Config: cfg, NodeID: "c1", State: c.s, Cluster: c.Member("c1"), Target: target, Logger: testLogger()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := recovery.NewRunner(cfg, "c1", c.s, c.Member("c1"), exe, testLogger())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	j := c.declare("b9", epoch, "c1")
	j = waitJob(t, c, j.GetJobId(), 30*time.Second, "succeeded", func(j *waldenv1.Job) bool {
		return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED
	})
	cancel()
	<-done
	if got := f.runs.Load(); got < 2 {
		t.Fatalf("target ran %d times, want a retry after the first failure", got)
	}
	if p, _ := f.attached.Load().(string); p != walPath {
		t.Fatalf("attached %q, want the registered WAL %q", p, walPath)
	}
	if j.GetRecoveredWalOffset() != 42 || j.GetBytesUploaded() != 100 || j.GetBytesTotal() != 100 {
		t.Fatalf("job: recovered %d, %d/%d bytes", j.GetRecoveredWalOffset(), j.GetBytesUploaded(), j.GetBytesTotal())
	}
	steps := map[waldenv1.JobStep]bool{}
	for _, cp := range j.GetCheckpoints() {
		steps[cp.GetJobStep()] = true
	}
	for _, s := range []waldenv1.JobStep{waldenv1.JobStep_JOB_STEP_FENCE, waldenv1.JobStep_JOB_STEP_ATTACH, waldenv1.JobStep_JOB_STEP_READ,
		waldenv1.JobStep_JOB_STEP_UPLOAD, waldenv1.JobStep_JOB_STEP_DETACH} {
		if !steps[s] {
			t.Errorf("no checkpoint marks step %s done", s.Name())
		}
	}
}

// TestUnknownTargetIsAConfigError: an action no package registered is
// refused when the member starts, naming the key.
func TestUnknownTargetIsAConfigError(t *testing.T) {
	cfg := recovery.DefaultConfig()
	cfg.Action = "carrier-pigeon"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "recovery.action") {
		t.Fatalf("Validate: %v, want an error naming recovery.action", err)
	}
	_, err := recovery.NewTarget(context.Background(), recovery.TargetDeps{Config: cfg})
	var ce *recovery.ConfigError
	if !errors.As(err, &ce) || ce.Key != "action" {
		t.Fatalf("NewTarget: %v, want a ConfigError on action", err)
	}
}
