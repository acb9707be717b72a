package server

import (
	"errors"
	"os"
	"strings"
	"testing"

	"walden/authz"
	"walden/config"
	"walden/internal/testutil/testpki"
	"walden/mtls"
)

// testPKI is a CA made by package certs in a directory, the certificates
// it issued there, and a second CA with a certificate of its own (whose
// role does not matter: the cluster's CA never signed it).
// testPKI is a test CA (testpki) with, beside it, an unrelated CA and a
// certificate it issued (an intruder's).
type testPKI struct {
	*testpki.PKI
	OtherCA, OtherCert, OtherKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	p := testpki.New(t)
	other := testpki.New(t)
	f := other.TLS(t, authz.Identity{Name: "intruder", Role: authz.RoleAdmin})
	return testPKI{PKI: p, OtherCA: other.CA, OtherCert: f.CertFile, OtherKey: f.KeyFile}
}

func TestLoadTLSErrors(t *testing.T) {
	p := newTestPKI(t)
	if s, err := loadTLS(config.TLS{}); err != nil || s.Enabled() {
		t.Fatalf("no tls: %v %v", s, err)
	}
	if s, err := loadTLS(p.Member(t, "c1")); err != nil || !s.Enabled() {
		t.Fatalf("tls: %v %v", s, err)
	}
	bad := p.Member(t, "c1")
	bad.CAFile = bad.KeyFile // no certificate in it
	if _, err := loadTLS(bad); err == nil {
		t.Fatal("a key file accepted as CA")
	}
	bad = p.Member(t, "c1")
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
	p := newTestPKI(t)
	for _, tc := range []struct {
		name string
		tls  config.TLS
	}{
		{"c2's certificate", p.Member(t, "c2")},
		{"an operator's certificate", p.TLS(t, authz.Identity{Name: "c1", Role: authz.RoleOperator})},
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
