package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"walden/internal/testutil"
)

// testWatchdogCommand runs the test binary as the watchdog process (see
// TestMain).
func testWatchdogCommand(t testing.TB) []string {
	t.Helper()
	env, err := exec.LookPath("env")
	if err != nil {
		t.Skip("no env command")
	}
	return []string{env, "WALDEN_AGENT_TEST_ROLE=watchdog", os.Args[0]}
}

// testBrokerCommand runs the test binary as a stand-in broker that listens
// on listen when it is not empty.
func testBrokerCommand(t testing.TB, listen string) []string {
	t.Helper()
	env, err := exec.LookPath("env")
	if err != nil {
		t.Skip("no env command")
	}
	argv := []string{env, "WALDEN_AGENT_TEST_ROLE=broker", os.Args[0]}
	if listen != "" {
		argv = append(argv, listen)
	}
	return argv
}

func devNull(t testing.TB) *os.File {
	t.Helper()
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func startTestWatchdog(t *testing.T, killCommand []string) *watchdogClient {
	t.Helper()
	null := devNull(t)
	wd, err := startWatchdog(testWatchdogCommand(t), null, null, killCommand, time.Second, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wd.close(10 * time.Second) })
	return wd
}

// nextEvent waits for the watchdog's next event of kind.
func nextEvent(t *testing.T, wd *watchdogClient, kind string, within time.Duration) watchdogEvent {
	t.Helper()
	timeout := time.After(testutil.Deadline(within))
	for {
		select {
		case e := <-wd.events:
			if e.Event == kind {
				return e
			}
			t.Logf("watchdog event %+v", e)
		case <-timeout:
			t.Fatalf("no %s event within %s", kind, within)
		}
	}
}

// groupMembers lists the live processes of process group pgid.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := readProc(pid); err == nil && p.pgid == pgid && !p.dead() {
			out = append(out, pid)
		}
	}
	return out
}

// TestWatchdogKillsTheGroupAtItsDeadline: a broker started by the
// watchdog process lives until the deadline the agent last gave, not a
// moment less, then its whole process group is SIGKILLed (a shell and the
// two sleeps it started) and the watchdog reports the kill and the exit.
func TestWatchdogKillsTheGroupAtItsDeadline(t *testing.T) {
	wd := startTestWatchdog(t, nil)
	deadline := bootNS() + int64(1500*time.Millisecond)
	wd.setDeadline(deadline, "")
	e, err := wd.request(context.Background(), watchdogMsg{Op: opStart, Argv: []string{"sh", "-c", "sleep 600 & sleep 600 & wait"}})
	if err != nil || e.Event != evStarted {
		t.Fatalf("start: %+v, %v", e, err)
	}
	if e.PGID != e.PID {
		t.Fatalf("the broker leads no process group of its own: pid %d, pgid %d", e.PID, e.PGID)
	}
	testutil.Eventually(t, 5*time.Second, "the shell and its two sleeps", func() error {
		if n := len(groupMembers(t, e.PGID)); n != 3 {
			return fmt.Errorf("%d processes in the group", n)
		}
		return nil
	})
	killed := nextEvent(t, wd, evKilled, 10*time.Second)
	if killed.AtNS < deadline || killed.Reason != KillLease || killed.DeadlineNS != deadline {
		t.Fatalf("killed %+v: before the deadline %d, or for another reason", killed, deadline)
	}
	exited := nextEvent(t, wd, evExited, 10*time.Second)
	if exited.PID != e.PID || exited.AtNS < killed.AtNS {
		t.Fatalf("exited %+v after killed %+v", exited, killed)
	}
	t.Logf("killed %s after its deadline, reaped %s after the kill", time.Duration(killed.AtNS-deadline), time.Duration(exited.AtNS-killed.AtNS))
	testutil.Eventually(t, 5*time.Second, "every process of the group dead", func() error {
		if m := groupMembers(t, e.PGID); len(m) > 0 {
			return fmt.Errorf("still alive: %v", m)
		}
		return nil
	})
}

