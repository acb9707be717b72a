package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

// silentLeader is leaderStub whose renewals can be made to hang (the agent
// cut off from its only coordinator).
type silentLeader struct {
	leaderStub
	hang chan struct{} // closed: renewals hang until the caller gives up
}

func (s *silentLeader) RenewLease(ctx context.Context, req *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	select {
	case <-s.hang:
		<-ctx.Done()
		return nil, ctx.Err()
	default:
	}
	return s.leaderStub.RenewLease(ctx, req)
}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// TestAgentProcessWatchdog runs `walden agent` as a real process with a
// broker it starts (sleep) under the watchdog: the broker's parent is the
// hidden `walden agent watchdog` process; cut off from its coordinator, the
// agent's broker is killed by the watchdog (reason lease), /healthz answers
// 503 and the metrics count the kill.
func TestAgentProcessWatchdog(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "walden")
	if out, err := exec.Command("go", "build", "-o", bin, "walden/cmd/walden").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stub := &silentLeader{hang: make(chan struct{})}
	gs := grpc.NewServer()
	waldenv1.RegisterAgentServer(gs, stub)
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()

	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`broker_id: b1
cluster_name: demo
coordinators: [%s]
gossip: {listen: 127.0.0.1:0}
listen: 127.0.0.1:0
wal: {path: %s}
lease_safety_margin: 100ms
log: {level: debug, format: text}
broker:
  command: [sleep, "600"]
  check_interval: 100ms
  health_timeout: 100ms
watchdog:
  enabled: true
  kill_margin: 100ms
`, ln.Addr(), filepath.Join(dir, "b1.wal"))), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	var stderrMu sync.Mutex
	cmd := exec.Command(bin, "agent", "--config", cfgPath)
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		stderrMu.Lock()
		defer stderrMu.Unlock()
		return stderr.Write(p)
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			stderrMu.Lock()
			t.Logf("agent stderr:\n%s", stderr.String())
			stderrMu.Unlock()
		}
	}()

	var b struct {
		State         string `json:"state"`
		PID           int    `json:"pid"`
		Reason        string `json:"reason"`
		WatchdogArmed bool   `json:"watchdog_armed"`
	}
	waitFor := func(what string, cond func() error) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := cond()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("the broker up under the watchdog", func() error {
		if stub.addr() == "" {
			return fmt.Errorf("not registered")
		}
		if err := getJSON("http://"+stub.addr()+"/v1/broker", &b); err != nil {
			return err
		}
		if b.State != "up" || !b.WatchdogArmed || b.PID == 0 {
			return fmt.Errorf("broker %+v", b)
		}
		return nil
	})
	// The broker's parent is the watchdog process, a child of the agent.
	ppid := func(pid int) (int, string) {
		stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		parent, _ := strconv.Atoi(f[1])
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(parent) + "/cmdline")
		return parent, strings.ReplaceAll(string(cmdline), "\x00", " ")
	}
	wdPID, wdCmd := ppid(b.PID)
	if !strings.HasSuffix(strings.TrimSpace(wdCmd), "agent watchdog") {
		t.Fatalf("the broker's parent %d runs %q, want the agent's watchdog process", wdPID, wdCmd)
	}
	if agentPID, _ := ppid(wdPID); agentPID != cmd.Process.Pid {
		t.Fatalf("the watchdog process's parent is %d, the agent is %d", agentPID, cmd.Process.Pid)
	}

	close(stub.hang)
	waitFor("the broker killed by the watchdog", func() error {
		if err := getJSON("http://"+stub.addr()+"/v1/broker", &b); err != nil {
			return err
		}
		if b.State != "down" || b.Reason != "killed by the watchdog (lease)" {
			return fmt.Errorf("broker %+v", b)
		}
		return nil
	})
	resp, err := http.Get("http://" + stub.addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/healthz with the broker down: %s", resp.Status)
	}
	resp, err = http.Get("http://" + stub.addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`walden_agent_watchdog_kills_total{broker_id="b1",reason="lease"} 1`,
		`walden_agent_broker_state{broker_id="b1",state="down"} 1`,
		`walden_agent_watchdog_armed{broker_id="b1"} 0`,
		`walden_agent_watchdog_kill_latency_seconds_count{broker_id="b1"} 1`,
	} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent exited with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not exit after SIGTERM")
	}
	// The watchdog process went with it.
	if err := syscall.Kill(wdPID, 0); err == nil {
		if stat, _ := os.ReadFile("/proc/" + strconv.Itoa(wdPID) + "/stat"); len(stat) > 0 && !bytes.Contains(stat, []byte(") Z ")) {
			t.Fatalf("the watchdog process %d outlived its agent", wdPID)
		}
	}
}
