package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"walden/config"
)

// testPKI writes a CA and one certificate signed by it (valid for
// 127.0.0.1 and localhost, usable as server and client certificate), and a
// second CA that signed nothing, into dir.
type testPKI struct {
	CA, Cert, Key, OtherCA, OtherCert, OtherKey string
}

func newTestPKI(t *testing.T, dir string) testPKI {
	t.Helper()
	p := testPKI{
		CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "member.pem"), Key: filepath.Join(dir, "member-key.pem"),
		OtherCA: filepath.Join(dir, "other-ca.pem"), OtherCert: filepath.Join(dir, "other.pem"), OtherKey: filepath.Join(dir, "other-key.pem"),
	}
	caCert, caKey := writeCA(t, p.CA, "walden test CA")
	writeLeaf(t, p.Cert, p.Key, caCert, caKey)
	otherCert, otherKey := writeCA(t, p.OtherCA, "unrelated CA")
	writeLeaf(t, p.OtherCert, p.OtherKey, otherCert, otherKey)
	return p
}

func (p testPKI) config() config.TLS {
	return config.TLS{CertFile: p.Cert, KeyFile: p.Key, CAFile: p.CA}
}

var serial int64

func nextSerial() *big.Int { serial++; return big.NewInt(serial) }

func writeCA(t *testing.T, path, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "CERTIFICATE", der)
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func writeLeaf(t *testing.T, certPath, keyPath string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: "member"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, certPath, "CERTIFICATE", der)
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, keyPath, "EC PRIVATE KEY", kb)
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadTLSErrors(t *testing.T) {
	p := newTestPKI(t, t.TempDir())
	if s, err := loadTLS(config.TLS{}); err != nil || s.enabled() {
		t.Fatalf("no tls: %v %v", s, err)
	}
	if s, err := loadTLS(p.config()); err != nil || !s.enabled() {
		t.Fatalf("tls: %v %v", s, err)
	}
	bad := p.config()
	bad.CAFile = p.Key // no certificate in it
	if _, err := loadTLS(bad); err == nil {
		t.Fatal("a key file accepted as CA")
	}
	bad = p.config()
	bad.KeyFile = p.OtherKey // does not match the cert
	if _, err := loadTLS(bad); err == nil {
		t.Fatal("mismatched key accepted")
	}
}
