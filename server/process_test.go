package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"walden/internal/testutil"
	"walden/raftlog"
)

// The process tests build bin/walden and bin/waldenctl into a temporary
// directory and run real processes on 127.0.0.x. They are skipped under
// -short.

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func binaries(t *testing.T) (walden, waldenctl string) {
	t.Helper()
	if testing.Short() {
		t.Skip("process test: builds and runs walden processes; skipped with -short")
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "walden-process-test-bin-")
		if buildErr != nil {
			return
		}
		for _, pkg := range []string{"walden", "waldenctl"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, pkg), "walden/cmd/"+pkg).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "walden"), filepath.Join(binDir, "waldenctl")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

type member struct {
	id, admin, raft, http, dataDir, config, log string
	cmd                                         *exec.Cmd
	exited                                      chan struct{}
	// args are added to the server command line.
	args []string
}

func (m *member) start(t *testing.T, walden string) {
	t.Helper()
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	m.cmd = exec.Command(walden, append([]string{"server", "--config", m.config}, m.args...)...)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) {
		_ = c.Wait()
		logf.Close()
		close(done)
	}(m.cmd, m.exited)
	t.Cleanup(m.kill)
}

func (m *member) kill() {
	if m.cmd == nil {
		return
	}
	select {
	case <-m.exited:
	default:
		_ = m.cmd.Process.Signal(syscall.SIGKILL)
		<-m.exited
	}
}

