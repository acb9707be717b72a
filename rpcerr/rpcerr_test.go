package rpcerr_test

import (
	"errors"
	"fmt"
	"go/build"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/internal/testutil"
	"walden/refusal"
	"walden/rpcerr"
)

func TestEveryReasonHasACode(t *testing.T) {
	seen := map[refusal.Reason]bool{}
	for _, info := range refusal.Reasons {
		r := info.Reason
		if strings.TrimSpace(info.Meaning) == "" {
			t.Errorf("%s has no meaning", r)
		}
		if seen[r] {
			t.Errorf("%s listed twice in refusal.Reasons", r)
		}
		seen[r] = true
		if rpcerr.Code(r) == codes.Internal {
			t.Errorf("%s has no code in the table", r)
		}
		if strings.ToUpper(string(r)) != string(r) || strings.ContainsAny(string(r), " :") {
			t.Errorf("%q is not an upper-case REASON", r)
		}
	}
}

// TestRefusalsTableInDocs keeps docs/refusals.md's table the table of
// this package.
func TestRefusalsTableInDocs(t *testing.T) {
	testutil.GeneratedSection(t, "../docs/refusals.md", "refusals", "rpcerr", rpcerr.MarkdownTable())
}

func TestStatus(t *testing.T) {
	cases := []struct {
		err  error
		code codes.Code
	}{
		{refusal.ErrEpochExpired, codes.FailedPrecondition},
		{refusal.ErrNodeFenced, codes.FailedPrecondition},
		{refusal.ErrUnknownNode, codes.NotFound},
		{refusal.ErrStreamNotClosed, codes.FailedPrecondition},
		{refusal.ErrStreamNotOpened, codes.FailedPrecondition},
		{refusal.ErrOffsetMismatch, codes.FailedPrecondition},
		{refusal.ErrNotOwner, codes.FailedPrecondition},
		{refusal.ErrStaleAttempt, codes.FailedPrecondition},
		{refusal.ErrJobNotRunning, codes.FailedPrecondition},
		{refusal.ErrRecoveryRunning, codes.FailedPrecondition},
		{refusal.ErrUnknownStream, codes.NotFound},
		{refusal.ErrUnknownJob, codes.NotFound},
		{refusal.ErrMaintenance, codes.FailedPrecondition},
		{refusal.ErrInvalidArgument, codes.InvalidArgument},
		{refusal.ErrLeaseNotExpired, codes.FailedPrecondition},
		{refusal.ErrDecidedInAnotherTerm, codes.Aborted},
		{refusal.ErrStaleObservation, codes.Aborted},
		{refusal.ErrFailoverRequested, codes.FailedPrecondition},
		{refusal.ErrLeaseAttested, codes.FailedPrecondition},
		{refusal.ErrRestoreReconciling, codes.FailedPrecondition},
	}
	for _, c := range cases {
		reason := refusal.Of(c.err)
		t.Run(string(reason), func(t *testing.T) {
			wrapped := fmt.Errorf("commit object o1: %w", c.err)
			if got := refusal.Of(wrapped); got != reason {
				t.Fatalf("refusal.Of = %q, want %q", got, reason)
			}
			if got := refusal.Sentinel(reason); !errors.Is(got, c.err) {
				t.Fatalf("Sentinel(%q) = %v", reason, got)
			}
			st := rpcerr.Status(refusal.WithMetadata(wrapped, map[string]string{"broker_id": "b1"}))
			if st.Code() != c.code {
				t.Fatalf("code = %v, want %v", st.Code(), c.code)
			}
			if want := string(reason) + ": commit object o1: "; !strings.HasPrefix(st.Message(), want) {
				t.Fatalf("message %q does not start with %q", st.Message(), want)
			}
			var info *errdetails.ErrorInfo
			for _, d := range st.Details() {
				if i, ok := d.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
			if info == nil || info.GetReason() != string(reason) || info.GetDomain() != rpcerr.Domain || info.GetMetadata()["broker_id"] != "b1" {
				t.Fatalf("ErrorInfo = %v", info)
			}
			if got := rpcerr.Reason(st.Err()); got != reason {
				t.Fatalf("Reason = %q, want %q", got, reason)
			}
			if got := rpcerr.Metadata(st.Err())["broker_id"]; got != "b1" {
				t.Fatalf("Metadata broker_id = %q", got)
			}
		})
	}
	if rpcerr.Status(nil) != nil || rpcerr.Err(nil) != nil {
		t.Fatal("Status(nil) or Err(nil) is not nil")
	}
	if st := rpcerr.Status(errors.New("disk on fire")); st.Code() != codes.Unknown {
		t.Fatalf("plain error code = %v", st.Code())
	}
	if st := rpcerr.Status(status.Error(codes.Unavailable, "not leader")); st.Code() != codes.Unavailable {
		t.Fatalf("status error code = %v", st.Code())
	}
	if got := refusal.Of(errors.New("x")); got != "" {
		t.Fatalf("refusal.Of a plain error = %q", got)
	}
	if got := rpcerr.Reason(status.Error(codes.Internal, "x")); got != "" {
		t.Fatalf("Reason without detail = %q", got)
	}
	if got := rpcerr.Reason(errors.New("x")); got != "" {
		t.Fatalf("Reason of a plain error = %q", got)
	}
	if refusal.Sentinel("NOPE") != nil || refusal.Sentinel(refusal.LeaseInvalid) != nil {
		t.Fatal("Sentinel of a reason that has no sentinel")
	}
}

func TestNew(t *testing.T) {
	err := rpcerr.New(refusal.NotOwner, "stream 7 is owned by b2", map[string]string{"owner_addr": "127.0.0.1:1"})
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != "NOT_OWNER: stream 7 is owned by b2" {
		t.Fatalf("New = %v %q", st.Code(), st.Message())
	}
	if rpcerr.Reason(err) != refusal.NotOwner || rpcerr.Metadata(err)["owner_addr"] != "127.0.0.1:1" {
		t.Fatalf("decoded %q %v", rpcerr.Reason(err), rpcerr.Metadata(err))
	}
	plain := rpcerr.NewPlain(refusal.MemberExists, "member c4 exists", nil)
	if st := status.Convert(plain); st.Code() != codes.AlreadyExists || st.Message() != "member c4 exists" || rpcerr.Reason(plain) != refusal.MemberExists {
		t.Fatalf("NewPlain = %v %q %q", st.Code(), st.Message(), rpcerr.Reason(plain))
	}
	// Older members answered the cluster's refusals in domain walden.v1.
	old, _ := status.New(codes.Unavailable, "no leader").WithDetails(&errdetails.ErrorInfo{Reason: "NO_LEADER", Domain: "walden.v1"})
	if got := rpcerr.Reason(old.Err()); got != refusal.NoLeader {
		t.Fatalf("Reason of an older member's answer = %q", got)
	}
	other, _ := status.New(codes.Unavailable, "x").WithDetails(&errdetails.ErrorInfo{Reason: "NO_LEADER", Domain: "example.com"})
	if got := rpcerr.Reason(other.Err()); got != "" {
		t.Fatalf("Reason of another domain's detail = %q", got)
	}
}

// TestRefusalsKnowNoTransport: the refusals, the fencing rule and the
// replicated state machine never import gRPC themselves; only this
// package turns their refusals into codes.
func TestRefusalsKnowNoTransport(t *testing.T) {
	for _, pkg := range []string{"walden/refusal", "walden/fencing", "walden/fsm", "walden/policy", "walden/producer"} {
		p, err := build.Import(pkg, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, "google.golang.org/grpc") || strings.HasPrefix(imp, "google.golang.org/genproto") {
				t.Errorf("%s imports %s", pkg, imp)
			}
		}
	}
}

