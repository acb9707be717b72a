package server_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"walden/internal/testutil"
)

// opsCluster describes n members on 127.0.0.(base+i) with short raft
// timings; extra is appended to every config file.
func opsCluster(t *testing.T, dir string, n, base int, cluster, extra string) []*member {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var members []*member
	for i := 1; i <= n; i++ {
		host := fmt.Sprintf("127.0.0.%d", base+i)
		a := testutil.Addrs(t, host, 3)
		m := &member{id: fmt.Sprintf("c%d", i), admin: a[0], raft: a[1], http: a[2]}
		m.dataDir = filepath.Join(dir, m.id)
		m.config = filepath.Join(dir, m.id+".yaml")
		m.log = filepath.Join(dir, m.id+".log")
		members = append(members, m)
	}
	var peers strings.Builder
	for _, m := range members {
		fmt.Fprintf(&peers, "  - {id: %s, raft: %q, admin: %q}\n", m.id, m.raft, m.admin)
	}
	for _, m := range members {
		writeMemberConfig(t, m, cluster, peers.String(), "info", extra)
	}
	return members
}

func writeMemberConfig(t *testing.T, m *member, cluster, peers, level, extra string) {
	t.Helper()
	cfg := fmt.Sprintf(`cluster_name: %s
node_id: %s
data_dir: %q
listen:
  admin: %q
  raft: %q
  http: %q
initial_cluster:
%slog: {level: %s, format: json}
raft:
  tick_interval: 50ms
  election_ticks: 10
%s`, cluster, m.id, m.dataDir, m.admin, m.raft, m.http, peers, level, extra)
	if err := os.WriteFile(m.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
}

func admins(ms []*member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.admin)
	}
	return out
}

// waitLeader waits until the members at eps agree on one leader and
// returns its id.
func waitLeader(t *testing.T, waldenctl string, eps []string, not string) string {
	t.Helper()
	var leader string
	waitFor(t, "a leader", 20*time.Second, func() (bool, string) {
		st, err := status(t, waldenctl, eps...)
		if err != nil {
			return false, err.Error()
		}
		leader = st.LeaderID
		return leader != "" && leader != not && len(st.leaders()) == 1, fmt.Sprintf("%+v", st)
	})
	return leader
}

func logHas(t *testing.T, m *member, s string) bool {
	t.Helper()
	b, _ := os.ReadFile(m.log)
	return strings.Contains(string(b), s)
}

// TestProcessSignals: SIGTERM on the leader hands leadership over before
// the member stops (exit 0); SIGHUP applies a new log level and reports the
// keys that need a restart; a SIGHUP with a broken file changes nothing.
func TestProcessSignals(t *testing.T) {
	walden, waldenctl := binaries(t)
	dir := t.TempDir()
	members := opsCluster(t, dir, 3, 40, "signals", "")
	t.Cleanup(func() { dumpLogs(t, members) })
	for _, m := range members {
		m.start(t, walden)
	}
	leader := waitLeader(t, waldenctl, admins(members), "")
	var old *member
	var rest []*member
	for _, m := range members {
		if m.id == leader {
			old = m
		} else {
			rest = append(rest, m)
		}
	}

	if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-old.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("the leader did not stop within 15s of SIGTERM")
	}
	if code := old.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	if !logHas(t, old, "leadership handed over before stopping") {
		t.Fatal("the leader stopped without handing leadership over")
	}
	newLeader := waitLeader(t, waldenctl, admins(rest), leader)
	t.Logf("leader %s handed over to %s", leader, newLeader)

	// SIGHUP: a new log level applies at once; a changed raft section is
	// reported as needing a restart.
	m := rest[0]
	var peers strings.Builder
	for _, p := range members {
		fmt.Fprintf(&peers, "  - {id: %s, raft: %q, admin: %q}\n", p.id, p.raft, p.admin)
	}
	if logHas(t, m, `"level":"DEBUG"`) {
		t.Fatal("debug lines before the level changed")
	}
	writeMemberConfig(t, m, "signals", peers.String(), "debug", "")
	if err := os.WriteFile(m.config, []byte(strings.Replace(mustRead(t, m.config), "tick_interval: 50ms", "tick_interval: 60ms", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "reload logged", 10*time.Second, func() (bool, string) {
		return logHas(t, m, `"msg":"configuration reloaded"`) && logHas(t, m, `"keys":["raft"]`), ""
	})
	// Debug lines appear (successful admin calls are logged at debug).
	waitFor(t, "debug lines", 10*time.Second, func() (bool, string) {
		_, _ = status(t, waldenctl, m.admin)
		return logHas(t, m, `"level":"DEBUG"`), ""
	})

	// A broken file: refused, the member keeps running.
	if err := os.WriteFile(m.config, []byte("cluster_name: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "refusal logged", 10*time.Second, func() (bool, string) {
		return logHas(t, m, "reload refused: the configuration file has a mistake"), ""
	})
	if !m.alive() {
		t.Fatal("a bad reload stopped the member")
	}
	if _, err := status(t, waldenctl, m.admin); err != nil {
		t.Fatalf("member after a refused reload: %v", err)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
