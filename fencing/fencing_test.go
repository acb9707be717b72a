package fencing_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/fencing"
)

func TestCheck(t *testing.T) {
	cases := []struct {
		name      string
		current   fencing.Token
		fenced    bool
		presented fencing.Token
		want      error
	}{
		{"current epoch", 7, false, 7, nil},
		{"older epoch", 7, false, 6, fencing.ErrEpochExpired},
		{"newer epoch than issued", 7, false, 8, fencing.ErrEpochExpired},
		{"fenced, old epoch", 8, true, 7, fencing.ErrNodeFenced},
		{"fenced, current epoch", 8, true, 8, fencing.ErrNodeFenced},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := fencing.Check(c.current, c.fenced, c.presented)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Check = %v, want %v", err, c.want)
			}
		})
	}
}

func TestGuard(t *testing.T) {
	var g fencing.Guard
	if _, ok := g.Highest("s"); ok {
		t.Fatal("empty guard has a highest token")
	}
	for _, step := range []struct {
		res  string
		tok  fencing.Token
		want error
	}{
		{"a", 3, nil}, {"a", 3, nil}, {"a", 5, nil}, {"a", 4, fencing.ErrEpochExpired},
		{"b", 1, nil}, {"a", 5, nil}, {"b", 0, fencing.ErrEpochExpired},
	} {
		err := g.Check(step.res, step.tok)
		if (step.want == nil) != (err == nil) || (step.want != nil && !errors.Is(err, step.want)) {
			t.Fatalf("Check(%q, %d) = %v, want %v", step.res, step.tok, err, step.want)
		}
	}
	if h, _ := g.Highest("a"); h != 5 {
		t.Fatalf("Highest(a) = %d, want 5", h)
	}
}

// TestGuardConcurrent checks under -race that concurrent checks never let a
// token below the highest accepted one through after it was accepted.
func TestGuardConcurrent(t *testing.T) {
	var g fencing.Guard
	const workers, perWorker = 8, 200
	var wg sync.WaitGroup
	accepted := make([][]fencing.Token, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				tok := fencing.Token(i*workers + w)
				if g.Check("r", tok) == nil {
					accepted[w] = append(accepted[w], tok)
				}
			}
		}()
	}
	wg.Wait()
	top, _ := g.Highest("r")
	if top != workers*perWorker-1 {
		t.Fatalf("Highest = %d, want %d", top, workers*perWorker-1)
	}
	for w, toks := range accepted {
		for i := 1; i < len(toks); i++ {
			if toks[i] < toks[i-1] {
				t.Fatalf("worker %d accepted %d after %d", w, toks[i], toks[i-1])
			}
		}
	}
	if err := g.Check("r", top-1); !errors.Is(err, fencing.ErrEpochExpired) {
		t.Fatalf("Check below highest = %v", err)
	}
}

func TestGRPCStatus(t *testing.T) {
	cases := []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{fencing.ErrEpochExpired, codes.FailedPrecondition, "EPOCH_EXPIRED"},
		{fencing.ErrNodeFenced, codes.FailedPrecondition, "NODE_FENCED"},
		{fencing.ErrUnknownNode, codes.NotFound, "UNKNOWN_NODE"},
		{fencing.ErrStreamNotClosed, codes.FailedPrecondition, "STREAM_NOT_CLOSED"},
		{fencing.ErrStreamNotOpened, codes.FailedPrecondition, "STREAM_NOT_OPENED"},
		{fencing.ErrOffsetMismatch, codes.FailedPrecondition, "OFFSET_MISMATCH"},
		{fencing.ErrNotOwner, codes.FailedPrecondition, "NOT_OWNER"},
		{fencing.ErrStaleAttempt, codes.FailedPrecondition, "STALE_ATTEMPT"},
		{fencing.ErrJobNotRunning, codes.FailedPrecondition, "JOB_NOT_RUNNING"},
		{fencing.ErrRecoveryRunning, codes.FailedPrecondition, "RECOVERY_RUNNING"},
		{fencing.ErrUnknownStream, codes.NotFound, "STREAM_NOT_FOUND"},
		{fencing.ErrUnknownJob, codes.NotFound, "JOB_NOT_FOUND"},
		{fencing.ErrMaintenance, codes.FailedPrecondition, "MAINTENANCE"},
		{fencing.ErrInvalidArgument, codes.InvalidArgument, "INVALID_ARGUMENT"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			wrapped := fmt.Errorf("fsm: commit object o1: %w", c.err)
			if got := fencing.Reason(wrapped); got != c.reason {
				t.Fatalf("Reason = %q, want %q", got, c.reason)
			}
			if got := fencing.FromReason(c.reason); !errors.Is(got, c.err) {
				t.Fatalf("FromReason(%q) = %v", c.reason, got)
			}
			st := fencing.GRPCStatus(fencing.WithMetadata(wrapped, map[string]string{"broker_id": "b1"}))
			if st.Code() != c.code {
				t.Fatalf("code = %v, want %v", st.Code(), c.code)
			}
			if want := c.reason + ": "; len(st.Message()) < len(want) || st.Message()[:len(want)] != want {
				t.Fatalf("message %q does not start with %q", st.Message(), want)
			}
			var info *errdetails.ErrorInfo
			for _, d := range st.Details() {
				if i, ok := d.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
			if info == nil || info.GetReason() != c.reason || info.GetDomain() != "walden" || info.GetMetadata()["broker_id"] != "b1" {
				t.Fatalf("ErrorInfo = %v", info)
			}
			if got := fencing.ReasonFromStatus(st.Err()); got != c.reason {
				t.Fatalf("ReasonFromStatus = %q, want %q", got, c.reason)
			}
		})
	}
	if fencing.GRPCStatus(nil) != nil {
		t.Fatal("GRPCStatus(nil) != nil")
	}
	if st := fencing.GRPCStatus(errors.New("disk on fire")); st.Code() != codes.Unknown {
		t.Fatalf("plain error code = %v", st.Code())
	}
	if st := fencing.GRPCStatus(status.Error(codes.Unavailable, "not leader")); st.Code() != codes.Unavailable {
		t.Fatalf("status error code = %v", st.Code())
	}
	if got := fencing.Reason(errors.New("x")); got != "" {
		t.Fatalf("Reason of a plain error = %q", got)
	}
	if got := fencing.ReasonFromStatus(status.Error(codes.Internal, "x")); got != "" {
		t.Fatalf("ReasonFromStatus without detail = %q", got)
	}
	if fencing.FromReason("NOPE") != nil {
		t.Fatal("FromReason of an unknown reason")
	}
}
