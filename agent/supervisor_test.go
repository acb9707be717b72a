package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"walden/config"
	"walden/internal/testutil"
	"walden/wal"
)

// recorder is a BrokerObserver that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	states []BrokerState
	armed  []bool
	kills  []KillRecord
	checks map[string]int
}

func (r *recorder) BrokerState(s BrokerState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = append(r.states, s)
}

func (r *recorder) WatchdogArmed(a bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = append(r.armed, a)
}

func (r *recorder) Kill(k KillRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kills = append(r.kills, k)
}

func (r *recorder) CheckFailed(c string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checks == nil {
		r.checks = map[string]int{}
	}
	r.checks[c]++
}

func (r *recorder) killRecords() []KillRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.kills)
}

// watchedConfig is testConfig with a broker the agent starts (the test
// binary as a stand-in broker, listening on listen when set) under the
// watchdog.
func watchedConfig(t testing.TB, listen string, coords ...string) *config.Agent {
	cfg := testConfig(coords...)
	cfg.Broker = config.AgentBroker{
		Command: testBrokerCommand(t, listen), CheckInterval: 100 * time.Millisecond, HealthTimeout: 100 * time.Millisecond,
		FailureThreshold: 3, StartTimeout: 20 * time.Second, Restart: true, StopTimeout: 5 * time.Second,
	}
	cfg.Watchdog = config.AgentWatchdog{Enabled: true, KillMargin: 300 * time.Millisecond, KillTimeout: time.Second}
	return cfg
}

func watchedOptions(t testing.TB, rec *recorder) Options {
	null := devNull(t)
	return Options{WatchdogCommand: testWatchdogCommand(t), BrokerStdout: null, BrokerStderr: null, BrokerObserver: rec}
}

// waitBroker waits until the agent reports its broker in state.
func waitBroker(t *testing.T, a *Agent, state BrokerState, within time.Duration) BrokerStatus {
	t.Helper()
	var st BrokerStatus
	testutil.Eventually(t, within, "broker "+string(state), func() error {
		st = a.Broker()
		if st.State != state {
			return fmt.Errorf("broker %s (%s)", st.State, st.Reason)
		}
		return nil
	})
	return st
}

// exitTime reports on the returned channel the boot clock reading at which
// process pid exits, seen through a pidfd (the test is not its parent).
func exitTime(t *testing.T, pid int) <-chan int64 {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	ch := make(chan int64, 1)
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
				break
			}
		}
		ch <- bootNS()
	}()
	return ch
}

