package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus"

	"walden/authz"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// fakeNode is a ClusterNode with a settable status and scripted errors.
type fakeNode struct {
	mu       sync.Mutex
	st       raftnode.Status
	ready    bool
	err      error // returned by every write and by LinearizableRead
	reads    int
	added    []*waldenv1.MemberContext
	removed  []string
	transfer []string
	block    bool // writes wait for ctx
}

func (f *fakeNode) Status() raftnode.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}
func (f *fakeNode) LeaderID() string { return f.Status().LeaderID }
func (f *fakeNode) Ready() bool      { f.mu.Lock(); defer f.mu.Unlock(); return f.ready }

func (f *fakeNode) setLeader(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.LeaderID = id
}

func (f *fakeNode) write(ctx context.Context, record func()) error {
	f.mu.Lock()
	block, err := f.block, f.err
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return fmt.Errorf("raftnode: wait: %w", ctx.Err())
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	record()
	f.mu.Unlock()
	return nil
}

func (f *fakeNode) LinearizableRead(ctx context.Context) error {
	return f.write(ctx, func() { f.reads++ })
}
func (f *fakeNode) AddMember(ctx context.Context, m *waldenv1.MemberContext) error {
	return f.write(ctx, func() {
		f.added = append(f.added, m)
		f.st.Members = append(f.st.Members, &waldenv1.Member{Id: m.Id, RaftAddr: m.RaftAddr, AdminAddr: m.AdminAddr, MemberRole: waldenv1.MemberRole_MEMBER_ROLE_LEARNER})
	})
}
func (f *fakeNode) RemoveMember(ctx context.Context, id string) error {
	return f.write(ctx, func() { f.removed = append(f.removed, id) })
}
func (f *fakeNode) TransferLeadership(ctx context.Context, id string) error {
	return f.write(ctx, func() {
		f.transfer = append(f.transfer, id)
		f.st.LeaderID = id
		f.st.Term++
	})
}

func threeMembers(adminAddrs ...string) []*waldenv1.Member {
	var ms []*waldenv1.Member
	for i, a := range adminAddrs {
		ms = append(ms, &waldenv1.Member{Id: fmt.Sprintf("c%d", i+1), RaftAddr: fmt.Sprintf("127.0.0.1:%d", 7101+i), AdminAddr: a, MemberRole: waldenv1.MemberRole_MEMBER_ROLE_FOLLOWER})
	}
	return ms
}

// serveAdmin serves the admin API of node on a loopback port.
func serveAdmin(t *testing.T, node ClusterNode, nodeID string, lis net.Listener) (waldenv1.ClusterClient, *health.Server) {
	t.Helper()
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	logger := slog.New(slog.DiscardHandler)
	admin := newAdminService(node, nodeID, insecure.NewCredentials(), logger)
	hs := health.NewServer()
	s, err := newAdminGRPC(admin, hs, insecure.NewCredentials(), &authz.Authorizer{}, prometheus.NewRegistry(), logger)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); admin.close() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return waldenv1.NewClusterClient(conn), hs
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func wantCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	s, _ := status.FromError(err)
	if s.Code() != code || !strings.Contains(s.Message(), msg) {
		t.Fatalf("got %v (code %s), want code %s with %q", err, s.Code(), code, msg)
	}
}

