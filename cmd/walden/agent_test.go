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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

// leaderStub answers Register with epoch 1 and grants every RenewLease of
// epoch 1 as the cluster's only voter.
type leaderStub struct {
	waldenv1.UnimplementedAgentServer

	mu        sync.Mutex
	agentAddr string
	renewals  int
}

func (s *leaderStub) Register(_ context.Context, req *waldenv1.RegisterRequest) (*waldenv1.RegisterResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.agentAddr = req.GetAgentAddr()
	return &waldenv1.RegisterResponse{BrokerId: req.GetBrokerId(), Epoch: 1, LeaseTtlMs: 600, RecoveredWalOffset: -1}, nil
}

func (s *leaderStub) RenewLease(_ context.Context, req *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewals++
	return &waldenv1.RenewLeaseResponse{Epoch: req.GetEpoch(), LeaseTtlMs: 600, LeaderId: "c1", CoordinatorId: "c1",
		Voters: []*waldenv1.Voter{{Id: "c1"}}, ConfIndex: 1}, nil
}

func (s *leaderStub) addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agentAddr
}

// TestAgentProcess runs `walden agent` as a real process against a stub
// leader, reads GET /v1/lease like a broker would, and stops it with SIGTERM.
func TestAgentProcess(t *testing.T) {
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
	stub := &leaderStub{}
	gs := grpc.NewServer()
	waldenv1.RegisterAgentServer(gs, stub)
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()

	cfgPath := filepath.Join(dir, "agent.yaml")
	cfg := fmt.Sprintf(`broker_id: b1
cluster_name: demo
coordinators: [%s]
gossip: {listen: 127.0.0.1:0}
listen: 127.0.0.1:0
wal: {volume_id: vol-b1, path: %s}
lease_safety_margin: 100ms
log: {level: debug, format: text}
`, ln.Addr(), filepath.Join(dir, "b1.wal"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
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

	deadline := time.Now().Add(20 * time.Second)
	var body map[string]any
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no valid lease from the agent process; last answer %v", body)
		}
		time.Sleep(20 * time.Millisecond)
		addr := stub.addr()
		if addr == "" {
			continue
		}
		resp, err := http.Get("http://" + addr + "/v1/lease")
		if err != nil {
			continue
		}
		body = nil
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err == nil && body["valid"] == true {
			break
		}
	}
	if body["broker_id"] != "b1" || body["epoch"] != float64(1) || body["fenced"] != false || body["remaining_ms"].(float64) <= 0 {
		t.Fatalf("/v1/lease = %v", body)
	}
	resp, err := http.Get("http://" + stub.addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %s", resp.Status)
	}

	// GET /metrics: the lease as the agent sees it.
	resp, err = http.Get("http://" + stub.addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(mb), `walden_agent_lease_valid{broker_id="b1"} 1`) || !strings.Contains(string(mb), "walden_build_info{") {
		t.Fatalf("/metrics lacks the lease:\n%s", mb)
	}

	// SIGHUP applies the file again (a new log level); the lease holds.
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(cfg, "level: debug", "level: info", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		stderrMu.Lock()
		reloaded := strings.Contains(stderr.String(), `msg="configuration reloaded"`)
		stderrMu.Unlock()
		if reloaded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no reload logged after SIGHUP")
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
	stderrMu.Lock()
	logs := stderr.String()
	stderrMu.Unlock()
	for _, want := range []string{"msg=registered", "msg=\"configuration reloaded\""} {
		if !strings.Contains(logs, want) {
			t.Errorf("agent log lacks %q:\n%s", want, logs)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestAgentCommandConfigErrors: a bad configuration stops the command
// before anything starts, with FILE:LINE: KEY: reason.
func TestAgentCommandConfigErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(path, []byte(`broker_id: b1
cluster_name: demo
coordinators: [127.0.0.1:7001]
gossip: {listen: 127.0.0.1:0}
listen: 127.0.0.1:0
wal: {path: /tmp/b1.wal}
lease_safety_margin: soon
`), 0o600); err != nil {
		t.Fatal(err)
	}
	root := &cobra.Command{Use: "walden", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(newAgentCmd())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"agent", "--config", path})
	err := root.ExecuteContext(context.Background())
	if err == nil || !strings.HasPrefix(err.Error(), path+":7: lease_safety_margin: invalid duration") {
		t.Fatalf("walden agent = %v", err)
	}

	root = &cobra.Command{Use: "walden", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(newAgentCmd())
	root.SetArgs([]string{"agent"})
	if err := root.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "--config FILE is required") {
		t.Fatalf("walden agent without --config = %v", err)
	}
}