func healthz(t *testing.T, a *Agent) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + a.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBrokerKilledStopsRenewals: the broker dying beside a live agent (a
// SIGKILL from outside) stops the agent's renewals at once, voids its lease
// and makes its probes answer 503; after the cluster's failure_timeout, a
// lease and decisionSlack it registers again (a new epoch) and starts the
// broker again.
func TestBrokerKilledStopsRenewals(t *testing.T) {
	c := newFakeCluster(t, 3, time.Second, testDrift, nil)
	c.failureTimeout = 300 * time.Millisecond
	rec := &recorder{}
	a := startAgent(t, watchedConfig(t, "", c.addrs()...), watchedOptions(t, rec))
	st := waitBroker(t, a, BrokerUp, 20*time.Second)
	if st.PID == 0 || !st.WatchdogArmed || st.Starts != 1 {
		t.Fatalf("broker up: %+v", st)
	}
	if code, _ := healthz(t, a); code != http.StatusOK {
		t.Fatalf("healthz %d while the broker is up", code)
	}
	epoch := a.Lease().Epoch
	if err := unix.Kill(st.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	down := waitBroker(t, a, BrokerDown, 10*time.Second)
	if !strings.Contains(down.Reason, "exited") || down.RegisterIn != 300*time.Millisecond+time.Second+decisionSlack {
		t.Fatalf("down: %+v; want its exit and a registration in failure_timeout + lease_ttl", down)
	}
	if l := a.Lease(); l.Valid {
		t.Fatalf("lease valid with the broker down: %+v", l)
	}
	if code, body := healthz(t, a); code != http.StatusServiceUnavailable || !strings.Contains(body, "broker down") {
		t.Fatalf("healthz %d %q with the broker down", code, body)
	}
	// No renewal after the down (one in flight may land).
	before := c.stats().renewals
	time.Sleep(500 * time.Millisecond)
	if after := c.stats().renewals; after > before+3 {
		t.Fatalf("renewals went on with the broker down: %d, then %d", before, after)
	}
	// Registered again with a new epoch, and the broker started again.
	st = waitBroker(t, a, BrokerUp, 20*time.Second)
	if l := a.Lease(); l.Epoch <= epoch || st.Starts != 2 {
		t.Fatalf("after the restart: lease %+v, broker %+v", l, st)
	}
}

// TestWatchdogKillsBeforeAnyAttestation (the agent cut off from every
// coordinator): the broker's process group is SIGKILLed before the earliest
// instant a majority of the coordinators may attest that the lease ran out,
// measured on the boot clock against when each coordinator granted.
// Variant stalled: the broker was SIGSTOPped first (a long GC pause, a
// stopped VM process): it is dead all the same.
func TestWatchdogKillsBeforeAnyAttestation(t *testing.T) {
	for _, stalled := range []bool{false, true} {
		t.Run(fmt.Sprintf("stalled=%t", stalled), func(t *testing.T) {
			const ttl, drift = 3 * time.Second, 300 * time.Millisecond
			c := newFakeCluster(t, 3, ttl, drift, nil)
			rec := &recorder{}
			cfg := watchedConfig(t, "", c.addrs()...)
			cfg.LeaseSafetyMargin = 300 * time.Millisecond
			cfg.Watchdog.KillMargin = 500 * time.Millisecond
			a := startAgent(t, cfg, watchedOptions(t, rec))
			st := waitBroker(t, a, BrokerUp, 20*time.Second)
			dead := exitTime(t, st.PID)
			if stalled {
				if err := unix.Kill(st.PID, unix.SIGSTOP); err != nil {
					t.Fatal(err)
				}
			}
			c.setHang(3, true)
			cut := bootNS()
			var at int64
			select {
			case at = <-dead:
			case <-time.After(testutil.Deadline(3 * ttl)):
				t.Fatal("the broker outlived its lease")
			}
			var attest []time.Duration
			for _, fc := range c.coords {
				attest = append(attest, fc.attestAt())
			}
			slices.Sort(attest)
			majority := attest[len(attest)/2] // a decision needs a majority of attestations
			t.Logf("dead %s after the cut; %s before a majority may attest (the first coordinator may attest %s after it)",
				time.Duration(at-cut), majority-time.Duration(at), attest[0]-time.Duration(at))
			if time.Duration(at) >= majority {
				t.Fatalf("the broker died %s after a majority of coordinators could attest", time.Duration(at)-majority)
			}
			testutil.Eventually(t, 10*time.Second, "the kill recorded", func() error {
				ks := rec.killRecords()
				if len(ks) == 0 {
					return errors.New("no kill yet")
				}
				if ks[0].Reason != KillLease || ks[0].Lead <= 0 {
					return fmt.Errorf("kill %+v: not a lease kill before the lease's end", ks[0])
				}
				return nil
			})
			down := waitBroker(t, a, BrokerDown, 10*time.Second)
			if !strings.Contains(down.Reason, "killed by the watchdog (lease)") {
				t.Fatalf("down: %+v", down)
			}
		})
	}
}

// TestHealthChecks: a TCP check against the broker's listener and an exec
// health command; failure_threshold failures in a row take the broker
// down (the agent kills it: reason health); a command that outlasts
// health_timeout fails; a broker that never passes its checks within
// start_timeout is down too.
func TestHealthChecks(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		c := newFakeCluster(t, 3, time.Second, testDrift, nil)
		ln := testutil.Listen(t, "127.0.0.1")
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				conn.Close()
			}
		}()
		cfg := watchedConfig(t, "", c.addrs()...)
		cfg.Broker.KafkaAddr = ln.Addr().String()
		rec := &recorder{}
		a := startAgent(t, cfg, watchedOptions(t, rec))
		waitBroker(t, a, BrokerUp, 20*time.Second)
		ln.Close()
		down := waitBroker(t, a, BrokerDown, 10*time.Second)
		if !strings.Contains(down.Reason, "3 checks failed in a row") || !strings.Contains(down.Reason, "connect to "+cfg.Broker.KafkaAddr) {
			t.Fatalf("down: %+v", down)
		}
		testutil.Eventually(t, 5*time.Second, "a health kill", func() error {
			if ks := rec.killRecords(); len(ks) == 0 || ks[0].Reason != KillHealth {
				return fmt.Errorf("kills %+v", ks)
			}
			return nil
		})
		rec.mu.Lock()
		n := rec.checks[CheckTCP]
		rec.mu.Unlock()
		if n < 3 {
			t.Fatalf("%d failed tcp checks counted", n)
		}
	})
	t.Run("exec", func(t *testing.T) {
		c := newFakeCluster(t, 3, time.Second, testDrift, nil)
		flag := filepath.Join(t.TempDir(), "healthy")
		if err := os.WriteFile(flag, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := watchedConfig(t, "", c.addrs()...)
		cfg.Broker.HealthCommand = []string{"test", "-e", flag}
		a := startAgent(t, cfg, watchedOptions(t, &recorder{}))
		waitBroker(t, a, BrokerUp, 20*time.Second)
		os.Remove(flag)
		down := waitBroker(t, a, BrokerDown, 10*time.Second)
		if !strings.Contains(down.Reason, "health command test: exit status 1") {
			t.Fatalf("down: %+v", down)
		}
	})
	t.Run("exec timeout", func(t *testing.T) {
		c := newFakeCluster(t, 3, time.Second, testDrift, nil)
		cfg := watchedConfig(t, "", c.addrs()...)
		cfg.Broker.HealthCommand = []string{"sleep", "5"}
		cfg.Broker.StartTimeout = time.Second
		a := startAgent(t, cfg, watchedOptions(t, &recorder{}))
		down := waitBroker(t, a, BrokerDown, 20*time.Second)
		if !strings.Contains(down.Reason, "did not pass its checks within broker.start_timeout") || !strings.Contains(down.Reason, "did not finish within 100ms") {
			t.Fatalf("down: %+v", down)
		}
	})
}

