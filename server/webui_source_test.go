package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"walden/authz"
)

func certOf(t *testing.T, id authz.Identity) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: authz.Subject(id), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWebAuthorize(t *testing.T) {
	req := httptest.NewRequest("GET", "/ui/", nil)
	if _, err := webAuthorize(req); err != nil {
		t.Fatalf("plaintext (TLS off): %v", err)
	}
	for _, c := range []struct {
		id   authz.Identity
		want string
	}{
		{authz.Identity{Name: "alice", Role: authz.RoleReader}, ""},
		{authz.Identity{Name: "bob", Role: authz.RoleOperator}, ""},
		{authz.Identity{Name: "root", Role: authz.RoleAdmin}, ""},
		{authz.Identity{Name: "b1", Role: authz.RoleAgent, BrokerID: "b1"}, "needs the reader role"},
		{authz.Identity{Name: "c2", Role: authz.RoleCoordinator}, "needs the reader role"},
	} {
		r := httptest.NewRequest("GET", "/ui/api/overview", nil)
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{certOf(t, c.id)}}
		ctx, err := webAuthorize(r)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", c.id, err)
				continue
			}
			if got, ok := authz.FromContext(ctx); !ok || got.Name != c.id.Name {
				t.Errorf("%s: context identity %v %v", c.id, got, ok)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.id, err, c.want)
		}
	}
	r := httptest.NewRequest("GET", "/ui/", nil)
	r.TLS = &tls.ConnectionState{}
	if _, err := webAuthorize(r); err == nil {
		t.Error("TLS without a client certificate allowed")
	}
}
