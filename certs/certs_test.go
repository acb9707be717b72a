package certs

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"walden/authz"
	"walden/gossip"
)

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func parseCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestInitWritesCAAndGossipKeyOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca, err := Init(dir, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := listDir(t, dir); !slices.Equal(got, []string{CAKeyFile, CAFile, GossipKeyFile}) {
		t.Fatalf("files %v", got)
	}
	for name, want := range map[string]os.FileMode{CAKeyFile: 0o600, GossipKeyFile: 0o600, CAFile: 0o644} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s mode %v %v, want %v", name, st.Mode().Perm(), err, want)
		}
	}
	c := parseCert(t, filepath.Join(dir, CAFile))
	if !c.IsCA || !c.MaxPathLenZero || c.Subject.CommonName != "walden CA" || !c.Equal(ca.Cert) {
		t.Fatalf("CA certificate %+v", c.Subject)
	}
	if d := time.Until(c.NotAfter); d < DefaultCAValidity-time.Hour || d > DefaultCAValidity {
		t.Fatalf("CA valid for %s", d)
	}
	key, err := gossip.LoadEncryptionKey(filepath.Join(dir, GossipKeyFile))
	if err != nil || len(key) != 32 {
		t.Fatalf("gossip key %d bytes, %v", len(key), err)
	}

	// A second init in the same directory changes nothing.
	before, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if _, err := Init(dir, "", 0); !errors.Is(err, ErrExists) {
		t.Fatalf("second Init = %v, want ErrExists", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if string(before) != string(after) {
		t.Fatal("the CA key changed")
	}
	// Nor does one where only the gossip key is left.
	dir2 := t.TempDir()
	os.WriteFile(filepath.Join(dir2, GossipKeyFile), []byte("x\n"), 0o600)
	if _, err := Init(dir2, "", 0); !errors.Is(err, ErrExists) {
		t.Fatalf("Init over a gossip key = %v", err)
	}
	if got := listDir(t, dir2); !slices.Equal(got, []string{GossipKeyFile}) {
		t.Fatalf("files %v", got)
	}
}

func TestIssueFilesCarriesTheIdentity(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(dir, "", 0); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(filepath.Join(dir, CAFile))
	pool.AppendCertsFromPEM(caPEM)

	cases := []struct {
		req        Request
		serverAuth bool
		hosts      []string
	}{
		{Request{Identity: authz.Identity{Name: "c1", Role: authz.RoleCoordinator}, Hosts: []string{"10.0.0.1", "c1.walden.internal"}},
			true, []string{"localhost", "c1.walden.internal", "127.0.0.1", "::1", "10.0.0.1"}},
		{Request{Identity: authz.Identity{Name: "b7", Role: authz.RoleBroker, BrokerID: "b7"}}, true, []string{"localhost", "127.0.0.1", "::1"}},
		{Request{Identity: authz.Identity{Name: "b7-agent", Role: authz.RoleAgent, BrokerID: "b7"}}, false, nil},
		{Request{Identity: authz.Identity{Name: "alice", Role: authz.RoleOperator}, Validity: 24 * time.Hour}, false, nil},
		{Request{Identity: authz.Identity{Name: "grafana", Role: authz.RoleReader}}, false, nil},
		{Request{Identity: authz.Identity{Name: "root", Role: authz.RoleAdmin}}, false, nil},
	}
	for _, tc := range cases {
		f, err := IssueFiles(dir, "", tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.req.Identity.Name, err)
		}
		if f.Cert != filepath.Join(dir, tc.req.Identity.Name+".pem") || f.Key != filepath.Join(dir, tc.req.Identity.Name+"-key.pem") {
			t.Fatalf("files %+v", f)
		}
		if st, _ := os.Stat(f.Key); st.Mode().Perm() != 0o600 {
			t.Errorf("%s: key mode %v", f.Key, st.Mode().Perm())
		}
		if _, err := tls.LoadX509KeyPair(f.Cert, f.Key); err != nil {
			t.Fatalf("%s: key pair: %v", tc.req.Identity.Name, err)
		}
		c := parseCert(t, f.Cert)
		id, err := authz.FromCertificate(c)
		if err != nil || id != tc.req.Identity {
			t.Fatalf("identity %+v %v, want %+v", id, err, tc.req.Identity)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("%s: client verify: %v", id.Name, err)
		}
		_, err = c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSName: "localhost"})
		if (err == nil) != tc.serverAuth {
			t.Fatalf("%s: server verify for localhost: %v, want ok=%v", id.Name, err, tc.serverAuth)
		}
		var hosts []string
		hosts = append(hosts, c.DNSNames...)
		for _, ip := range c.IPAddresses {
			hosts = append(hosts, ip.String())
		}
		if !slices.Equal(hosts, tc.hosts) {
			t.Fatalf("%s: hosts %v, want %v", id.Name, hosts, tc.hosts)
		}
		if tc.req.Validity != 0 && c.NotAfter.Sub(c.NotBefore) > tc.req.Validity+backdate+time.Minute {
			t.Fatalf("%s: valid %s..%s", id.Name, c.NotBefore, c.NotAfter)
		}
	}
	c1 := parseCert(t, filepath.Join(dir, "c1.pem"))
	if err := c1.VerifyHostname("10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if !c1.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) {
		t.Fatalf("ips %v", c1.IPAddresses)
	}
}