// startPIDFileBroker starts a stand-in broker the way a service manager
// would (its own process group, not the agent's child) and writes its pid
// file.
func startPIDFileBroker(t *testing.T, pidFile string) *exec.Cmd {
	t.Helper()
	argv := testBrokerCommand(t, "")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestPIDFileBroker: a broker someone else started (pid file) is watched
// and, with the watchdog, killed when the agent holds no lease for it: at
// once while the agent cannot register, and before a majority of the
// coordinators may attest once the agent is cut off.
func TestPIDFileBroker(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "broker.pid")
	c := newFakeCluster(t, 3, 2*time.Second, 300*time.Millisecond, nil)
	c.recoveryRunning = true // no registration, so no lease, for now
	c.failureTimeout = 200 * time.Millisecond
	cfg := watchedConfig(t, "", c.addrs()...)
	cfg.Broker.Command = nil
	cfg.Broker.PIDFile = pidFile
	cfg.LeaseSafetyMargin = 300 * time.Millisecond
	rec := &recorder{}
	early := startPIDFileBroker(t, pidFile)
	earlyDead := exitTime(t, early.Process.Pid)
	a := startAgent(t, cfg, watchedOptions(t, rec))
	select {
	case <-earlyDead:
	case <-time.After(testutil.Deadline(10 * time.Second)):
		t.Fatal("a broker ran without a lease and was not killed")
	}
	testutil.Eventually(t, 5*time.Second, "a no-lease kill", func() error {
		if ks := rec.killRecords(); len(ks) == 0 || ks[0].Reason != KillNoLease {
			return fmt.Errorf("kills %+v", ks)
		}
		return nil
	})

	c.finishRecovery(-1)
	waitRegistered(t, a)
	b := startPIDFileBroker(t, pidFile)
	st := waitBroker(t, a, BrokerUp, 20*time.Second)
	if st.PID != b.Process.Pid || !st.WatchdogArmed {
		t.Fatalf("broker %+v, started pid %d", st, b.Process.Pid)
	}
	dead := exitTime(t, b.Process.Pid)
	c.setHang(3, true)
	var at int64
	select {
	case at = <-dead:
	case <-time.After(testutil.Deadline(10 * time.Second)):
		t.Fatal("the broker outlived its lease")
	}
	var attest []time.Duration
	for _, fc := range c.coords {
		attest = append(attest, fc.attestAt())
	}
	slices.Sort(attest)
	if time.Duration(at) >= attest[1] {
		t.Fatalf("the broker died %s after a majority of coordinators could attest", time.Duration(at)-attest[1])
	}
	t.Logf("dead %s before a majority may attest", attest[1]-time.Duration(at))

	// Down, before it registers again: a broker started meanwhile (a
	// service manager restarting it) runs without a lease and dies.
	waitBroker(t, a, BrokerDown, 10*time.Second)
	kills := len(rec.killRecords())
	again := startPIDFileBroker(t, pidFile)
	select {
	case <-exitTime(t, again.Process.Pid):
	case <-time.After(testutil.Deadline(10 * time.Second)):
		t.Fatal("a broker started while its agent was down ran on")
	}
	testutil.Eventually(t, 5*time.Second, "a no-lease kill while down", func() error {
		if ks := rec.killRecords(); len(ks) <= kills || ks[len(ks)-1].Reason != KillNoLease {
			return fmt.Errorf("kills %+v", ks)
		}
		return nil
	})
}