// TestWatchdogFollowsTheDeadline: while the agent keeps moving the deadline
// (as renewals do) the broker lives; once the messages stop — the agent is
// stalled, or cut off — it dies at the last deadline it was told.
func TestWatchdogFollowsTheDeadline(t *testing.T) {
	wd := startTestWatchdog(t, nil)
	// The deadline stays this far ahead while it moves: longer than the
	// pauses of a loaded machine (stretched under the race detector).
	lead := testutil.Deadline(time.Second)
	wd.setDeadline(bootNS()+int64(lead), "")
	e, err := wd.request(context.Background(), watchdogMsg{Op: opStart, Argv: []string{"sleep", "600"}})
	if err != nil || e.Event != evStarted {
		t.Fatalf("start: %+v, %v", e, err)
	}
	var last int64
	for range 10 {
		last = bootNS() + int64(lead)
		wd.setDeadline(last, "")
		select {
		case ev := <-wd.events:
			t.Fatalf("event while the deadline moves: %+v", ev)
		case <-time.After(lead / 4):
		}
	}
	killed := nextEvent(t, wd, evKilled, 10*time.Second)
	if killed.AtNS < last || killed.DeadlineNS != last {
		t.Fatalf("killed %+v, the last deadline was %d", killed, last)
	}
	nextEvent(t, wd, evExited, 10*time.Second)
}

// TestWatchdogRefusesABrokerWithoutLease: no start without a deadline in
// the future; a deadline of now kills a running broker at once with the
// reason the agent gave.
func TestWatchdogRefusesABrokerWithoutLease(t *testing.T) {
	wd := startTestWatchdog(t, nil)
	e, err := wd.request(context.Background(), watchdogMsg{Op: opStart, Argv: []string{"sleep", "600"}})
	if err != nil || e.Event != evStartFailed || !strings.Contains(e.Error, "no valid lease") {
		t.Fatalf("start without a lease: %+v, %v", e, err)
	}
	wd.setDeadline(bootNS()+int64(time.Hour), "")
	e, err = wd.request(context.Background(), watchdogMsg{Op: opStart, Argv: []string{"sleep", "600"}})
	if err != nil || e.Event != evStarted {
		t.Fatalf("start: %+v, %v", e, err)
	}
	if e2, _ := wd.request(context.Background(), watchdogMsg{Op: opStart, Argv: []string{"sleep", "600"}}); e2.Event != evStartFailed {
		t.Fatalf("a second broker was started: %+v", e2)
	}
	wd.setDeadline(deadlineNow, KillFenced)
	if k := nextEvent(t, wd, evKilled, 10*time.Second); k.Reason != KillFenced || k.PID != e.PID {
		t.Fatalf("killed %+v, want pid %d for %s", k, e.PID, KillFenced)
	}
	nextEvent(t, wd, evExited, 10*time.Second)
}

