package recovery_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"walden/fsm"
	"walden/internal/testutil"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

func script(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestExecFenceAndAttach runs the builtin action with the exec fence and
// attach plugins (a real bash script): the script gets the job JSON on
// stdin and the WALDEN_* environment, and its {"path"} line names the WAL.
func TestExecFenceAndAttach(t *testing.T) {
	s3cfg := s3test.StartFake(t)
	c := newTestCluster(t, "c1")
	dir := t.TempDir()
	sc := newScenario(t, c, dir, 3, 1000)
	logDir := t.TempDir()
	cfg := testConfig()
	cfg.Fence, cfg.Attach = recovery.FenceExec, recovery.AttachExec
	cfg.Exec = recovery.Exec{Command: script(t, "plugin.sh"), Args: []string{logDir, sc.walPath}, Timeout: 10 * time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	fencer, attacher, err := recovery.NewPlugins(context.Background(), cfg, nil, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, s3cfg)
	exe := newExecutor(c, "c1", cfg, store, fencer, attacher)
	j := c.declare(sc.broker, sc.epoch, "c1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := exe.Run(ctx, j.GetJobId(), 1); err != nil {
		t.Fatal(err)
	}
	j, _ = c.s.Job(j.GetJobId())
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job %s: %s", j.GetJobState().Name(), j.GetError())
	}
	calls, err := os.ReadFile(filepath.Join(logDir, "calls.log"))
	if err != nil {
		t.Fatal(err)
	}
	want := "fence b1 token=2 attempt=1\nattach b1 token=2 attempt=1\ndetach b1 token=2 attempt=1\n"
	if string(calls) != want {
		t.Fatalf("calls:\n%s\nwant:\n%s", calls, want)
	}
	in, _ := os.ReadFile(filepath.Join(logDir, "attach.json"))
	for _, k := range []string{`"op":"attach"`, `"job_id":"job-b1-2"`, `"volume_id":"vol-0b1"`, `"wal_path":"` + sc.walPath + `"`} {
		if !strings.Contains(string(in), k) {
			t.Fatalf("job JSON %s lacks %s", in, k)
		}
	}
	details := map[string]string{}
	for _, cp := range j.GetCheckpoints() {
		details[cp.GetJobStep().Name()] = cp.GetDetail()
	}
	if details["fence"] != "host of b1 powered off" || details["detach"] != "released "+sc.walPath {
		t.Fatalf("checkpoints %v", details)
	}
	checkCommitted(t, c, store, sc)
}

// TestExecAction delegates the whole recovery to a bash script: a failing
// run is retried with its error shown, progress lines become checkpoints,
// and after exit 0 the streams left opened are closed and the job
// succeeds with the reported WAL offset.
func TestExecAction(t *testing.T) {
	c := newTestCluster(t, "c1")
	sc := newScenario(t, c, t.TempDir(), 2, 100)
	stateDir := t.TempDir()
	cfg := testConfig()
	cfg.Action = recovery.ActionExec
	cfg.RetryMin, cfg.RetryMax = 400*time.Millisecond, time.Second
	cfg.Exec = recovery.Exec{Command: script(t, "recover.sh"), Args: []string{stateDir}, Timeout: 10 * time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	exe := newExecutor(c, "c1", cfg, nil, nil, nil)
	j := c.declare(sc.broker, sc.epoch, "c1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- exe.Run(ctx, j.GetJobId(), 1) }()
	waitJob(t, c, j.GetJobId(), 10*time.Second, "the failed run's error", func(j *waldenv1.Job) bool {
		return strings.Contains(j.GetError(), "exit status 3") && strings.Contains(j.GetError(), "controller unreachable")
	})
	sawUpload := false
	deadline := time.Now().Add(10 * time.Second)
	for {
		cur, _ := c.s.Job(j.GetJobId())
		if cur.GetJobStep() == waldenv1.JobStep_JOB_STEP_UPLOAD && cur.GetBytesTotal() == 1024 {
			sawUpload = true
		}
		if cur.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	j, _ = c.s.Job(j.GetJobId())
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED || j.GetRecoveredWalOffset() != 123456 || !sawUpload {
		t.Fatalf("job %s offset %d, upload progress seen %v", j.GetJobState().Name(), j.GetRecoveredWalOffset(), sawUpload)
	}
	for _, st := range c.s.Streams(sc.broker, "") {
		if st.GetState() != fsm.StreamClosed {
			t.Fatalf("stream %d still %s", st.GetStreamId(), st.GetState())
		}
	}
	in, _ := os.ReadFile(filepath.Join(stateDir, "recover.json"))
	if !strings.Contains(string(in), `"streams":[{"stream_id":1,"epoch":1,"start_offset":0,"end_offset":10}`) {
		t.Fatalf("recover JSON: %s", in)
	}
	calls, _ := os.ReadFile(filepath.Join(stateDir, "calls.log"))
	if strings.Count(string(calls), "run attempt=1") != 2 {
		t.Fatalf("runs: %s", calls)
	}
}

// TestExecStopKillsTheProcessGroup: stopping an attempt kills the exec
// action and every process it started, and returns only once they are
// gone, so that the next attempt never overlaps with them.
func TestExecStopKillsTheProcessGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	sh := filepath.Join(dir, "action.sh")
	body := "#!/bin/bash\nsleep 300 &\necho $! > " + pidFile + "\nwait\n"
	if err := os.WriteFile(sh, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- recovery.RunExecForTest(ctx, recovery.Exec{Command: sh, Timeout: time.Minute})
	}()
	var pid int
	deadline := time.Now().Add(10 * time.Second)
	for pid == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the action never started its child")
		}
		if b, err := os.ReadFile(pidFile); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("the stopped action did not return")
	}
	// The child is gone (killed with the group; reaped by init, so signal 0
	// fails or the process is a zombie on its way out).
	testutil.EventuallyTrue(t, 5*time.Second, "the action's child gone", func() bool {
		if syscall.Kill(pid, 0) != nil {
			return true
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(st), ") Z ")
	})
}