// TestWatchdogNeedsTheBootClock: the watchdog process reads the boot
// clock, so an agent on another clock cannot arm it.
func TestWatchdogNeedsTheBootClock(t *testing.T) {
	cfg := watchedConfig(t, "", "127.0.0.1:1")
	if _, err := New(cfg, Options{Clock: &manualClock{}}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "boot clock") {
		t.Fatalf("New with a manual clock and the watchdog = %v", err)
	}
}

// TestGracefulStopTermsTheBroker: a graceful stop sends the broker
// SIGTERM and waits for it (no kill); the lease is still valid meanwhile.
func TestGracefulStopTermsTheBroker(t *testing.T) {
	// A lease long enough that a loaded machine's pauses do not let it
	// lapse (the watchdog would kill the broker for that instead).
	c := newFakeCluster(t, 3, 3*time.Second, testDrift, nil)
	rec := &recorder{}
	cfg := watchedConfig(t, "", c.addrs()...)
	a, err := New(cfg, Options{Logger: testLogger(t), RegisterBackoffMax: 50 * time.Millisecond,
		WatchdogCommand: testWatchdogCommand(t), BrokerStdout: devNull(t), BrokerStderr: devNull(t), BrokerObserver: rec})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	st := waitBroker(t, a, BrokerUp, 20*time.Second)
	dead := exitTime(t, st.PID)
	if err := a.Stop(true); err != nil {
		t.Logf("stop: %v", err)
	}
	// Stop returns once the watchdog saw the broker exit; the test's own
	// watch of its pid reports it a moment later.
	select {
	case <-dead:
	case <-time.After(testutil.Deadline(5 * time.Second)):
		t.Fatal("Stop returned with the broker alive")
	}
	if ks := rec.killRecords(); len(ks) != 0 {
		t.Fatalf("the broker was killed, not stopped: %+v", ks)
	}
	if got := a.Broker().State; got != BrokerStopped {
		t.Fatalf("broker %s after Stop", got)
	}
}

// TestBrokerStartsWithDefaultSignals: the broker the watchdog starts
// ignores none of the signals that stop a process, although the watchdog
// process itself does not stop on them (an ignored signal stays ignored
// across exec: a JVM started so installs no shutdown hook for SIGTERM, and a
// graceful stop became a SIGKILL after stop_timeout).
func TestBrokerStartsWithDefaultSignals(t *testing.T) {
	c := newFakeCluster(t, 3, 3*time.Second, testDrift, nil)
	rec := &recorder{}
	a := startAgent(t, watchedConfig(t, "", c.addrs()...), watchedOptions(t, rec))
	st := waitBroker(t, a, BrokerUp, 20*time.Second)
	ignored := func(pid int) uint64 {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
				mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err != nil {
					t.Fatal(err)
				}
				return mask
			}
		}
		t.Fatalf("no SigIgn in /proc/%d/status", pid)
		return 0
	}
	mask := ignored(st.PID)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGTSTP} {
		if mask&(1<<(uint(sig)-1)) != 0 {
			t.Errorf("the broker starts with %v ignored (SigIgn %#x)", sig, mask)
		}
	}
}

