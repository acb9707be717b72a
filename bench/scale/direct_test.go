package main

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
	"walden/renewframe"
	"walden/rpcerr"
)

// frameCoordinator accepts connections of frames and answers each renewal
// with what answer returns for it (nil: no answer), counting connections
// opened and ended.
type frameCoordinator struct {
	ln     net.Listener
	conns  chan struct{}
	ended  chan struct{}
	answer func(conn int, m *waldenv1.RenewLeasesRequest) []*waldenv1.RenewLeasesResponse
}

func newFrameCoordinator(t *testing.T, answer func(conn int, m *waldenv1.RenewLeasesRequest) []*waldenv1.RenewLeasesResponse) *frameCoordinator {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &frameCoordinator{ln: ln, conns: make(chan struct{}, 100), ended: make(chan struct{}, 100), answer: answer}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for n := 1; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.conns <- struct{}{}
			go c.serve(t, n, conn)
		}
	}()
	return c
}

func (c *frameCoordinator) serve(t *testing.T, n int, conn net.Conn) {
	defer func() { c.ended <- struct{}{} }()
	defer conn.Close()
	pre := make([]byte, len(renewframe.Preface))
	if _, err := io.ReadFull(conn, pre); err != nil || string(pre) != renewframe.Preface {
		t.Errorf("connection %d did not start with the preface: %q, %v", n, pre, err)
		return
	}
	r := renewframe.NewReader(conn, renewframe.MaxRequest)
	w := renewframe.NewWriter(conn, renewframe.MaxResponse)
	for {
		m := &waldenv1.RenewLeasesRequest{}
		if err := r.Read(m); err != nil {
			return
		}
		for _, a := range c.answer(n, m) {
			if err := w.Write(a); err != nil {
				return
			}
		}
	}
}

func grantOf(seq, conf uint64, voters ...string) *waldenv1.RenewLeasesResponse {
	g := &waldenv1.RenewLeaseResponse{CoordinatorId: "c1", LeaseTtlMs: 3000, ConfIndex: conf}
	for _, v := range voters {
		g.Voters = append(g.Voters, &waldenv1.Voter{Id: v})
	}
	return &waldenv1.RenewLeasesResponse{Seq: seq, Grant: g}
}

// TestDirectRenewer renews as package agent's Renewer does on the wire:
// the voters an answer leaves out are the connection's last, a late answer
// is skipped by its seq, a refusal keeps its reason, and an attempt without
// an answer in time fails with DeadlineExceeded and the next one opens a
// new connection.
func TestDirectRenewer(t *testing.T) {
	c := newFrameCoordinator(t, func(conn int, m *waldenv1.RenewLeasesRequest) []*waldenv1.RenewLeasesResponse {
		if m.GetBrokerId() != "b1" || m.GetEpoch() != 7 {
			t.Errorf("renewal %+v, want broker b1 at epoch 7", m)
		}
		switch {
		case conn == 1 && m.GetSeq() == 1:
			return []*waldenv1.RenewLeasesResponse{grantOf(1, 5, "c1", "c2", "c3")}
		case conn == 1 && m.GetSeq() == 2: // a late answer with new voters first, then this one without them
			return []*waldenv1.RenewLeasesResponse{grantOf(1, 6, "c1", "c2", "c4", "c5"), grantOf(2, 6)}
		case conn == 1 && m.GetSeq() == 3:
			return []*waldenv1.RenewLeasesResponse{{Seq: 3, Refusal: &waldenv1.RenewalRefusal{
				Code: uint32(codes.FailedPrecondition), Message: "fenced", Reason: "NODE_FENCED"}}}
		case conn == 1:
			return nil // no answer: the attempt times out
		default:
			return []*waldenv1.RenewLeasesResponse{grantOf(m.GetSeq(), 7, "c1", "c2")}
		}
	})
	dialer := &net.Dialer{}
	d := &directRenewer{addr: c.ln.Addr().String(), dial: func(ctx context.Context, addr string) (net.Conn, error) {
		return dialer.DialContext(ctx, "tcp", addr)
	}}
	defer d.Close()
	ctx := context.Background()
	req := &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: 7}

	g, err := d.Renew(ctx, req, 5*time.Second)
	if err != nil || len(g.GetVoters()) != 3 {
		t.Fatalf("first renewal: %v, %v; want a grant with 3 voters", g, err)
	}
	g, err = d.Renew(ctx, req, 5*time.Second)
	if err != nil || g.GetConfIndex() != 6 || len(g.GetVoters()) != 4 {
		t.Fatalf("second renewal: %v, %v; want the grant of seq 2 with the 4 voters the connection sent last", g, err)
	}
	if _, err = d.Renew(ctx, req, 5*time.Second); string(rpcerr.Reason(err)) != "NODE_FENCED" {
		t.Fatalf("third renewal: %v; want the refusal NODE_FENCED", err)
	}
	if _, err = d.Renew(ctx, req, 200*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("an unanswered renewal: %v; want DeadlineExceeded", err)
	}
	g, err = d.Renew(ctx, req, 5*time.Second)
	if err != nil || g.GetConfIndex() != 7 || len(g.GetVoters()) != 2 {
		t.Fatalf("the renewal after a timeout: %v, %v; want a grant of configuration 7 over a new connection", g, err)
	}
	if got := len(c.conns); got != 2 {
		t.Fatalf("%d connections opened; want 2 (one more after the timeout)", got)
	}
}
