package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"walden/authz"
	"walden/certs"
	"walden/config"
	"walden/mtls"
)

// testPKI is a CA made by package certs in a directory, the certificates
// it issued there, and a second CA with a certificate of its own (whose
// role does not matter: the cluster's CA never signed it).
type testPKI struct {
	Dir, CA, OtherCA, OtherCert, OtherKey string
}

func newTestPKI(t *testing.T, dir string) testPKI {
	t.Helper()
	if _, err := certs.Init(dir, "walden test CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if _, err := certs.Init(other, "unrelated CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	f, err := certs.IssueFiles(other, "", certs.Request{Identity: authz.Identity{Name: "intruder", Role: authz.RoleAdmin}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return testPKI{Dir: dir, CA: filepath.Join(dir, certs.CAFile), OtherCA: filepath.Join(other, certs.CAFile), OtherCert: f.Cert, OtherKey: f.Key}
}

// tls returns the tls section of id's certificate, issuing it on first use.
func (p testPKI) tls(t *testing.T, id authz.Identity) config.TLS {
	t.Helper()
	c := config.TLS{CertFile: filepath.Join(p.Dir, id.Name+".pem"), KeyFile: filepath.Join(p.Dir, id.Name+"-key.pem"), CAFile: p.CA}
	if _, err := os.Stat(c.CertFile); err == nil {
		return c
	}
	if _, err := certs.IssueFiles(p.Dir, "", certs.Request{Identity: id, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return c
}

// member is the tls section of coordinator id.
func (p testPKI) member(t *testing.T, id string) config.TLS {
	return p.tls(t, authz.Identity{Name: id, Role: authz.RoleCoordinator})
}

// admin is the tls section of an admin client.
func (p testPKI) admin(t *testing.T) config.TLS {
	return p.tls(t, authz.Identity{Name: "root", Role: authz.RoleAdmin})
}

func TestLoadTLSErrors(t *testing.T) {
	p := newTestPKI(t, t.TempDir())
	if s, err := loadTLS(config.TLS{}); err != nil || s.enabled() {
		t.Fatalf("no tls: %v %v", s, err)
	}
	if s, err := loadTLS(p.member(t, "c1")); err != nil || !s.enabled() {
		t.Fatalf("tls: %v %v", s, err)
	}
	bad := p.member(t, "c1")
	bad.CAFile = bad.KeyFile // no certificate in it
	if _, err := loadTLS(bad); err == nil {
		t.Fatal("a key file accepted as CA")
	}
	bad = p.member(t, "c1")
	bad.KeyFile = p.OtherKey // does not match the cert
	if _, err := loadTLS(bad); err == nil {
		t.Fatal("mismatched key accepted")
	}
}

// TestServerRefusesAnotherMembersCertificate: a member started with a
// certificate that is not its own coordinator certificate (its peers would
// refuse every raft frame) stops at once, says how to issue the right one,
// and touches nothing in data_dir.
func TestServerRefusesAnotherMembersCertificate(t *testing.T) {
	p := newTestPKI(t, t.TempDir())
	for _, tc := range []struct {
		name string
		tls  config.TLS
	}{
		{"c2's certificate", p.member(t, "c2")},
		{"an operator's certificate", p.tls(t, authz.Identity{Name: "c1", Role: authz.RoleOperator})},
	} {
		cfg := singleMember(t)
		cfg.TLS = tc.tls
		_, err := New(cfg, nil)
		if !errors.Is(err, mtls.ErrWrongIdentity) || !strings.Contains(err.Error(), "walden certs issue --name c1 --role coordinator") {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
			t.Fatalf("%s: data_dir touched: %v", tc.name, err)
		}
	}
}