// TestAutomqNodeReported: the registration carries the configured AutoMQ
// node id and the node epoch of the WAL header; a WAL of another node, or
// none yet, gives no epoch.
func TestAutomqNodeReported(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "wal")
	w, err := wal.Create(path, wal.CreateOptions{Capacity: 64 << 10, NodeID: 5, NodeEpoch: 1732870000123})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		node  int32
		path  string
		epoch int64
	}{
		{"its WAL", 5, path, 1732870000123},
		{"another node's WAL", 6, path, 0},
		{"no WAL yet", 5, filepath.Join(dir, "missing"), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			fc := newFakeCluster(t, 3, testTTL, testDrift, nil)
			cfg := testConfig(fc.addrs()...)
			cfg.WAL.Path = c.path
			node := c.node
			cfg.Automq.NodeID, cfg.Automq.ExternalFencing = &node, true
			a := startAgent(t, cfg, Options{})
			waitRegistered(t, a)
			fc.mu.Lock()
			got := fc.lastRegister.GetAutomq()
			fc.mu.Unlock()
			if got == nil || got.GetNodeId() != c.node || got.GetNodeEpoch() != c.epoch {
				t.Fatalf("registration reported %v, want node %d epoch %d", got, c.node, c.epoch)
			}
		})
	}
	// A broker that is not AutoMQ's reports none.
	fc := newFakeCluster(t, 3, testTTL, testDrift, nil)
	a := startAgent(t, testConfig(fc.addrs()...), Options{})
	waitRegistered(t, a)
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.lastRegister.GetAutomq() != nil {
		t.Fatalf("a broker that is not AutoMQ's reported %v", fc.lastRegister.GetAutomq())
	}
}

// TestWatchdogKillsWhenItsAgentIsStopped: the agent process itself is
// SIGSTOPped (a debugger, a stuck host process, CPU starvation): it renews
// nothing and kills nothing, but the watchdog process, on its own timer
// armed at the last renewal, kills the broker before a majority of the
// coordinators may attest.
func TestWatchdogKillsWhenItsAgentIsStopped(t *testing.T) {
	c := newFakeCluster(t, 3, 2*time.Second, 300*time.Millisecond, nil)
	listen := testutil.Addr(t, "127.0.0.1")
	gossipAddr := testutil.Addr(t, "127.0.0.1")
	quote := func(argv []string) string {
		var q []string
		for _, a := range argv {
			q = append(q, strconv.Quote(a))
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	yaml := fmt.Sprintf(`broker_id: b1
cluster_name: demo
coordinators: [%s]
listen: %s
gossip: {listen: %s}
wal: {path: /var/lib/broker/b1.wal}
lease_safety_margin: 300ms
log: {level: debug}
broker:
  command: %s
  check_interval: 100ms
  health_timeout: 100ms
watchdog:
  enabled: true
  kill_margin: 500ms
`, strings.Join(c.addrs(), ", "), listen, gossipAddr, quote(testBrokerCommand(t, "")))
	path := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	env, _ := exec.LookPath("env")
	cmd := exec.Command(env, "WALDEN_AGENT_TEST_ROLE=agent", os.Args[0], path)
	var logs strings.Builder
	var logsMu sync.Mutex
	cmd.Stderr = writerFunc(func(p []byte) (int, error) { logsMu.Lock(); defer logsMu.Unlock(); return logs.Write(p) })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			logsMu.Lock()
			t.Logf("agent log:\n%s", logs.String())
			logsMu.Unlock()
		}
	})
	var b BrokerJSON
	testutil.Eventually(t, 30*time.Second, "the agent process's broker up", func() error {
		resp, err := http.Get("http://" + listen + "/v1/broker")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
			return err
		}
		if b.State != BrokerUp || !b.WatchdogArmed {
			return fmt.Errorf("broker %+v", b)
		}
		return nil
	})
	dead := exitTime(t, b.PID)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := bootNS()
	var at int64
	select {
	case at = <-dead:
	case <-time.After(testutil.Deadline(10 * time.Second)):
		t.Fatal("the broker outlived the lease of its stopped agent")
	}
	var attest []time.Duration
	for _, fc := range c.coords {
		attest = append(attest, fc.attestAt())
	}
	slices.Sort(attest)
	t.Logf("broker dead %s after its agent stopped, %s before a majority of the coordinators may attest",
		time.Duration(at-stoppedAt), attest[1]-time.Duration(at))
	if time.Duration(at) >= attest[1] {
		t.Fatalf("the broker died %s after a majority of the coordinators could attest", time.Duration(at)-attest[1])
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
