package e2e_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"walden/internal/devcluster"
	waldenv1 "walden/proto/walden/v1"
)

// previous is the release the upgrade test starts from. Until the first
// release is tagged it is the commit main was at before members announced
// their versions (the states-as-enums storage format, snapshot version 3,
// which this release reads and writes alike); once v0.1.0 is tagged, make
// upgrade-test PREVIOUS=v0.1.0.
var previous = flag.String("e2e.previous", "4aeb5d7", "git commit or tag of the previous release for the mixed-version upgrade test (TestE2EMixedVersionUpgrade)")

// buildPrevious builds walden at rev in a temporary work tree of this
// repository (removed afterwards) and returns the binary and the version it
// reports. The test is skipped when git or the commit is not there (a
// shallow clone), except in CI.
func buildPrevious(t *testing.T, rev string) (bin, version string) {
	t.Helper()
	skip := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		skip("no git work tree to build the previous release from: %v", err)
	}
	root := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", rev+"^{commit}").Run(); err != nil {
		skip("the previous release %s is not in this clone's history (fetch it, or give -e2e.previous)", rev)
	}
	dir := filepath.Join(t.TempDir(), "previous")
	if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", dir, rev).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add %s: %v\n%s", rev, err, out)
	}
	t.Cleanup(func() {
		_ = exec.Command("git", "-C", root, "worktree", "remove", "--force", dir).Run()
		_ = exec.Command("git", "-C", root, "worktree", "prune").Run()
	})
	bin = filepath.Join(t.TempDir(), "walden-previous")
	label := "previous-" + rev
	cmd := exec.Command("go", "build", "-ldflags", "-X walden/version.version="+label, "-o", bin, "./cmd/walden")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the previous release %s: %v\n%s", rev, err, out)
	}
	return bin, label
}

func versionOf(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	var v struct{ Version string }
	if err != nil || json.Unmarshal(out, &v) != nil {
		t.Fatalf("%s version: %v %s", bin, err, out)
	}
	return v.Version
}

// TestE2EMixedVersionUpgrade is the runbook's upgrade and rollback on real
// processes: three coordinators and three brokers start on the previous
// release; the coordinators are upgraded to this one a member at a time,
// followers first (SIGTERM, new binary, same data directory), and after
// each step every member commits and the upgraded ones report this
// release's version; one member is then rolled back to the previous binary
// and commits again; in that mixed cluster a broker is killed and failed
// over without losing an acknowledged record.
func TestE2EMixedVersionUpgrade(t *testing.T) {
	needFull(t)
	oldBin, oldV := buildPrevious(t, *previous)
	newV := versionOf(t, waldenBin)
	if newV == oldV {
		t.Fatalf("both releases report version %q", newV)
	}
	var mu sync.Mutex
	binOf := map[string]string{} // process name -> binary (default: the previous release)
	c := startCluster(t, func(o *devcluster.Options) {
		o.Command = func(proc string, argv []string) *exec.Cmd {
			mu.Lock()
			defer mu.Unlock()
			bin, ok := binOf[proc]
			if !ok {
				bin = oldBin
			}
			return exec.Command(bin, argv[1:]...)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// expect waits until every member reports the version its binary has
	// (in its own status; a release older than the announcement reports
	// none) and has applied what the leader had committed; and, when this
	// release leads, until its status shows every member committing with
	// the versions it heard announced.
	want := func(name string) string {
		mu.Lock()
		defer mu.Unlock()
		if binOf[name] == waldenBin {
			return newV
		}
		return oldV
	}
	okVersion := func(name, got string) bool {
		w := want(name)
		return got == w || (w == oldV && got == "")
	}
	expect := func(step string) {
		t.Helper()
		err := devcluster.Poll(ctx, 90*time.Second, step, func() error {
			statuses := map[string]*waldenv1.StatusResponse{}
			for _, p := range c.Coords {
				st, err := c.Status(ctx, p)
				if err != nil {
					return fmt.Errorf("%s: %w", p.Name, err)
				}
				statuses[p.Name] = st
			}
			var bad []string
			var leader string
			for name, st := range statuses {
				if st.GetLeaderId() == "" {
					return fmt.Errorf("%s knows no leader", name)
				}
				leader = st.GetLeaderId()
				for _, m := range st.GetMembers() {
					if m.GetId() == name && !okVersion(name, m.GetVersion()) {
						bad = append(bad, fmt.Sprintf("%s reports version %q, want %q", name, m.GetVersion(), want(name)))
					}
				}
			}
			ls := statuses[leader]
			for name, st := range statuses {
				if st.GetAppliedIndex() < ls.GetCommitIndex() {
					bad = append(bad, fmt.Sprintf("%s applied %d of the leader's %d", name, st.GetAppliedIndex(), ls.GetCommitIndex()))
				}
			}
			if want(leader) == newV {
				if ls.GetProgressBy() != leader {
					bad = append(bad, fmt.Sprintf("the leader %s names no progress", leader))
				}
				for _, m := range ls.GetMembers() {
					if !m.GetCommits() || !okVersion(m.GetId(), m.GetVersion()) {
						bad = append(bad, fmt.Sprintf("leader %s: %s commits %v, version %q (want %q)", leader, m.GetId(), m.GetCommits(), m.GetVersion(), want(m.GetId())))
					}
				}
			}
			if len(bad) > 0 {
				return fmt.Errorf("%s", strings.Join(bad, "; "))
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		t.Logf("%s: every member reports its version and has applied the leader's commits", step)
	}
	restart := func(name, bin string) {
		t.Helper()
		p := c.Proc(name)
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := devcluster.Poll(ctx, 30*time.Second, name+" stopped", func() error {
			if p.Alive() {
				return fmt.Errorf("still running")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		binOf[name] = bin
		mu.Unlock()
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	expect("all on " + oldV)

	// Followers first, the leader last.
	leader, err := c.WaitLeader(ctx, "", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, m := range c.Coords {
		if m.Name != leader.Name {
			order = append(order, m.Name)
		}
	}
	order = append(order, leader.Name)
	for _, name := range order {
		restart(name, waldenBin)
		expect(name + " upgraded to " + newV)
	}
	// Roll one member back to the previous release on its data directory.
	back := order[0]
	restart(back, oldBin)
	expect(back + " rolled back to " + oldV)

	// The mixed cluster fails a broker over.
	sc := &devcluster.Failover{Victim: "b1", Warmup: 2 * time.Second, After: time.Second, Say: logSay(t)}
	sum, err := sc.Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, sum)
	t.Logf("failover in the mixed cluster (%s on %s, the others on %s): detection %d ms, recovered %d bytes",
		back, oldV, newV, sum.DetectionMs, sum.UploadedBytes)
}
