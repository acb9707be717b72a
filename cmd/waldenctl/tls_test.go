package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	waldenv1 "walden/proto/walden/v1"
)

// writeCert writes a certificate for 127.0.0.1 signed by parent (self-signed
// CA when parent is nil) and returns it with its key.
func writeCert(t *testing.T, dir, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, serial int64) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name, Organization: []string{"walden:coordinator"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, name+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func TestMutualTLSFlags(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := writeCert(t, dir, "ca", nil, nil, 1)
	writeCert(t, dir, "member", ca, caKey, 2)
	p := func(name string) string { return filepath.Join(dir, name) }

	kp, err := tls.LoadX509KeyPair(p("member.pem"), p("member-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{kp}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})))
	waldenv1.RegisterClusterServer(s, &fakeCluster{status: sampleStatus()})
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	addr := l.Addr().String()

	code, out, errOut := runCtl(t, "--endpoints", addr, "--cacert", p("ca.pem"), "--cert", p("member.pem"), "--key", p("member-key.pem"), "status")
	if code != 0 || !strings.Contains(out, "demo") {
		t.Fatalf("mTLS status: exit %d %s %s", code, out, errOut)
	}
	code, _, errOut = runCtl(t, "--endpoints", addr, "--cacert", p("ca.pem"), "--timeout", "2s", "status")
	if code != exitDenied || !strings.HasPrefix(errOut, "waldenctl: ") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("without client cert: exit %d %q", code, errOut)
	}
	code, _, errOut = runCtl(t, "--endpoints", addr, "--timeout", "2s", "status")
	if code != exitUnavailable || !strings.HasPrefix(errOut, "waldenctl: ") {
		t.Fatalf("plaintext to a TLS member: exit %d %q", code, errOut)
	}
}