func (m *member) alive() bool {
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

type statusJSON struct {
	ClusterName  string `json:"cluster_name"`
	NodeID       string `json:"node_id"`
	LeaderID     string `json:"leader_id"`
	Term         string `json:"term"`
	CommitIndex  string `json:"commit_index"`
	AppliedIndex string `json:"applied_index"`
	RaftState    string `json:"raft_state"`
	Members      []struct {
		ID         string `json:"id"`
		RaftAddr   string `json:"raft_addr"`
		AdminAddr  string `json:"admin_addr"`
		Role       string `json:"role"`
		Reachable  bool   `json:"reachable"`
		MatchIndex string `json:"match_index"`
	} `json:"members"`
}

func (s statusJSON) applied() uint64 { v, _ := strconv.ParseUint(s.AppliedIndex, 10, 64); return v }

func (s statusJSON) leaders() []string {
	var ls []string
	for _, m := range s.Members {
		if m.Role == "leader" {
			ls = append(ls, m.ID)
		}
	}
	return ls
}

func ctl(waldenctl string, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	c := exec.Command(waldenctl, args...)
	c.Stdout, c.Stderr = &out, &errb
	err = c.Run()
	return out.String(), errb.String(), err
}

func status(t *testing.T, waldenctl string, endpoints ...string) (statusJSON, error) {
	out, errOut, err := ctl(waldenctl, "--endpoints", strings.Join(endpoints, ","), "--timeout", "1s", "status", "-o", "json")
	var st statusJSON
	if err != nil {
		return st, fmt.Errorf("%v: %s", err, errOut)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("waldenctl status -o json printed no JSON: %v\n%s", err, out)
	}
	return st, nil
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, detail := cond()
		if ok {
			return
		}
		last = detail
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s; last: %s", what, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func dumpLogs(t *testing.T, members []*member) {
	if !t.Failed() {
		return
	}
	for _, m := range members {
		b, _ := os.ReadFile(m.log)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("--- log of %s (tail) ---\n%s", m.id, b)
	}
}

func TestProcessClusterFailover(t *testing.T) {
	walden, waldenctl := binaries(t)
	dir := t.TempDir()
	var members []*member
	for i := 1; i <= 3; i++ {
		host := fmt.Sprintf("127.0.0.%d", 10+i)
		a := testutil.Addrs(t, host, 3)
		m := &member{id: fmt.Sprintf("c%d", i), admin: a[0], raft: a[1], http: a[2]}
		m.dataDir = filepath.Join(dir, m.id)
		m.config = filepath.Join(dir, m.id+".yaml")
		m.log = filepath.Join(dir, m.id+".log")
		members = append(members, m)
	}
	t.Cleanup(func() { dumpLogs(t, members) })
	var peers strings.Builder
	for _, m := range members {
		fmt.Fprintf(&peers, "  - {id: %s, raft: %q, admin: %q}\n", m.id, m.raft, m.admin)
	}
	for _, m := range members {
		cfg := fmt.Sprintf(`cluster_name: proc
node_id: %s
data_dir: %q
listen:
  admin: %q
  raft: %q
  http: %q
initial_cluster:
%slog: {level: info, format: json}
raft:
  tick_interval: 50ms
  election_ticks: 10
`, m.id, m.dataDir, m.admin, m.raft, m.http, peers.String())
		if err := os.WriteFile(m.config, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		m.start(t, walden)
	}
	all := []string{members[0].admin, members[1].admin, members[2].admin}

	// One leader, agreed on by the member that answers.
	var st statusJSON
	waitFor(t, "a leader", 15*time.Second, func() (bool, string) {
		var err error
		st, err = status(t, waldenctl, all...)
		if err != nil {
			return false, err.Error()
		}
		return st.LeaderID != "" && len(st.leaders()) == 1 && st.leaders()[0] == st.LeaderID && len(st.Members) == 3,
			fmt.Sprintf("%+v", st)
	})
	oldLeader := st.LeaderID
	t.Logf("leader %s at term %s", oldLeader, st.Term)

	// Every member answers with the same single leader; /readyz and /metrics serve.
	for _, m := range members {
		waitFor(t, m.id+" agrees on the leader", 5*time.Second, func() (bool, string) {
			s, err := status(t, waldenctl, m.admin)
			return err == nil && s.LeaderID == oldLeader && len(s.leaders()) == 1, fmt.Sprintf("%+v %v", s, err)
		})
		waitFor(t, m.id+" /readyz", 5*time.Second, func() (bool, string) {
			code, body := httpGet(m.http, "/readyz")
			return code == 200, fmt.Sprintf("%d %s", code, body)
		})
		if code, body := httpGet(m.http, "/metrics"); code != 200 || !strings.Contains(body, "walden_raft_term") ||
			!strings.Contains(body, "grpc_server_handled_total") || !strings.Contains(body, "process_cpu_seconds_total") {
			t.Fatalf("%s /metrics: %d\n%.2000s", m.id, code, body)
		}
	}

	// kill -9 the leader: the survivors elect a new one.
	var killed *member
	var survivors []*member
	for _, m := range members {
		if m.id == oldLeader {
			killed = m
		} else {
			survivors = append(survivors, m)
		}
	}
	killed.kill()
	survivorEPs := []string{survivors[0].admin, survivors[1].admin}
	waitFor(t, "a new leader among the survivors", 15*time.Second, func() (bool, string) {
		var err error
		st, err = status(t, waldenctl, survivorEPs...)
		if err != nil {
			return false, err.Error()
		}
		return st.LeaderID != "" && st.LeaderID != oldLeader && len(st.leaders()) == 1, fmt.Sprintf("%+v", st)
	})
	newLeader := st.LeaderID
	t.Logf("new leader %s at term %s", newLeader, st.Term)
	// The new leader serves writes: add a learner and remove it again
	// (through a follower when there is one: raft forwards the proposal).
	out, errOut, err := ctl(waldenctl, "--endpoints", strings.Join(survivorEPs, ","), "member", "add", "c9",
		"--raft", "127.0.0.1:1", "--admin", "127.0.0.1:2", "-o", "json")
	if err != nil || !strings.Contains(out, `"role": "learner"`) {
		t.Fatalf("member add on the new leader: %v %s %s", err, out, errOut)
	}
	if out, errOut, err := ctl(waldenctl, "--endpoints", strings.Join(survivorEPs, ","), "member", "remove", "c9"); err != nil {
		t.Fatalf("member remove: %v %s %s", err, out, errOut)
	}
	var target uint64
	waitFor(t, "survivors agree", 5*time.Second, func() (bool, string) {
		s, err := status(t, waldenctl, survivorEPs...)
		if err != nil {
			return false, err.Error()
		}
		target = s.applied()
		return len(s.Members) == 3, fmt.Sprintf("%+v", s)
	})

	// Restart the killed member from its data_dir: it rejoins and catches up.
	killed.start(t, walden)
	waitFor(t, killed.id+" rejoins and catches up", 15*time.Second, func() (bool, string) {
		if !killed.alive() {
			t.Fatalf("%s exited after restart", killed.id)
		}
		s, err := status(t, waldenctl, killed.admin)
		if err != nil {
			return false, err.Error()
		}
		return s.NodeID == killed.id && s.LeaderID != "" && s.applied() >= target && len(s.Members) == 3, fmt.Sprintf("%+v", s)
	})

	// Leadership can be handed to the restarted member, asked of any member.
	out, errOut, err = ctl(waldenctl, "--endpoints", strings.Join(all, ","), "leader", "transfer", killed.id, "-o", "json")
	if err != nil || !strings.Contains(out, fmt.Sprintf(`"leader_id": %q`, killed.id)) {
		t.Fatalf("leader transfer: %v %s %s", err, out, errOut)
	}
}

func httpGet(addr, path string) (int, string) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr)
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(c)
	resp := buf.String()
	head, body, _ := strings.Cut(resp, "\r\n\r\n")
	fields := strings.Fields(head)
	if len(fields) < 2 {
		return 0, resp
	}
	code, _ := strconv.Atoi(fields[1])
	return code, body
}

