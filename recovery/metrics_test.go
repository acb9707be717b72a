package recovery_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"walden/objstore"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// stepRuns records what the executor reports to its Metrics.
type stepRuns struct {
	mu   sync.Mutex
	runs []string // "step ok" or "step error"
}

func (s *stepRuns) StepRun(step waldenv1.JobStep, d time.Duration, failed bool) {
	res := "ok"
	if failed {
		res = "error"
	}
	s.mu.Lock()
	s.runs = append(s.runs, step.Name()+" "+res)
	s.mu.Unlock()
}

func (s *stepRuns) count(run string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.runs {
		if r == run {
			n++
		}
	}
	return n
}

// TestExecutorReportsStepRuns: with S3 down the read step's failed runs
// are reported (it asks S3 for the objects that hold the WAL's committed
// records); once S3 is back every step is reported done: attach and read
// once per run of the builtin action (each retry runs them again), the
// others once.
func TestExecutorReportsStepRuns(t *testing.T) {
	dir := t.TempDir()
	fs, err := objstore.ServeFake("", dir, nil, s3test.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	addr := fs.Addr().String()
	s3cfg := objstore.FakeConfig(fs.Endpoint, s3test.Bucket)
	c := newTestCluster(t, "c1")
	sc := newScenario(t, c, t.TempDir(), 6, 1000)
	cfg := testConfig()
	store := newStore(t, s3cfg)
	c.seed(store)
	fs.Kill()
	runs := &stepRuns{}
	exe := recovery.NewExecutor(recovery.ExecutorConfig{Config: cfg, NodeID: "c1", State: c.s, Cluster: c.Member("c1"),
		Store: store, Metrics: runs, Logger: testLogger()})
	ctx, cancel := context.WithCancel(context.Background())
	r := recovery.NewRunner(cfg, "c1", c.s, c.Member("c1"), exe, testLogger())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	j := c.declare(sc.broker, sc.epoch, "c1")
	waitJob(t, c, j.GetJobId(), 10*time.Second, "read retried", func(*waldenv1.Job) bool { return runs.count("read error") >= 2 })
	fs2, err := objstore.ServeFake(addr, dir, nil, s3test.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	defer fs2.Close(context.Background())
	waitJob(t, c, j.GetJobId(), 30*time.Second, "succeeded", func(j *waldenv1.Job) bool { return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED })
	runs.mu.Lock()
	all := strings.Join(runs.runs, ", ")
	runs.mu.Unlock()
	tries := runs.count("read error") + 1
	for step, want := range map[string]int{"fence": 1, "attach": tries, "read": 1, "upload": 1, "commit": 1, "close": 1, "detach": 1} {
		if n := runs.count(step + " ok"); n != want {
			t.Errorf("%s reported done %d times, want %d (runs: %s)", step, n, want, all)
		}
	}
}
