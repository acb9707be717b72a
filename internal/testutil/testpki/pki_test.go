package testpki_test

import (
	"testing"

	"walden/authz"
	"walden/internal/testutil/testpki"
	"walden/mtls"
)

func TestPKIIssuesTheIdentity(t *testing.T) {
	p := testpki.New(t)
	for _, want := range []authz.Identity{
		{Name: "c1", Role: authz.RoleCoordinator},
		{Name: "root", Role: authz.RoleAdmin},
		{Name: "b1", Role: authz.RoleBroker, BrokerID: "b1"},
	} {
		var c = p.TLS(t, want)
		if err := mtls.CheckIdentity(c, want); err != nil {
			t.Fatalf("%s: %v", want.Name, err)
		}
		if again := p.TLS(t, want); again != c {
			t.Fatalf("%s: a second call issued other files: %+v, %+v", want.Name, c, again)
		}
	}
}
