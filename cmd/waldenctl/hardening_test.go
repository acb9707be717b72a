package main

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	waldenv1 "walden/proto/walden/v1"
)

// TestRefusalSaysPermissionDeniedOnce is part of finding 8 of the
// hardening table: a refusal read "permission denied: the role of your
// certificate does not allow this: permission denied: ...". The
// coordinator's sentence says who may not do what; waldenctl says
// "permission denied" once before it.
func TestRefusalSaysPermissionDeniedOnce(t *testing.T) {
	const msg = `permission denied: "grafana" (reader) may not call /walden.v1.Cluster/LeaderTransfer: it needs the role operator or admin`
	f := &fakeCluster{status: sampleStatus(), transfer: func(*waldenv1.LeaderTransferRequest) (*waldenv1.LeaderTransferResponse, error) {
		return nil, refusedWith(codes.PermissionDenied, "PERMISSION_DENIED", msg, nil)
	}}
	addr := serveFake(t, f)
	code, _, errOut := runCtl(t, "--endpoints", addr, "leader", "transfer", "c2")
	if code != exitDenied || strings.Count(errOut, "permission denied") != 1 || !strings.Contains(errOut, "it needs the role operator or admin") {
		t.Fatalf("exit %d stderr %q: want permission denied said once, and the coordinator's reason", code, errOut)
	}
}
