package main

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	waldenv1 "walden/proto/walden/v1"
)

// TestExitCodes is the exit status table (docs/waldenctl.md#exit-codes):
// each kind of failure, on the command line and from the cluster, ends
// with its own status, in the table's form and in -o json.
func TestExitCodes(t *testing.T) {
	var answer error
	f := &fakeCluster{status: sampleStatus(), transfer: func(*waldenv1.LeaderTransferRequest) (*waldenv1.LeaderTransferResponse, error) {
		if answer != nil {
			return nil, answer
		}
		return &waldenv1.LeaderTransferResponse{LeaderId: "c2", Term: 4}, nil
	}}
	addr := serveFake(t, f)
	for _, tc := range []struct {
		name   string
		answer error
		args   []string
		want   int
		reason string
	}{
		{"success", nil, []string{"leader", "transfer", "c2"}, exitOK, ""},
		{"unknown command", nil, []string{"leadr"}, exitUsage, ""},
		{"unknown flag", nil, []string{"status", "--endpoint", addr}, exitUsage, ""},
		{"missing argument", nil, []string{"leader", "transfer"}, exitUsage, ""},
		{"bad flag value", nil, []string{"status", "--timeout", "0s"}, exitUsage, ""},
		{"invalid argument", refusedWith(codes.InvalidArgument, "INVALID_ARGUMENT", "id: must not be empty", nil), []string{"leader", "transfer", "c2"}, exitUsage, "INVALID_ARGUMENT"},
		{"no leader", refusedWith(codes.Unavailable, "NO_LEADER", "no leader", nil), []string{"leader", "transfer", "c2"}, exitUnavailable, "NO_LEADER"},
		{"refused", refusedWith(codes.FailedPrecondition, "NOT_VOTER", "c2 is a learner", nil), []string{"leader", "transfer", "c2"}, exitRefused, "NOT_VOTER"},
		{"conflict", refusedWith(codes.AlreadyExists, "MEMBER_EXISTS", "exists", nil), []string{"leader", "transfer", "c2"}, exitRefused, "MEMBER_EXISTS"},
		{"not found", refusedWith(codes.NotFound, "MEMBER_NOT_FOUND", "unknown member", nil), []string{"leader", "transfer", "c9"}, exitNotFound, "MEMBER_NOT_FOUND"},
		{"permission denied", refusedWith(codes.PermissionDenied, "PERMISSION_DENIED", "reader may not", nil), []string{"leader", "transfer", "c2"}, exitDenied, "PERMISSION_DENIED"},
		{"unauthenticated", refusedWith(codes.Unauthenticated, "UNAUTHENTICATED", "no certificate", nil), []string{"leader", "transfer", "c2"}, exitDenied, "UNAUTHENTICATED"},
		{"internal", refusedWith(codes.Internal, "", "boom", nil), []string{"leader", "transfer", "c2"}, exitError, ""},
	} {
		answer = tc.answer
		args := append([]string{"--endpoints", addr}, tc.args...)
		code, _, errOut := runCtl(t, args...)
		if code != tc.want {
			t.Errorf("%s: exit %d, want %d (%q)", tc.name, code, tc.want, errOut)
			continue
		}
		if tc.want == exitOK {
			continue
		}
		if !strings.HasPrefix(errOut, "waldenctl: ") {
			t.Errorf("%s: stderr %q", tc.name, errOut)
		}
		code, _, errOut = runCtl(t, append(args, "-o", "json")...)
		var doc struct {
			Error callError `json:"error"`
		}
		if err := json.Unmarshal([]byte(errOut), &doc); err != nil || code != tc.want || doc.Error.Exit != tc.want || doc.Error.Reason != tc.reason {
			t.Errorf("%s -o json: exit %d %v %q, want exit_code %d reason %q", tc.name, code, err, errOut, tc.want, tc.reason)
		}
		if doc.Error.MaybeDone {
			t.Errorf("%s: the cluster answered, yet the error says the request may have been carried out: %q", tc.name, errOut)
		}
	}
}

// TestTimeoutOfAChangeSaysHowToCheck: a request that changes something
// and gets no answer in time exits 3 and says that it may or may not have
// been carried out, and the command that tells; a read that times out
// says nothing of the kind.
func TestTimeoutOfAChangeSaysHowToCheck(t *testing.T) {
	eps := silentEndpoint(t)
	for _, tc := range []struct {
		args  []string
		check string
	}{
		{[]string{"leader", "transfer", "c2"}, "check with: waldenctl status"},
		{[]string{"maintenance", "on", "b1", "--reason", "x"}, "check with: waldenctl broker b1"},
		{[]string{"failover", "b1", "--reason", "x", "--wait", "300ms"}, "check with: waldenctl failover show b1"},
		{[]string{"cancel", "job-b1-4"}, "check with: waldenctl job job-b1-4"},
		{[]string{"member", "remove", "c3"}, "check with: waldenctl member list"},
	} {
		code, _, errOut := runCtl(t, append([]string{"--endpoints", eps, "--timeout", "300ms"}, tc.args...)...)
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if code != exitUnavailable || len(lines) != 2 || !strings.Contains(lines[0], "no answer within 300ms") ||
			!strings.HasSuffix(lines[0], "the request may or may not have been carried out") || lines[1] != tc.check {
			t.Errorf("%v: exit %d %q", tc.args, code, errOut)
		}
		code, _, errOut = runCtl(t, append([]string{"--endpoints", eps, "--timeout", "300ms", "-o", "json"}, tc.args...)...)
		var doc struct {
			Error callError `json:"error"`
		}
		if err := json.Unmarshal([]byte(errOut), &doc); err != nil || code != exitUnavailable || !doc.Error.MaybeDone || doc.Error.Hint != tc.check {
			t.Errorf("%v -o json: exit %d %v %q", tc.args, code, err, errOut)
		}
	}
	code, _, errOut := runCtl(t, "--endpoints", eps, "--timeout", "300ms", "brokers")
	if code != exitUnavailable || strings.Contains(errOut, "carried out") {
		t.Errorf("a read: exit %d %q", code, errOut)
	}
}
