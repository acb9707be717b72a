package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"walden/certs"
	"walden/config"
	"walden/lease"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
)

// testPKI writes a CA and one certificate for 127.0.0.1 (server and client
// use) to dir and returns the file names.
func testPKI(t *testing.T, dir string) (certFile, keyFile, caFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "walden test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "member"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gossipKey, err := certs.NewGossipKey() // beside the CA, as walden certs init leaves it
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gossip.key"), gossipKey, 0o600); err != nil {
		t.Fatal(err)
	}
	return write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER), write("ca.pem", "CERTIFICATE", caDER)
}

// TestMutualTLS: with tls keys set the agent presents its certificate and
// checks the coordinator's against ca_file.
func TestMutualTLS(t *testing.T) {
	certFile, keyFile, caFile := testPKI(t, t.TempDir())
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
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
}
