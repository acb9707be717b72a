package agent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"walden/authz"
	"walden/certs"
	"walden/config"
	"walden/internal/testutil/testpki"
	"walden/lease"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
)

// TestMutualTLS: with tls keys set the agent presents its certificate and
// checks the coordinator's against ca_file.
func TestMutualTLS(t *testing.T) {
	p := testpki.New(t)
	dir := p.Dir
	coord := p.Member(t, "c1")
	agentTLS := p.TLS(t, authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"})
	coordCert, coordKey, certFile, keyFile, caFile := coord.CertFile, coord.KeyFile, agentTLS.CertFile, agentTLS.KeyFile, p.CA
	cert, err := tls.LoadX509KeyPair(coordCert, coordKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
	})))
	c := &fakeCluster{ttl: testTTL, drift: testDrift, nextEpoch: 1, recoveredOffset: -1}
	f := &fakeCoord{c: c, id: "c1", addr: ln.Addr().String(), clock: lease.BootClock}
	c.coords = []*fakeCoord{f}
	waldenv1.RegisterAgentServer(gs, f)
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()

	cfg := testConfig(ln.Addr().String())
	cfg.TLS = config.TLS{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}
	a := startAgent(t, cfg, Options{})
	if l := waitRegistered(t, a); l.Epoch != 1 {
		t.Fatalf("lease %+v", l)
	}

	// Unusable files are refused by New.
	cfg = testConfig(ln.Addr().String())
	cfg.TLS = config.TLS{CertFile: certFile, KeyFile: keyFile, CAFile: certFile + ".missing"}
	if _, err := New(cfg, Options{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with a missing ca_file = %v", err)
	}
	// TLS on means gossip encrypted: without a gossip key beside ca_file
	// (nor one named), New refuses and says where it looked.
	bare := t.TempDir()
	caPEM, _ = os.ReadFile(caFile)
	os.WriteFile(filepath.Join(bare, "ca.pem"), caPEM, 0o644)
	cfg = testConfig(ln.Addr().String())
	cfg.TLS = config.TLS{CertFile: certFile, KeyFile: keyFile, CAFile: filepath.Join(bare, "ca.pem")}
	_, err = New(cfg, Options{})
	if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, mtls.ErrGossipKey) || !strings.Contains(err.Error(), filepath.Join(bare, "gossip.key")) ||
		strings.Count(err.Error(), filepath.Join(bare, "gossip.key")) != 1 {
		t.Fatalf("New without a gossip key = %v", err)
	}
	// A certificate of another broker, or of another role, is refused by
	// New, saying how to issue the right one.
	other, err := certs.IssueFiles(dir, "", certs.Request{Identity: authz.Identity{Name: "b2-agent", Role: authz.RoleAgent, BrokerID: "b2"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ cert, key string }{{other.Cert, other.Key}, {coordCert, coordKey}} {
		cfg = testConfig(ln.Addr().String())
		cfg.TLS = config.TLS{CertFile: tc.cert, KeyFile: tc.key, CAFile: caFile}
		_, err = New(cfg, Options{})
		if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, mtls.ErrWrongIdentity) || !strings.Contains(err.Error(), "--role agent --broker-id b1") {
			t.Fatalf("New with %s = %v", tc.cert, err)
		}
	}
}
