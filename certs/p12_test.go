package certs

import (
	"crypto"
	"errors"
	"os"
	"path/filepath"
	"testing"

	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"walden/authz"
)

func TestP12HoldsTheCertificateKeyAndCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := Init(dir, "test CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	files, err := IssueFiles(dir, "", Request{Identity: authz.Identity{Name: "alice", Role: authz.RoleReader}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "alice.p12")
	if err := WriteP12(dir, files, path, "short"); !errors.Is(err, ErrP12Password) {
		t.Fatalf("a short passphrase: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a refused bundle was written: %v", err)
	}
	if err := WriteP12(dir, files, path, "correct horse battery"); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("bundle: %v, mode %v (it holds a private key)", err, st.Mode())
	}
	if err := WriteP12(dir, files, path, "correct horse battery"); !errors.Is(err, ErrExists) {
		t.Fatalf("a second bundle over the first: %v", err)
	}
	b, _ := os.ReadFile(path)
	if _, _, _, err := pkcs12.DecodeChain(b, "wrong passphrase"); err == nil {
		t.Fatal("the bundle opened with a wrong passphrase")
	}
	key, cert, chain, err := pkcs12.DecodeChain(b, "correct horse battery")
	if err != nil {
		t.Fatal(err)
	}
	id, err := authz.FromCertificate(cert)
	if err != nil || id.Name != "alice" || id.Role != authz.RoleReader {
		t.Fatalf("identity %v %v", id, err)
	}
	if !publicKeysEqual(key.(crypto.Signer).Public(), cert.PublicKey) {
		t.Fatal("the bundle's key is not the certificate's")
	}
	if len(chain) != 1 || !chain[0].Equal(ca.Cert) {
		t.Fatalf("chain %d certificates, want the CA", len(chain))
	}
}
