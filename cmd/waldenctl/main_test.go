package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
)

// fakeCluster is a walden.v1.Cluster server with canned answers.
type fakeCluster struct {
	waldenv1.UnimplementedClusterServer
	status   *waldenv1.StatusResponse
	transfer func(*waldenv1.LeaderTransferRequest) (*waldenv1.LeaderTransferResponse, error)
	remove   func(*waldenv1.MemberRemoveRequest) (*waldenv1.MemberRemoveResponse, error)
	calls    atomic.Int32
}

func (f *fakeCluster) Status(context.Context, *waldenv1.StatusRequest) (*waldenv1.StatusResponse, error) {
	f.calls.Add(1)
	return f.status, nil
}

func (f *fakeCluster) MemberList(context.Context, *waldenv1.MemberListRequest) (*waldenv1.MemberListResponse, error) {
	f.calls.Add(1)
	return &waldenv1.MemberListResponse{Members: f.status.GetMembers()}, nil
}

func (f *fakeCluster) MemberAdd(_ context.Context, r *waldenv1.MemberAddRequest) (*waldenv1.MemberAddResponse, error) {
	f.calls.Add(1)
	m := &waldenv1.Member{Id: r.GetId(), RaftAddr: r.GetRaftAddr(), AdminAddr: r.GetAdminAddr(), MemberRole: waldenv1.MemberRole_MEMBER_ROLE_LEARNER}
	return &waldenv1.MemberAddResponse{Member: m, Members: append(f.status.GetMembers(), m)}, nil
}

func (f *fakeCluster) MemberRemove(_ context.Context, r *waldenv1.MemberRemoveRequest) (*waldenv1.MemberRemoveResponse, error) {
	f.calls.Add(1)
	return f.remove(r)
}

func (f *fakeCluster) LeaderTransfer(_ context.Context, r *waldenv1.LeaderTransferRequest) (*waldenv1.LeaderTransferResponse, error) {
	f.calls.Add(1)
	return f.transfer(r)
}

func serveFake(t *testing.T, f *fakeCluster) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	waldenv1.RegisterClusterServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// deadAddr is a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func sampleStatus() *waldenv1.StatusResponse {
	return &waldenv1.StatusResponse{
		ClusterName: "demo", NodeId: "c1", LeaderId: "c1", Term: 3, CommitIndex: 12, AppliedIndex: 12, RaftState: "leader", ProgressBy: "c1",
		Members: []*waldenv1.Member{
			{Id: "c1", RaftId: 11, RaftAddr: "127.0.0.1:7101", AdminAddr: "127.0.0.1:7001", MemberRole: waldenv1.MemberRole_MEMBER_ROLE_LEADER, Reachable: true, MatchIndex: 12,
				Version: "v0.1.0", Commits: true},
			// A member with zero values: json must still show every field.
			{Id: "c2", RaftId: 12, RaftAddr: "127.0.0.1:7102", AdminAddr: "127.0.0.1:7002", MemberRole: waldenv1.MemberRole_MEMBER_ROLE_FOLLOWER},
		},
	}
}

func runCtl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestStatusJSONShape(t *testing.T) {
	addr := serveFake(t, &fakeCluster{status: sampleStatus()})
	code, out, errOut := runCtl(t, "--endpoints", addr, "status", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not json: %v\n%s", err, out)
	}
	for _, k := range []string{"cluster_name", "node_id", "leader_id", "term", "commit_index", "applied_index", "raft_state", "members"} {
		if _, ok := got[k]; !ok {
			t.Errorf("status json lacks %q:\n%s", k, out)
		}
	}
	members, _ := got["members"].([]any)
	if len(members) != 2 {
		t.Fatalf("members %v", got["members"])
	}
	for _, m := range members {
		mm := m.(map[string]any)
		for _, k := range []string{"id", "raft_id", "raft_addr", "admin_addr", "role", "reachable", "match_index"} {
			if _, ok := mm[k]; !ok {
				t.Errorf("member json lacks %q: %v", k, mm)
			}
		}
	}
	second := members[1].(map[string]any)
	if second["reachable"] != false || second["match_index"] != "0" {
		t.Errorf("zero values must be printed: %v", second)
	}
	if got["cluster_name"] != "demo" || got["term"] != "3" {
		t.Errorf("values: %v", got)
	}
}

