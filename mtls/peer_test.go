package mtls_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"walden/authz"
	"walden/certs"
	"walden/config"
	"walden/mtls"
)

// pki is a CA and the files of the certificates it issued.
type pki struct {
	dir string
	ca  *certs.CA
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	ca, err := certs.NewCA(name, 0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return &pki{dir: dir, ca: ca}
}

// files issues a certificate for id and returns the tls section that uses
// it with this CA.
func (p *pki) files(t *testing.T, id authz.Identity) config.TLS {
	t.Helper()
	certPEM, keyPEM, err := p.ca.Issue(certs.Request{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	name := id.Name + "-" + string(id.Role)
	c := config.TLS{CAFile: filepath.Join(p.dir, "ca.pem"), CertFile: filepath.Join(p.dir, name+".pem"), KeyFile: filepath.Join(p.dir, name+"-key.pem")}
	if err := os.WriteFile(c.CertFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.KeyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// serve starts a gRPC server (health only) with the server side of c and
// returns its address and the errors of its handshakes.
func serve(t *testing.T, c config.TLS) (string, <-chan error) {
	t.Helper()
	m, err := mtls.Load(c)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	s := grpc.NewServer(grpc.Creds(&recordingCreds{TransportCredentials: mtls.Creds(m.Server), errs: errs}))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String(), errs
}

type recordingCreds struct {
	credentials.TransportCredentials
	errs chan error
}

func (c *recordingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		select {
		case c.errs <- err:
		default:
		}
	}
	return conn, info, err
}

// call makes one health check and returns its error, with gRPC's quoting
// of the message undone.
func call(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return errors.New(strings.ReplaceAll(err.Error(), `\"`, `"`))
	}
	return nil
}

// TestClientsRequireTheCoordinatorRole is finding 4 of the hardening
// table: agents, brokers and waldenctl checked the CA and the host name
// only, and every broker certificate is valid for localhost, so on a
// shared host any broker certificate could pose as a coordinator. A
// client of the coordinators now requires the server's certificate to
// carry the coordinator role, and says so.
func TestClientsRequireTheCoordinatorRole(t *testing.T) {
	p := newPKI(t, "cluster CA")
	alice := p.files(t, authz.Identity{Name: "alice", Role: authz.RoleOperator})
	creds, err := mtls.ClientCreds(alice)
	if err != nil {
		t.Fatal(err)
	}
	coord, _ := serve(t, p.files(t, authz.Identity{Name: "c1", Role: authz.RoleCoordinator}))
	if err := call(t, coord, creds); err != nil {
		t.Fatalf("a coordinator: %v", err)
	}
	posing, _ := serve(t, p.files(t, authz.Identity{Name: "b1", Role: authz.RoleBroker, BrokerID: "b1"}))
	err = call(t, posing, creds)
	want := `this client refused the coordinator at ` + posing + `: its certificate is "b1" (broker of broker b1), not a coordinator's`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a broker's certificate posing as a coordinator: %v, want %q", err, want)
	}
	// The brokers' data API clients require the broker role instead.
	bcreds, err := mtls.BrokerClientCreds(alice)
	if err != nil {
		t.Fatal(err)
	}
	if err := call(t, posing, bcreds); err != nil {
		t.Fatalf("a broker's data API: %v", err)
	}
	if err := call(t, coord, bcreds); err == nil || !strings.Contains(err.Error(), `this client refused the broker at `+coord+`: its certificate is "c1" (coordinator), not a broker's`) {
		t.Fatalf("a coordinator posing as a broker: %v", err)
	}
}

// TestHandshakeErrorsSayWhoRefusedWhom is part of finding 8: a client
// certificate of another CA reported "write tcp ...: broken pipe". Each
// side now says which side refused whom, and why.
func TestHandshakeErrorsSayWhoRefusedWhom(t *testing.T) {
	p := newPKI(t, "cluster CA")
	other := newPKI(t, "another CA")
	coord, serverErrs := serve(t, p.files(t, authz.Identity{Name: "c1", Role: authz.RoleCoordinator}))
	strange, _ := serve(t, other.files(t, authz.Identity{Name: "c1", Role: authz.RoleCoordinator}))
	credsOf := func(c config.TLS) credentials.TransportCredentials {
		cr, err := mtls.ClientCreds(c)
		if err != nil {
			t.Fatal(err)
		}
		return cr
	}
	alice := credsOf(p.files(t, authz.Identity{Name: "alice", Role: authz.RoleOperator}))
	// mallory trusts the cluster's CA, but her certificate is another's.
	malloryFiles := other.files(t, authz.Identity{Name: "mallory", Role: authz.RoleOperator})
	malloryFiles.CAFile = filepath.Join(p.dir, "ca.pem")
	mallory := credsOf(malloryFiles)
	noCert := func() credentials.TransportCredentials {
		m, err := mtls.Load(p.files(t, authz.Identity{Name: "x", Role: authz.RoleReader}))
		if err != nil {
			t.Fatal(err)
		}
		tc := m.Client.Clone()
		tc.Certificates = nil
		return mtls.Creds(tc)
	}()
	drain := func() {
		for len(serverErrs) > 0 {
			<-serverErrs
		}
	}
	for _, tc := range []struct {
		name        string
		addr        string
		creds       credentials.TransportCredentials
		client      string
		server      string // what the server's handshake error says ("" when it says nothing)
		refusedByPe bool
	}{
		{"a client certificate of another CA", coord, mallory,
			"the coordinator at " + coord + " refused this client's certificate: it was not signed by the CA the coordinator trusts",
			"this server refused the client at 127.0.0.1:", true},
		{"no client certificate", coord, noCert,
			"the coordinator at " + coord + " refused this client: it requires a client certificate signed by the cluster's CA",
			"it presented no certificate", true},
		{"a coordinator of another CA", strange, alice,
			"this client refused the coordinator at " + strange + ": its certificate was not signed by the CA this client trusts", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drain()
			err := call(t, tc.addr, tc.creds)
			if err == nil || !strings.Contains(err.Error(), tc.client) {
				t.Fatalf("client error %v, want %q", err, tc.client)
			}
			for _, bad := range []string{"broken pipe", "EOF", "connection reset"} {
				if strings.Contains(err.Error(), bad+" (") || strings.HasSuffix(err.Error(), bad) {
					t.Errorf("client error %q still reads %q", err, bad)
				}
			}
			if tc.server == "" {
				return
			}
			select {
			case serr := <-serverErrs:
				if !strings.Contains(serr.Error(), tc.server) || !errors.Is(serr, mtls.ErrPeerRefused) {
					t.Fatalf("server error %v, want %q", serr, tc.server)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the server reported no handshake error")
			}
		})
	}
	// A handshake that succeeds hands the connection on whole: the first
	// bytes the client waited for are not lost.
	if err := call(t, coord, alice); err != nil {
		t.Fatal(err)
	}
	_ = tls.VersionTLS13
}