// TestIssueRefusals: every refused request writes nothing.
func TestIssueRefusals(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(dir, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := IssueFiles(dir, "", Request{Identity: authz.Identity{Name: "alice", Role: authz.RoleReader}}); err != nil {
		t.Fatal(err)
	}
	before := listDir(t, dir)
	cases := map[string]struct {
		req  Request
		want error
	}{
		"unknown role":            {Request{Identity: authz.Identity{Name: "x", Role: "root"}}, authz.ErrUnknownRole},
		"agent without broker id": {Request{Identity: authz.Identity{Name: "x", Role: authz.RoleAgent}}, ErrInvalid},
		"reader with broker id":   {Request{Identity: authz.Identity{Name: "x", Role: authz.RoleReader, BrokerID: "b1"}}, ErrInvalid},
		"bad name":                {Request{Identity: authz.Identity{Name: "../x", Role: authz.RoleReader}}, ErrInvalid},
		"bad broker id":           {Request{Identity: authz.Identity{Name: "x", Role: authz.RoleBroker, BrokerID: "b 1"}}, ErrInvalid},
		"bad host":                {Request{Identity: authz.Identity{Name: "x", Role: authz.RoleCoordinator}, Hosts: []string{"not a host"}}, ErrInvalid},
		"negative validity":       {Request{Identity: authz.Identity{Name: "x", Role: authz.RoleReader}, Validity: -time.Hour}, ErrInvalid},
		"existing name":           {Request{Identity: authz.Identity{Name: "alice", Role: authz.RoleAdmin}}, ErrExists},
	}
	for name, tc := range cases {
		if _, err := IssueFiles(dir, "", tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if got := listDir(t, dir); !slices.Equal(got, before) {
		t.Fatalf("files %v, want %v", got, before)
	}
	// The CA caps a certificate's validity.
	f, err := IssueFiles(dir, "", Request{Identity: authz.Identity{Name: "bob", Role: authz.RoleReader}})
	if err != nil {
		t.Fatal(err)
	}
	ca := parseCert(t, filepath.Join(dir, CAFile))
	if c := parseCert(t, f.Cert); c.NotAfter.After(ca.NotAfter) {
		t.Fatalf("certificate outlives its CA: %s > %s", c.NotAfter, ca.NotAfter)
	}
}

func TestLoadCARefusals(t *testing.T) {
	if _, err := LoadCA(t.TempDir()); !errors.Is(err, ErrNoCA) {
		t.Fatalf("empty dir: %v", err)
	}
	a, b := t.TempDir(), t.TempDir()
	if _, err := Init(a, "", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(b, "", 0); err != nil {
		t.Fatal(err)
	}
	// b's key with a's certificate.
	key, _ := os.ReadFile(filepath.Join(b, CAKeyFile))
	os.Remove(filepath.Join(a, CAKeyFile))
	os.WriteFile(filepath.Join(a, CAKeyFile), key, 0o600)
	if _, err := LoadCA(a); !errors.Is(err, ErrNoCA) {
		t.Fatalf("mismatched key: %v", err)
	}
	// A leaf certificate is no CA.
	f, err := IssueFiles(b, t.TempDir(), Request{Identity: authz.Identity{Name: "c1", Role: authz.RoleCoordinator}})
	if err != nil {
		t.Fatal(err)
	}
	c := t.TempDir()
	cp, _ := os.ReadFile(f.Cert)
	kp, _ := os.ReadFile(f.Key)
	os.WriteFile(filepath.Join(c, CAFile), cp, 0o644)
	os.WriteFile(filepath.Join(c, CAKeyFile), kp, 0o600)
	if _, err := LoadCA(c); !errors.Is(err, ErrNoCA) {
		t.Fatalf("leaf as CA: %v", err)
	}
}