func TestStatusTable(t *testing.T) {
	addr := serveFake(t, &fakeCluster{status: sampleStatus()})
	code, out, errOut := runCtl(t, "--endpoints", addr, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	want := []string{
		"CLUSTER  ANSWERED BY  STATE   LEADER  TERM  COMMIT  APPLIED",
		"demo     c1           leader  c1      3     12      12",
		"",
		"ID  ROLE      VERSION  RAFT ADDR       ADMIN ADDR      REACHABLE  COMMITS  MATCH INDEX",
		"c1  leader    v0.1.0   127.0.0.1:7101  127.0.0.1:7001  true       true     12",
		"c2  follower  -        127.0.0.1:7102  127.0.0.1:7002  false      false    0",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("table:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
}

func TestMemberCommands(t *testing.T) {
	f := &fakeCluster{status: sampleStatus(), remove: func(r *waldenv1.MemberRemoveRequest) (*waldenv1.MemberRemoveResponse, error) {
		return nil, status.Errorf(codes.NotFound, "unknown member %q", r.GetId())
	}}
	addr := serveFake(t, f)

	code, out, _ := runCtl(t, "--endpoints", addr, "member", "list", "-o", "json")
	var list struct {
		Members []map[string]any `json:"members"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Members) != 2 {
		t.Fatalf("member list: exit %d\n%s", code, out)
	}

	code, out, _ = runCtl(t, "--endpoints", addr, "member", "add", "c4", "--raft", "127.0.0.1:7104", "--admin", "127.0.0.1:7004")
	if code != 0 || !strings.HasPrefix(out, "added member c4 as learner\n") || !strings.Contains(out, "c4  learner") {
		t.Fatalf("member add: exit %d\n%s", code, out)
	}

	code, _, errOut := runCtl(t, "--endpoints", addr, "member", "add", "c4", "--raft", "127.0.0.1:7104")
	if code != exitUsage || !strings.Contains(errOut, `"admin" not set`) {
		t.Fatalf("missing --admin: exit %d %q", code, errOut)
	}

	code, out, errOut = runCtl(t, "--endpoints", addr, "member", "remove", "c9")
	if code != exitNotFound || out != "" || errOut != "waldenctl: there is no member c9 in the cluster\ndid you mean c1?\n" {
		t.Fatalf("member remove: exit %d stdout %q stderr %q", code, out, errOut)
	}
}

func TestTriesEveryEndpoint(t *testing.T) {
	f := &fakeCluster{status: sampleStatus()}
	live := serveFake(t, f)
	dead1, dead2 := deadAddr(t), deadAddr(t)
	code, out, errOut := runCtl(t, "--endpoints", dead1+","+dead2+","+live, "status", "-o", "json")
	if code != 0 || !strings.Contains(out, `"cluster_name": "demo"`) {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}

	code, out, errOut = runCtl(t, "--endpoints", dead1+","+dead2, "--timeout", "2s", "status")
	if code != exitUnavailable || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "waldenctl: no endpoint answered: "+dead1) || !strings.Contains(errOut, dead2) {
		t.Fatalf("all dead: exit %d stdout %q stderr %q", code, out, errOut)
	}
}

func TestEndpointsFromEnv(t *testing.T) {
	addr := serveFake(t, &fakeCluster{status: sampleStatus()})
	t.Setenv(envEndpoints, deadAddr(t)+","+addr)
	if code, _, errOut := runCtl(t, "status"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

func TestFollowsLeaderHint(t *testing.T) {
	leader := &fakeCluster{status: sampleStatus(), transfer: func(r *waldenv1.LeaderTransferRequest) (*waldenv1.LeaderTransferResponse, error) {
		return &waldenv1.LeaderTransferResponse{LeaderId: r.GetId(), Term: 4}, nil
	}}
	leaderAddr := serveFake(t, leader)
	follower := &fakeCluster{status: sampleStatus(), transfer: func(*waldenv1.LeaderTransferRequest) (*waldenv1.LeaderTransferResponse, error) {
		s, _ := status.New(codes.Unavailable, "not leader; leader=c1 addr="+leaderAddr).WithDetails(&errdetails.ErrorInfo{
			Reason: reasonNotLeader, Domain: "walden.v1", Metadata: map[string]string{"leader_id": "c1", "leader_addr": leaderAddr},
		})
		return nil, s.Err()
	}}
	followerAddr := serveFake(t, follower)
	code, out, errOut := runCtl(t, "--endpoints", followerAddr, "leader", "transfer", "c2", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, `"leader_id": "c2"`) || leader.calls.Load() != 1 || follower.calls.Load() != 1 {
		t.Fatalf("out %s; leader calls %d follower calls %d", out, leader.calls.Load(), follower.calls.Load())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"status", "-o", "xml"},
		{"status", "--timeout", "0s"},
		{"status", "--cert", "x.pem"},
		{"status", "--cacert", "/nonexistent/ca.pem"},
		{"status", "--endpoints", ","},
		{"nosuchcommand"},
	} {
		code, out, errOut := runCtl(t, args...)
		if code != exitUsage || out != "" || !strings.HasPrefix(errOut, "waldenctl: ") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d stdout %q stderr %q", args, code, out, errOut)
		}
	}
}
