package server_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// exitOf returns the exit status of a waldenctl run.
func exitOf(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestProcessMemberReplace (issue 21): waldenctl member replace on real
// processes. Bad input is refused with nothing changed: a member that does
// not exist, the leader, a second voter change inside the spacing. A
// follower whose disk is lost is replaced under its name; started with an
// empty data dir it becomes a voter again and the cluster goes on; then
// another follower is replaced under a new name.
func TestProcessMemberReplace(t *testing.T) {
	walden, waldenctl := binaries(t)
	dir := t.TempDir()
	members := opsCluster(t, dir, 3, 110, "repl", "")
	t.Cleanup(func() { dumpLogs(t, members) })
	for _, m := range members {
		m.start(t, walden)
	}
	eps := strings.Join(admins(members), ",")
	leader := waitLeader(t, waldenctl, admins(members), "")
	var followers []*member
	for _, m := range members {
		if m.id != leader {
			followers = append(followers, m)
		}
	}
	victim, other := followers[0], followers[1]

	_, errOut, err := ctl(waldenctl, "--endpoints", eps, "member", "replace", "c9")
	if exitOf(err) != 5 || !strings.Contains(errOut, "no member c9") {
		t.Fatalf("replace an unknown member: exit %d: %s", exitOf(err), errOut)
	}
	_, errOut, err = ctl(waldenctl, "--endpoints", eps, "member", "replace", leader)
	if exitOf(err) != 4 || !strings.Contains(errOut, "is the leader") || !strings.Contains(errOut, "leader transfer") {
		t.Fatalf("replace the leader: exit %d: %s", exitOf(err), errOut)
	}

	// The victim's host and disk are lost.
	victim.kill()
	if err := os.RemoveAll(victim.dataDir); err != nil {
		t.Fatal(err)
	}
	var out string
	waitFor(t, "the replacement of "+victim.id, 20*time.Second, func() (bool, string) {
		// The leader refuses voter changes for a lease horizon after it
		// started; retry until it accepts.
		out, errOut, err = ctl(waldenctl, "--endpoints", eps, "member", "replace", victim.id)
		return err == nil, fmt.Sprintf("exit %d: %s %s", exitOf(err), out, errOut)
	})
	if !strings.Contains(out, "removed member "+victim.id) || !strings.Contains(out, "as a learner") {
		t.Fatalf("replace output: %s", out)
	}
	// A second voter change right after: refused with the time left.
	_, errOut, err = ctl(waldenctl, "--endpoints", eps, "member", "replace", other.id)
	if exitOf(err) != 4 || !strings.Contains(errOut, "try again in") {
		t.Fatalf("second voter change inside the spacing: exit %d: %s", exitOf(err), errOut)
	}
	st, err := status(t, waldenctl, eps)
	if err != nil || len(st.Members) != 3 {
		t.Fatalf("members after the refused change: %+v %v", st, err)
	}

	// The replacement starts with an empty data dir and becomes a voter.
	var peers strings.Builder
	for _, m := range members {
		fmt.Fprintf(&peers, "  - {id: %s, raft: %q, admin: %q}\n", m.id, m.raft, m.admin)
	}
	writeMemberConfig(t, victim, "repl", peers.String(), "info", "initial_cluster_state: existing\n")
	victim.start(t, walden)
	// A voter in the leader's configuration (the replacement's own status
	// shows its old membership while it replays the log).
	waitFor(t, victim.id+" a voter again", 30*time.Second, func() (bool, string) {
		s, err := status(t, waldenctl, leaderAdmin(members, leader))
		if err != nil {
			return false, err.Error()
		}
		for _, m := range s.Members {
			if m.ID == victim.id && m.Role != "learner" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", s)
	})
	if _, err := status(t, waldenctl, victim.admin); err != nil {
		t.Fatalf("%s does not answer: %v", victim.id, err)
	}

	// Then the other follower under a new name, once the spacing allows.
	a := strings.Split(other.admin, ":")
	r := strings.Split(other.raft, ":")
	newAdmin, newRaft := a[0]+":"+a[1], r[0]+":"+r[1] // same host and ports: the old process is gone
	other.kill()
	waitFor(t, "the replacement of "+other.id+" by c4", 30*time.Second, func() (bool, string) {
		out, errOut, err = ctl(waldenctl, "--endpoints", eps, "member", "replace", other.id, "--name", "c4", "--raft", newRaft, "--admin", newAdmin)
		return err == nil, fmt.Sprintf("exit %d: %s %s", exitOf(err), out, errOut)
	})
	st, err = status(t, waldenctl, leaderAdmin(members, leader))
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]string{}
	for _, m := range st.Members {
		roles[m.ID] = m.Role
	}
	if _, ok := roles[other.id]; ok || roles["c4"] != "learner" {
		t.Fatalf("members after replacing %s by c4: %v", other.id, roles)
	}
}

func leaderAdmin(ms []*member, id string) string {
	for _, m := range ms {
		if m.id == id {
			return m.admin
		}
	}
	return ""
}