func TestStatusAndMemberList(t *testing.T) {
	f := &fakeNode{st: raftnode.Status{ClusterName: "demo", NodeID: "c1", LeaderID: "c1", Term: 4, CommitIndex: 9, AppliedIndex: 8,
		RaftState: "leader", Members: threeMembers("a:1", "b:2", "c:3")}}
	c, _ := serveAdmin(t, f, "c1", nil)
	st, err := c.Status(ctx(t), &waldenv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetClusterName() != "demo" || st.GetNodeId() != "c1" || st.GetLeaderId() != "c1" || st.GetTerm() != 4 ||
		st.GetCommitIndex() != 9 || st.GetAppliedIndex() != 8 || st.GetRaftState() != "leader" || len(st.GetMembers()) != 3 {
		t.Fatalf("status %v", st)
	}
	if _, err := c.MemberList(ctx(t), &waldenv1.MemberListRequest{}); err != nil || f.reads != 0 {
		t.Fatalf("plain list: %v, reads %d", err, f.reads)
	}
	ml, err := c.MemberList(ctx(t), &waldenv1.MemberListRequest{Linearizable: true})
	if err != nil || f.reads != 1 || len(ml.GetMembers()) != 3 {
		t.Fatalf("linearizable list: %v, reads %d", err, f.reads)
	}
	f.err = fmt.Errorf("raftnode: read index: %w", raftnode.ErrNoLeader)
	_, err = c.MemberList(ctx(t), &waldenv1.MemberListRequest{Linearizable: true})
	wantCode(t, err, codes.Unavailable, "no leader")
}

func TestMemberAddValidation(t *testing.T) {
	f := &fakeNode{st: raftnode.Status{ClusterName: "demo", NodeID: "c1", LeaderID: "c1", Members: threeMembers("a:1", "b:2", "c:3")}}
	c, _ := serveAdmin(t, f, "c1", nil)
	cases := []struct {
		req  *waldenv1.MemberAddRequest
		want string
	}{
		{&waldenv1.MemberAddRequest{RaftAddr: "127.0.0.1:7104", AdminAddr: "127.0.0.1:7004"}, "id: must not be empty"},
		{&waldenv1.MemberAddRequest{Id: "c 4", RaftAddr: "127.0.0.1:7104", AdminAddr: "127.0.0.1:7004"}, "id: invalid name"},
		{&waldenv1.MemberAddRequest{Id: "c4", AdminAddr: "127.0.0.1:7004"}, "raft_addr: must not be empty"},
		{&waldenv1.MemberAddRequest{Id: "c4", RaftAddr: "127.0.0.1", AdminAddr: "127.0.0.1:7004"}, "raft_addr: invalid address"},
		{&waldenv1.MemberAddRequest{Id: "c4", RaftAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:7004"}, "raft_addr: invalid address"},
		{&waldenv1.MemberAddRequest{Id: "c4", RaftAddr: "127.0.0.1:7104", AdminAddr: "nohost"}, "admin_addr: invalid address"},
	}
	for _, tc := range cases {
		_, err := c.MemberAdd(ctx(t), tc.req)
		wantCode(t, err, codes.InvalidArgument, tc.want)
		if !strings.HasPrefix(status.Convert(err).Message(), strings.SplitN(tc.want, ":", 2)[0]+":") {
			t.Fatalf("message %q must start with the field", status.Convert(err).Message())
		}
	}
	if len(f.added) != 0 {
		t.Fatalf("invalid requests reached the node: %v", f.added)
	}
	resp, err := c.MemberAdd(ctx(t), &waldenv1.MemberAddRequest{Id: "c4", RaftAddr: "127.0.0.1:7104", AdminAddr: "127.0.0.1:7004"})
	if err != nil || resp.GetMember().GetId() != "c4" || resp.GetMember().GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER || len(resp.GetMembers()) != 4 {
		t.Fatalf("add: %v %v", resp, err)
	}
}

func TestErrorCodes(t *testing.T) {
	cases := []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{fmt.Errorf("raftnode: add: %w", raftnode.ErrNoLeader), codes.Unavailable, "no leader"},
		{&raftnode.MemberError{Op: "remove member", ID: "c9", Err: raftnode.ErrUnknownMember}, codes.NotFound, `remove member "c9": no member has that id`},
		{&raftnode.MemberError{Op: "add member", ID: "c2", Err: raftnode.ErrMemberExists}, codes.AlreadyExists, "already in the cluster"},
		{&raftnode.MemberError{Op: "remove member", ID: "c1", Err: raftnode.ErrLastVoter}, codes.FailedPrecondition, "last voter"},
		{raftnode.ErrStopped, codes.Unavailable, "stopping"},
		{fmt.Errorf("raftnode: wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "deadline"},
		{errors.New("disk on fire"), codes.Internal, "disk on fire"},
	}
	for _, tc := range cases {
		f := &fakeNode{st: raftnode.Status{NodeID: "c1", LeaderID: "c1"}, err: tc.err}
		c, _ := serveAdmin(t, f, "c1", nil)
		_, err := c.MemberRemove(ctx(t), &waldenv1.MemberRemoveRequest{Id: "c9"})
		wantCode(t, err, tc.code, tc.msg)
	}
	f := &fakeNode{st: raftnode.Status{NodeID: "c1", LeaderID: "c1"}}
	c, _ := serveAdmin(t, f, "c1", nil)
	_, err := c.MemberRemove(ctx(t), &waldenv1.MemberRemoveRequest{})
	wantCode(t, err, codes.InvalidArgument, "id: must not be empty")
	_, err = c.LeaderTransfer(ctx(t), &waldenv1.LeaderTransferRequest{})
	wantCode(t, err, codes.InvalidArgument, "id: must not be empty")
}

func TestDeadlineExceeded(t *testing.T) {
	f := &fakeNode{st: raftnode.Status{NodeID: "c1", LeaderID: "c1"}, block: true}
	c, _ := serveAdmin(t, f, "c1", nil)
	dctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.MemberAdd(dctx, &waldenv1.MemberAddRequest{Id: "c4", RaftAddr: "127.0.0.1:7104", AdminAddr: "127.0.0.1:7004"})
	wantCode(t, err, codes.DeadlineExceeded, "")
}

func TestLeaderTransferOnLeader(t *testing.T) {
	f := &fakeNode{st: raftnode.Status{NodeID: "c1", LeaderID: "c1", Term: 2}}
	c, _ := serveAdmin(t, f, "c1", nil)
	resp, err := c.LeaderTransfer(ctx(t), &waldenv1.LeaderTransferRequest{Id: "c2"})
	if err != nil || resp.GetLeaderId() != "c2" || resp.GetTerm() != 3 {
		t.Fatalf("transfer: %v %v", resp, err)
	}
}

func TestLeaderTransferNoLeader(t *testing.T) {
	f := &fakeNode{st: raftnode.Status{NodeID: "c1"}}
	c, _ := serveAdmin(t, f, "c1", nil)
	_, err := c.LeaderTransfer(ctx(t), &waldenv1.LeaderTransferRequest{Id: "c2"})
	wantCode(t, err, codes.Unavailable, "no leader")
}

func TestLeaderTransferForwardedToLeader(t *testing.T) {
	l1, l2 := testutil.Listen(t, "127.0.0.1"), testutil.Listen(t, "127.0.0.1")
	members := threeMembers(l1.Addr().String(), l2.Addr().String(), "127.0.0.1:1")
	leader := &fakeNode{st: raftnode.Status{NodeID: "c2", LeaderID: "c2", Term: 5, Members: members}}
	follower := &fakeNode{st: raftnode.Status{NodeID: "c1", LeaderID: "c2", Term: 5, Members: members}}
	serveAdmin(t, leader, "c2", l2)
	c, _ := serveAdmin(t, follower, "c1", l1)
	resp, err := c.LeaderTransfer(ctx(t), &waldenv1.LeaderTransferRequest{Id: "c3"})
	if err != nil || resp.GetLeaderId() != "c3" || resp.GetTerm() != 6 {
		t.Fatalf("forwarded transfer: %v %v", resp, err)
	}
	if len(leader.transfer) != 1 || len(follower.transfer) != 0 {
		t.Fatalf("transfer ran on leader %v, follower %v", leader.transfer, follower.transfer)
	}
}

func TestLeaderTransferHintWhenLeaderUnreachable(t *testing.T) {
	l1 := testutil.Listen(t, "127.0.0.1")
	dead := testutil.Listen(t, "127.0.0.1")
	deadAddr := dead.Addr().String()
	dead.Close()
	follower := &fakeNode{st: raftnode.Status{NodeID: "c1", LeaderID: "c2", Members: threeMembers(l1.Addr().String(), deadAddr, "127.0.0.1:1")}}
	c, _ := serveAdmin(t, follower, "c1", l1)
	var trailer metadata.MD
	_, err := c.LeaderTransfer(ctx(t), &waldenv1.LeaderTransferRequest{Id: "c3"}, grpc.Trailer(&trailer))
	wantCode(t, err, codes.Unavailable, "not leader; leader=c2 addr="+deadAddr)
	if got := trailer.Get(TrailerLeaderAddr); len(got) != 1 || got[0] != deadAddr {
		t.Fatalf("trailer %v", trailer)
	}
	if id, addr := LeaderHint(status.Convert(err)); id != "c2" || addr != deadAddr {
		t.Fatalf("detail hint %q %q", id, addr)
	}
}

func TestForwardedRequestIsNotForwardedAgain(t *testing.T) {
	// Two members that each believe the other leads: the forwarded request
	// must come back with a hint, not bounce forever.
	l1, l2 := testutil.Listen(t, "127.0.0.1"), testutil.Listen(t, "127.0.0.1")
	members := threeMembers(l1.Addr().String(), l2.Addr().String(), "127.0.0.1:1")
	a := &fakeNode{st: raftnode.Status{NodeID: "c1", LeaderID: "c2", Members: members}}
	b := &fakeNode{st: raftnode.Status{NodeID: "c2", LeaderID: "c1", Members: members}}
	c, _ := serveAdmin(t, a, "c1", l1)
	serveAdmin(t, b, "c2", l2)
	var trailer metadata.MD
	_, err := c.LeaderTransfer(ctx(t), &waldenv1.LeaderTransferRequest{Id: "c3"}, grpc.Trailer(&trailer))
	wantCode(t, err, codes.Unavailable, "not leader; leader=c1")
	if got := trailer.Get(TrailerLeaderAddr); len(got) != 1 || got[0] != l1.Addr().String() {
		t.Fatalf("trailer %v", trailer)
	}
}

func TestHealthLivenessAndReadiness(t *testing.T) {
	f := &fakeNode{st: raftnode.Status{NodeID: "c1"}}
	_, hs := serveAdmin(t, f, "c1", nil)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchLeader(wctx, f, hs, 5*time.Millisecond, slog.New(slog.DiscardHandler))
	waitHealth := func(service string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			r, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
			if err == nil && r.GetStatus() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health %q: %v %v, want %v", service, r, err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	cluster := waldenv1.Cluster_ServiceDesc.ServiceName
	// No leader: alive, not ready.
	waitHealth(cluster, healthpb.HealthCheckResponse_NOT_SERVING)
	waitHealth("", healthpb.HealthCheckResponse_SERVING)
	// A leader, but not caught up: still not ready.
	f.setLeader("c2")
	waitHealth(cluster, healthpb.HealthCheckResponse_NOT_SERVING)
	f.mu.Lock()
	f.ready = true
	f.mu.Unlock()
	waitHealth(cluster, healthpb.HealthCheckResponse_SERVING)
	// Quorum lost: not ready, and still alive.
	f.mu.Lock()
	f.ready = false
	f.st.LeaderID = ""
	f.mu.Unlock()
	waitHealth(cluster, healthpb.HealthCheckResponse_NOT_SERVING)
	waitHealth("", healthpb.HealthCheckResponse_SERVING)
}
