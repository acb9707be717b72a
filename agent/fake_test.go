package agent

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"walden/fencing"
	waldenv1 "walden/proto/walden/v1"
)

// fakeLeader is an in-test Agent server with the leader's semantics:
// Register always issues a new epoch (refused with RECOVERY_RUNNING while a
// recovery of the broker runs); RenewLease of a fenced broker answers
// NODE_FENCED, of another epoch EPOCH_EXPIRED; the leader records when it
// received each renewal that succeeded, and would consider the lease expired
// lease_ttl + drift after that (leaderExpiry).
type fakeLeader struct {
	waldenv1.UnimplementedAgentServer

	clock Clock
	ttl   time.Duration
	drift time.Duration

	mu              sync.Mutex
	epoch           uint64 // current epoch of the broker, 0 = unknown
	nextEpoch       uint64
	fenced          bool
	recoveryRunning bool
	recoveredOffset int64
	hang            bool // renewals hang until the caller gives up
	lastRecv        time.Time
	renewals        int
	registers       int // Register calls, refused ones included
	lastRegister    *waldenv1.RegisterRequest
}

func newFakeLeader(ttl, drift time.Duration) *fakeLeader {
	return &fakeLeader{clock: realClock{}, ttl: ttl, drift: drift, nextEpoch: 1, recoveredOffset: -1}
}

// refusal is the status a coordinator answers for a fencing refusal.
func refusal(reason string) error {
	return fencing.GRPCStatus(fencing.FromReason(reason)).Err()
}

func (f *fakeLeader) Register(_ context.Context, req *waldenv1.RegisterRequest) (*waldenv1.RegisterResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registers++
	f.lastRegister = req
	if req.GetClusterName() != "demo" {
		return nil, status.Error(codes.InvalidArgument, "cluster_name: wrong cluster")
	}
	if f.recoveryRunning {
		return nil, refusal(reasonRecoveryRunning)
	}
	f.epoch = f.nextEpoch
	f.nextEpoch++
	f.fenced = false
	return &waldenv1.RegisterResponse{BrokerId: req.GetBrokerId(), Epoch: f.epoch, LeaseTtlMs: f.ttl.Milliseconds(), RecoveredWalOffset: f.recoveredOffset}, nil
}

func (f *fakeLeader) RenewLease(ctx context.Context, req *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	f.mu.Lock()
	if f.hang {
		f.mu.Unlock()
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	defer f.mu.Unlock()
	switch {
	case f.epoch == 0:
		return nil, refusal(reasonUnknownNode)
	case f.fenced:
		return nil, refusal(reasonNodeFenced)
	case req.GetEpoch() != f.epoch:
		return nil, refusal(reasonEpochExpired)
	}
	f.lastRecv = f.clock.Now()
	f.renewals++
	return &waldenv1.RenewLeaseResponse{Epoch: f.epoch, LeaseTtlMs: f.ttl.Milliseconds(), LeaderId: "c1"}, nil
}

// failover fences the broker the way a decision does: a new epoch, fenced,
// and a recovery job running until finishRecovery.
func (f *fakeLeader) failover() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.epoch = f.nextEpoch
	f.nextEpoch++
	f.fenced = true
	f.recoveryRunning = true
}

func (f *fakeLeader) finishRecovery(offset int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recoveryRunning = false
	f.recoveredOffset = offset
}

func (f *fakeLeader) setHang(h bool) {
	f.mu.Lock()
	f.hang = h
	f.mu.Unlock()
}

type fakeStats struct {
	epoch               uint64
	renewals, registers int
	lastRecv            time.Time
}

func (f *fakeLeader) stats() fakeStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fakeStats{epoch: f.epoch, renewals: f.renewals, registers: f.registers, lastRecv: f.lastRecv}
}

// leaderExpiry is the earliest instant at which the leader could treat the
// lease as expired.
func (f *fakeLeader) leaderExpiry() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastRecv.Add(f.ttl + f.drift)
}

// fakeFollower answers every Agent RPC with Unavailable and a hint naming
// the leader, in the trailer or in an ErrorInfo detail.
type fakeFollower struct {
	waldenv1.UnimplementedAgentServer
	leaderAddr string
	inDetail   bool

	mu    sync.Mutex
	calls int
}

func (f *fakeFollower) notLeader(ctx context.Context) error {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	if f.inDetail {
		s, _ := status.New(codes.Unavailable, "not leader").WithDetails(&errdetails.ErrorInfo{
			Reason: "NOT_LEADER", Domain: "walden.v1", Metadata: map[string]string{"leader_id": "c2", "leader_addr": f.leaderAddr},
		})
		return s.Err()
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs("walden-leader-id", "c2", "walden-leader-addr", f.leaderAddr))
	return status.Error(codes.Unavailable, "not leader")
}

func (f *fakeFollower) Register(ctx context.Context, _ *waldenv1.RegisterRequest) (*waldenv1.RegisterResponse, error) {
	return nil, f.notLeader(ctx)
}

func (f *fakeFollower) RenewLease(ctx context.Context, _ *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	return nil, f.notLeader(ctx)
}

func (f *fakeFollower) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// serveAgent serves srv on a free loopback port until the test ends.
func serveAgent(t testing.TB, srv waldenv1.AgentServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	waldenv1.RegisterAgentServer(gs, srv)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

// closedAddr is a loopback address nobody listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// eventually polls cond every few milliseconds until it returns nil or the
// deadline passes.
func eventually(t *testing.T, deadline time.Duration, what string, cond func() error) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s: %v", what, deadline, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
