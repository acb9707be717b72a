package main

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"walden/authz"
	"walden/certs"
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

// issueFiles issues a certificate of ca for id into dir and returns the
// certificate and key files.
func issueFiles(t *testing.T, ca *certs.CA, dir string, id authz.Identity) (cert, key string) {
	t.Helper()
	c, k, err := ca.Issue(certs.Request{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, id.Name+".pem"), filepath.Join(dir, id.Name+"-key.pem")
	if err := os.WriteFile(cert, c, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, k, 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// serveTLS serves the fake cluster with the certificate of id (issued by
// ca), requiring client certificates of ca.
func serveTLS(t *testing.T, ca *certs.CA, dir string, id authz.Identity) string {
	t.Helper()
	certFile, keyFile := issueFiles(t, ca, dir, id)
	kp, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{kp}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})))
	waldenv1.RegisterClusterServer(s, &fakeCluster{status: sampleStatus()})
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// TestTLSRefusalsSayWhoRefusedWhom is findings 4 and 8 of the hardening
// table as waldenctl shows them: a member whose certificate is a broker's
// is refused (waldenctl checked the CA and the host name only), and a
// client certificate of another CA reads as the coordinator refusing it
// (it read "write tcp ...: broken pipe").
func TestTLSRefusalsSayWhoRefusedWhom(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA("cluster CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA("another CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	aliceCert, aliceKey := issueFiles(t, ca, dir, authz.Identity{Name: "alice", Role: authz.RoleOperator})
	malloryCert, malloryKey := issueFiles(t, other, dir, authz.Identity{Name: "mallory", Role: authz.RoleOperator})
	coord := serveTLS(t, ca, dir, authz.Identity{Name: "c1", Role: authz.RoleCoordinator})
	posing := serveTLS(t, ca, dir, authz.Identity{Name: "b1", Role: authz.RoleBroker, BrokerID: "b1"})

	if code, _, errOut := runCtl(t, "--endpoints", coord, "--cacert", caFile, "--cert", aliceCert, "--key", aliceKey, "status"); code != exitOK {
		t.Fatalf("status from a coordinator: exit %d %q", code, errOut)
	}
	for _, tc := range []struct {
		name, endpoint, cert, key, want string
	}{
		{"a broker's certificate posing as a coordinator", posing, aliceCert, aliceKey,
			`this client refused the coordinator at ` + posing + `: its certificate is "b1" (broker of broker b1), not a coordinator's`},
		{"a client certificate of another CA", coord, malloryCert, malloryKey,
			`the coordinator at ` + coord + ` refused this client's certificate: it was not signed by the CA the coordinator trusts`},
	} {
		code, _, errOut := runCtl(t, "--endpoints", tc.endpoint, "--cacert", caFile, "--cert", tc.cert, "--key", tc.key, "--timeout", "5s", "status")
		if code != exitDenied || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "broken pipe") || strings.Contains(errOut, "TLS said") {
			t.Errorf("%s: exit %d stderr %q, want exit %d saying %q", tc.name, code, errOut, exitDenied, tc.want)
		}
	}
}
