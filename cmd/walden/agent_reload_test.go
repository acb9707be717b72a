package main

import (
	"errors"
	"testing"

	"walden/authz"
	"walden/internal/testutil/testpki"
	"walden/mtls"
)

// TestAgentReloadKeepsItsIdentity: a SIGHUP that points the agent of b1 at
// another broker's certificate (or at none) is refused and the files in use
// stay; a renewed certificate of its own is taken.
func TestAgentReloadKeepsItsIdentity(t *testing.T) {
	p := testpki.New(t)
	own := p.TLS(t, authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"})
	files, err := mtls.LoadFiles(own)
	if err != nil {
		t.Fatal(err)
	}
	other := p.TLS(t, authz.Identity{Name: "b2-agent", Role: authz.RoleAgent, BrokerID: "b2"})
	if err := reloadAgentTLS(files, "b1", other); !errors.Is(err, mtls.ErrWrongIdentity) {
		t.Fatalf("reload with b2's certificate = %v, want ErrWrongIdentity", err)
	}
	if got := files.Section(); got != own {
		t.Fatalf("files in use after a refused reload = %+v, want %+v", got, own)
	}
	brokers := p.TLS(t, authz.Identity{Name: "b1", Role: authz.RoleBroker, BrokerID: "b1"})
	if err := reloadAgentTLS(files, "b1", brokers); err != nil {
		t.Fatalf("reload with b1's broker certificate: %v", err)
	}
	if got := files.Section(); got != brokers {
		t.Fatalf("files in use = %+v, want %+v", got, brokers)
	}
}