// dirDigest hashes every file under dir (names, modes and contents); ""
// when dir does not exist.
func dirDigest(t *testing.T, dir string) string {
	t.Helper()
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return ""
	}
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v\n", strings.TrimPrefix(p, dir), info.Mode())
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func TestProcessBadInput(t *testing.T) {
	walden, _ := binaries(t)
	dir := t.TempDir()
	withRaft := func(dataDir, raftListen string) string {
		return fmt.Sprintf(`cluster_name: demo
node_id: c1
data_dir: %q
listen:
  admin: %q
  raft: %q
initial_cluster:
  - {id: c1, raft: "127.0.0.1:7101", admin: "127.0.0.1:7001"}
`, dataDir, testutil.Addr(t, "127.0.0.1"), raftListen)
	}
	good := func(dataDir string) string { return withRaft(dataDir, testutil.Addr(t, "127.0.0.1")) }
	foreign := filepath.Join(dir, "foreign")
	st, err := raftlog.Open(foreign, "other-cluster", "c1", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name    string
		config  func(dataDir string) string
		dataDir string // default: a fresh path that must stay absent
		want    []string
	}{
		{"broken yaml", func(d string) string { return strings.Replace(good(d), "listen:\n", "listen: [\n", 1) }, "", []string{"invalid YAML"}},
		{"unknown key", func(d string) string { return good(d) + "colour: blue\n" }, "", []string{":9: colour: unknown key"}},
		{"missing node_id", func(d string) string { return strings.Replace(good(d), "node_id: c1\n", "", 1) }, "", []string{":1: node_id: missing required key"}},
		{"invalid address", func(d string) string { return withRaft(d, "127.0.0.1:71010") }, "", []string{":6: listen.raft: invalid address"}},
		{"data_dir of another cluster", good, foreign, []string{"data_dir " + foreign + " refused", "another cluster"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := tc.dataDir
			if dataDir == "" {
				dataDir = filepath.Join(dir, fmt.Sprintf("data%d", i))
			}
			before := dirDigest(t, dataDir)
			cfgPath := filepath.Join(dir, fmt.Sprintf("case%d.yaml", i))
			if err := os.WriteFile(cfgPath, []byte(tc.config(dataDir)), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, walden, "server", "--config", cfgPath)
			cmd.Stderr = &stderr
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("walden server did not exit: %s", stderr.String())
			}
			if err == nil {
				t.Fatalf("exit 0, stderr: %s", stderr.String())
			}
			msg := stderr.String()
			if tc.dataDir == "" && !strings.Contains(msg, cfgPath) {
				t.Errorf("message does not name the file %s: %s", cfgPath, msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q: %s", w, msg)
				}
			}
			if after := dirDigest(t, dataDir); after != before {
				t.Errorf("data_dir changed (before %q after %q)", before, after)
			}
			if tc.dataDir == "" {
				if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
					t.Errorf("data_dir %s was created", dataDir)
				}
			}
		})
	}
}
