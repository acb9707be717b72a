package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/renewframe"
	"walden/rpcerr"
)

// directRenewer renews one agent's lease with one coordinator over a
// connection of frames, as package agent's Renewer does on the wire —
// renewframe.Preface, then one RenewLeasesRequest frame a renewal and one
// RenewLeasesResponse frame an answer, matched by seq, the voters left out
// of an answer of the same configuration taken from the last that carried
// them — but in the renewing goroutine itself: no receiver goroutine, no
// channel between them, no timer per attempt (the connection's deadline
// bounds it). The coordinators see the same traffic; the load process
// spends less on each renewal, which is what lets one host simulate a
// large fleet (transport frames-direct).
//
// It differs from the Renewer where that costs nothing on the wire: an
// attempt that gets no answer in time closes the connection at once (the
// Renewer keeps it for one more attempt), since a read cut by its deadline
// may have taken part of a frame; and it never falls back to the gRPC
// stream or calls (the benchmark's coordinators all serve frames).
type directRenewer struct {
	addr string
	dial func(ctx context.Context, addr string) (net.Conn, error)

	conn net.Conn
	w    *renewframe.Writer
	r    *renewframe.Reader
	seq  uint64
	// voters and conf are the voters the connection sent last, and their
	// configuration's index.
	voters []*waldenv1.Voter
	conf   uint64
	answer waldenv1.RenewLeasesResponse
}

// Renew sends one renewal and waits for its answer for at most perTry, in
// the terms of a RenewLease call (the grant, or the refusal as its status
// error).
func (d *directRenewer) Renew(ctx context.Context, req *waldenv1.RenewLeaseRequest, perTry time.Duration) (*waldenv1.RenewLeaseResponse, error) {
	deadline := time.Now().Add(perTry)
	if d.conn == nil {
		if err := d.open(ctx, deadline); err != nil {
			return nil, err
		}
	}
	d.seq++
	_ = d.conn.SetDeadline(deadline)
	if err := d.w.Write(&waldenv1.RenewLeasesRequest{BrokerId: req.GetBrokerId(), Epoch: req.GetEpoch(), Seq: d.seq}); err != nil {
		return nil, d.failed(err)
	}
	for {
		a := &d.answer
		a.Reset()
		if err := d.r.Read(a); err != nil {
			return nil, d.failed(err)
		}
		// A grant that leaves the voters out means the voters the
		// connection sent last, whether or not anyone waits for it.
		if g := a.GetGrant(); g != nil {
			switch {
			case len(g.GetVoters()) > 0:
				d.voters, d.conf = g.GetVoters(), g.GetConfIndex()
			case g.GetConfIndex() == d.conf:
				g.Voters = d.voters
			}
		}
		if a.GetSeq() != d.seq && (a.GetSeq() != 0 || a.GetRefusal() == nil) {
			continue // the late answer of an attempt given up on
		}
		if f := a.GetRefusal(); f != nil {
			if codes.Code(f.GetCode()) == codes.PermissionDenied {
				d.Close() // the coordinator ends the connection after it
			}
			return nil, refusalError(f)
		}
		g := a.GetGrant()
		if g == nil {
			d.Close()
			return nil, status.Error(codes.Internal, "renewal: an answer with neither a grant nor a refusal")
		}
		return g, nil
	}
}

// refusalError is a coordinator's refusal in a frame, in the terms of a
// RenewLease call's (its gRPC status error, with the reason and metadata).
func refusalError(f *waldenv1.RenewalRefusal) error {
	return rpcerr.Join(rpcerr.Parts{Code: codes.Code(f.GetCode()), Message: f.GetMessage(),
		Reason: refusal.Reason(f.GetReason()), Metadata: f.GetMetadata()})
}

// open dials the connection and sends the preface, bounded by deadline.
func (d *directRenewer) open(ctx context.Context, deadline time.Time) error {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	conn, err := d.dial(dctx, d.addr)
	if err != nil {
		if dctx.Err() != nil {
			return status.Errorf(codes.DeadlineExceeded, "renewal: the connection to the coordinator at %s did not open in time", d.addr)
		}
		return status.Errorf(codes.Unavailable, "renewal: cannot connect to the coordinator at %s: connection error: %v", d.addr, err)
	}
	_ = conn.SetWriteDeadline(deadline)
	if _, err := io.WriteString(conn, renewframe.Preface); err != nil {
		_ = conn.Close()
		return status.Errorf(codes.Unavailable, "renewal: connection error: %v", err)
	}
	d.conn, d.seq, d.voters, d.conf = conn, 0, nil, 0
	d.w = renewframe.NewWriter(conn, renewframe.MaxRequest)
	d.r = renewframe.NewReader(conn, renewframe.MaxResponse)
	return nil
}

// failed closes the connection after err and says it as RenewLease's
// transport failures do (a deadline as DeadlineExceeded).
func (d *directRenewer) failed(err error) error {
	d.Close()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, "renewal: no answer from the coordinator in time")
	}
	return status.Errorf(codes.Unavailable, "renewal: connection error: %v", err)
}

// Close closes the connection; the next Renew opens another.
func (d *directRenewer) Close() {
	if d.conn != nil {
		_ = d.conn.Close()
		d.conn = nil
	}
}