// TestWatchdogKillsWhenItsAgentGoes: a watchdog whose agent closes its
// input (stops, or dies) kills the broker before it exits.
func TestWatchdogKillsWhenItsAgentGoes(t *testing.T) {
	null := devNull(t)
	wd, err := startWatchdog(testWatchdogCommand(t), null, null, nil, time.Second, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	wd.setDeadline(bootNS()+int64(time.Hour), "")
	e, err := wd.request(context.Background(), watchdogMsg{Op: opStart, Argv: []string{"sleep", "600"}})
	if err != nil || e.Event != evStarted {
		t.Fatalf("start: %+v, %v", e, err)
	}
	wd.close(10 * time.Second)
	if wd.alive() {
		t.Fatal("the watchdog process did not exit")
	}
	testutil.Eventually(t, 5*time.Second, "the broker dead", func() error {
		if alive, _ := sameProcess(e.PID, e.Start); alive {
			return errors.New("alive")
		}
		return nil
	})
}

// TestWatchdogAdoptsAPIDFileProcess: a broker someone else started is
// killed at its deadline too (its process group, here of its own), and its
// exit is seen without being its parent.
func TestWatchdogAdoptsAPIDFileProcess(t *testing.T) {
	wd := startTestWatchdog(t, nil)
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() { _ = cmd.Wait(); close(reaped) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-reaped })
	p, err := readProc(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := wd.request(context.Background(), watchdogMsg{Op: opAdopt, PID: cmd.Process.Pid, Start: p.start + 1}); e.Event != evAdoptFailed {
		t.Fatalf("adopted a process of another start time: %+v", e)
	}
	deadline := bootNS() + int64(500*time.Millisecond)
	wd.setDeadline(deadline, "")
	e, err := wd.request(context.Background(), watchdogMsg{Op: opAdopt, PID: cmd.Process.Pid, Start: p.start})
	if err != nil || e.Event != evAdopted || e.PGID != cmd.Process.Pid {
		t.Fatalf("adopt: %+v, %v", e, err)
	}
	if k := nextEvent(t, wd, evKilled, 10*time.Second); k.AtNS < deadline {
		t.Fatalf("killed %+v before the deadline %d", k, deadline)
	}
	if x := nextEvent(t, wd, evExited, 10*time.Second); x.PID != cmd.Process.Pid {
		t.Fatalf("exited %+v", x)
	}
	select {
	case <-reaped:
	case <-time.After(testutil.Deadline(5 * time.Second)):
		t.Fatal("the adopted process still runs")
	}
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the adopted process ended with %v, want SIGKILL", cmd.ProcessState)
	}
}

// TestWatchdogKillCommand: the configured kill command kills the broker
// (with its pid in the environment); one that fails is followed by
// SIGKILL.
func TestWatchdogKillCommand(t *testing.T) {
	for _, c := range []struct {
		name    string
		command []string
		failed  bool
	}{
		{"works", []string{"sh", "-c", `kill -9 "$WALDEN_BROKER_PID"`}, false},
		{"fails", []string{"sh", "-c", "exit 3"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			wd := startTestWatchdog(t, c.command)
			wd.setDeadline(bootNS()+int64(time.Hour), "")
			e, err := wd.request(context.Background(), watchdogMsg{Op: opStart, Argv: []string{"sleep", "600"}})
			if err != nil || e.Event != evStarted {
				t.Fatalf("start: %+v, %v", e, err)
			}
			wd.send(watchdogMsg{Op: opKill, Reason: KillHealth})
			if c.failed {
				if f := nextEvent(t, wd, evKillFailed, 10*time.Second); !strings.Contains(f.Error, "exit status 3") {
					t.Fatalf("kill_failed %+v", f)
				}
			}
			k := nextEvent(t, wd, evKilled, 10*time.Second)
			want := "kill command"
			if c.failed {
				want = "process group"
			}
			if !strings.Contains(k.Via, want) || k.Reason != KillHealth {
				t.Fatalf("killed %+v, want via %q", k, want)
			}
			x := nextEvent(t, wd, evExited, 10*time.Second)
			if !strings.Contains(x.Status, "killed") {
				t.Fatalf("exited %+v", x)
			}
		})
	}
}

func TestParseProcStat(t *testing.T) {
	p, err := parseProcStat([]byte("4242 (java (x) y) S 1 4240 4240 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 30 0 987654 1 2 3"))
	if err != nil || p.state != 'S' || p.pgid != 4240 || p.start != 987654 {
		t.Fatalf("parseProcStat = %+v, %v", p, err)
	}
	if _, err := parseProcStat([]byte("42 (x) S 1")); err == nil {
		t.Fatal("a short stat line parsed")
	}
	self, err := readProc(os.Getpid())
	if err != nil || self.dead() || self.pgid == 0 {
		t.Fatalf("readProc(self) = %+v, %v", self, err)
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	os.WriteFile(pidFile, []byte(" 123\n"), 0o644)
	if pid, err := readPIDFile(pidFile); err != nil || pid != 123 {
		t.Fatalf("readPIDFile = %d, %v", pid, err)
	}
	os.WriteFile(pidFile, []byte("abc"), 0o644)
	if _, err := readPIDFile(pidFile); err == nil {
		t.Fatal("a pid file without a pid was read")
	}
}