// A status split into its parts and joined again reads back the same: the
// code, the message, the reason and its metadata.
func TestSplitJoin(t *testing.T) {
	cases := []error{
		rpcerr.New(refusal.NodeFenced, "broker b1 epoch 3 is fenced", map[string]string{"epoch": "4"}),
		fmt.Errorf("renewal: %w", refusal.ErrFailoverRequested),
		status.Error(codes.Unavailable, "lease not granted: c2 is not a voting member"),
		errors.New("plain"),
	}
	for _, err := range cases {
		p := rpcerr.Split(err)
		back := rpcerr.Join(p)
		want := rpcerr.Status(err)
		got := status.Convert(back)
		if got.Code() != want.Code() || got.Message() != want.Message() {
			t.Errorf("%v: joined %v %q, want %v %q", err, got.Code(), got.Message(), want.Code(), want.Message())
		}
		if rpcerr.Reason(back) != rpcerr.Reason(want.Err()) || fmt.Sprint(rpcerr.Metadata(back)) != fmt.Sprint(rpcerr.Metadata(want.Err())) {
			t.Errorf("%v: joined reason %q %v, want %q %v", err, rpcerr.Reason(back), rpcerr.Metadata(back), rpcerr.Reason(want.Err()), rpcerr.Metadata(want.Err()))
		}
	}
	if rpcerr.Join(rpcerr.Split(nil)) != nil {
		t.Fatal("nil split and joined is not nil")
	}
}
