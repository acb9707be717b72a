package testpki

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"walden/authz"
	"walden/certs"
	"walden/config"
)

// PKI is a test CA of the test's own in a temporary directory, issuing
// certificates the way `walden certs issue` does.
type PKI struct {
	// Dir holds the CA and every certificate issued.
	Dir string
	// CA is the CA certificate's file.
	CA string

	mu sync.Mutex
}

// New creates a CA in a new temporary directory of t.
func New(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	if _, err := certs.Init(dir, "walden test CA", 24*time.Hour); err != nil {
		t.Fatalf("test CA: %v", err)
	}
	return &PKI{Dir: dir, CA: filepath.Join(dir, certs.CAFile)}
}

// TLS returns the tls section of id's certificate, issuing it on first use.
func (p *PKI) TLS(t testing.TB, id authz.Identity) config.TLS {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	c := config.TLS{CertFile: filepath.Join(p.Dir, id.Name+".pem"), KeyFile: filepath.Join(p.Dir, id.Name+"-key.pem"), CAFile: p.CA}
	if _, err := os.Stat(c.CertFile); err == nil {
		return c
	}
	f, err := certs.IssueFiles(p.Dir, "", certs.Request{Identity: id, Validity: 24 * time.Hour})
	if err != nil {
		t.Fatalf("certificate of %s: %v", id.Name, err)
	}
	c.CertFile, c.KeyFile = f.Cert, f.Key
	return c
}

// Member is the tls section of coordinator id.
func (p *PKI) Member(t testing.TB, id string) config.TLS {
	return p.TLS(t, authz.Identity{Name: id, Role: authz.RoleCoordinator})
}

// Admin is the tls section of an admin client.
func (p *PKI) Admin(t testing.TB) config.TLS {
	return p.TLS(t, authz.Identity{Name: "root", Role: authz.RoleAdmin})
}

// Broker is the tls section of broker id.
func (p *PKI) Broker(t testing.TB, id string) config.TLS {
	return p.TLS(t, authz.Identity{Name: id, Role: authz.RoleBroker, BrokerID: id})
}
