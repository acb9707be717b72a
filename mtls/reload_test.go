package mtls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"walden/config"
)

// writePKI writes a CA (ca.pem) and a coordinator's certificate signed by
// it for 127.0.0.1 (member.pem, member-key.pem) into dir, replacing what
// is there.
func writePKI(t *testing.T, dir, name string) config.TLS {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano() + 1), Subject: pkix.Name{CommonName: "member", Organization: []string{"walden:coordinator"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := config.TLS{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "member.pem"), KeyFile: filepath.Join(dir, "member-key.pem")}
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{c.CAFile, "CERTIFICATE", caDER}, {c.CertFile, "CERTIFICATE", der}, {c.KeyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// check makes one health call over a new connection with creds.
func check(addr string, r *Reloader) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(r.ClientCreds()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// serveHealth serves gRPC's health service on a loopback port with creds
// until the test ends, and returns its address.
func serveHealth(t *testing.T, creds credentials.TransportCredentials) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	return l.Addr().String()
}

func TestReloaderRotatesCertificatesAndCA(t *testing.T) {
	serverDir, clientDir := t.TempDir(), t.TempDir()
	sc := writePKI(t, serverDir, "first CA")
	// The client starts with the same files.
	for _, n := range []string{"ca.pem", "member.pem", "member-key.pem"} {
		b, _ := os.ReadFile(filepath.Join(serverDir, n))
		if err := os.WriteFile(filepath.Join(clientDir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cc := config.TLS{CAFile: filepath.Join(clientDir, "ca.pem"), CertFile: filepath.Join(clientDir, "member.pem"), KeyFile: filepath.Join(clientDir, "member-key.pem")}
	srv, err := NewReloader(func() (Configs, error) { return Load(sc) })
	if err != nil {
		t.Fatal(err)
	}
	cli, err := NewReloader(func() (Configs, error) { return Load(cc) })
	if err != nil {
		t.Fatal(err)
	}

	addr := serveHealth(t, srv.ServerCreds())

	if err := check(addr, cli); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	// Rotate the server to a new CA: the old client is refused once the
	// server reloads, and accepted again once it reloaded the new files.
	writePKI(t, serverDir, "second CA")
	if err := check(addr, cli); err != nil {
		t.Fatalf("before the server reloads, the old settings serve: %v", err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := check(addr, cli); err == nil {
		t.Fatal("a client of the old CA was accepted after the server's rotation")
	}
	for _, n := range []string{"ca.pem", "member.pem", "member-key.pem"} {
		b, _ := os.ReadFile(filepath.Join(serverDir, n))
		if err := os.WriteFile(filepath.Join(clientDir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := cli.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := check(addr, cli); err != nil {
		t.Fatalf("after both reloaded: %v", err)
	}

	// A reload of unusable files fails and keeps the settings in use.
	if err := os.WriteFile(sc.CertFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil {
		t.Fatal("reload of a garbage certificate succeeded")
	}
	if err := check(addr, cli); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
}

func TestReloaderRefusesToggle(t *testing.T) {
	on := writePKI(t, t.TempDir(), "ca")
	c := on
	r, err := NewReloader(func() (Configs, error) { return Load(c) })
	if err != nil {
		t.Fatal(err)
	}
	c = config.TLS{}
	if err := r.Reload(); !errors.Is(err, ErrReloadToggle) {
		t.Fatalf("reload turning TLS off = %v, want ErrReloadToggle", err)
	}
	if !r.Enabled() {
		t.Fatal("a refused reload turned TLS off")
	}
	off, err := NewReloader(func() (Configs, error) { return Load(config.TLS{}) })
	if err != nil || off.Enabled() || off.ServerConfig() != nil || off.ServerCreds().Info().SecurityProtocol != "insecure" {
		t.Fatalf("TLS off: %v %v", off, err)
	}
}

func TestReloaderServerConfigHTTP(t *testing.T) {
	c := writePKI(t, t.TempDir(), "ca")
	r, err := NewReloader(func() (Configs, error) { return Load(c) })
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = hs.Serve(tls.NewListener(l, r.ServerConfig())) }()
	defer hs.Close()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: r.Current().Client}}
	resp, err := client.Get("https://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 {
		t.Fatalf("GET: %d %s", resp.StatusCode, resp.Proto)
	}
}

// TestFilesReloadsAnotherSection: ReloadFiles reads the files of a new
// section (a configuration file read again at SIGHUP) and every new
// connection uses them; a section whose files do not load, or that turns
// TLS off, changes nothing, and a later Reload reads the section in use.
func TestFilesReloadsAnotherSection(t *testing.T) {
	first := writePKI(t, t.TempDir(), "first CA")
	second := writePKI(t, t.TempDir(), "second CA")
	srv, err := LoadFiles(first)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveHealth(t, srv.ServerCreds())
	cliFirst, err := LoadFiles(first)
	if err != nil {
		t.Fatal(err)
	}
	cliSecond, err := LoadFiles(second)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(addr, cliFirst.Reloader); err != nil {
		t.Fatalf("before the reload: %v", err)
	}

	if err := srv.ReloadFiles(second); err != nil {
		t.Fatal(err)
	}
	if srv.Section() != second {
		t.Fatalf("section in use %+v, want %+v", srv.Section(), second)
	}
	if err := check(addr, cliSecond.Reloader); err != nil {
		t.Fatalf("client of the second CA after the reload: %v", err)
	}
	if err := check(addr, cliFirst.Reloader); err == nil {
		t.Fatal("a client of the first CA was accepted after the reload")
	}

	broken := second
	broken.CertFile = filepath.Join(t.TempDir(), "missing.pem")
	for name, c := range map[string]config.TLS{"missing certificate": broken, "TLS off": {}} {
		if err := srv.ReloadFiles(c); err == nil {
			t.Fatalf("%s: reload succeeded", name)
		}
		if srv.Section() != second {
			t.Fatalf("%s: section in use %+v after a failed reload, want %+v", name, srv.Section(), second)
		}
		if err := check(addr, cliSecond.Reloader); err != nil {
			t.Fatalf("%s: after a failed reload: %v", name, err)
		}
	}
	if err := srv.Reload(); err != nil {
		t.Fatalf("reload of the section in use: %v", err)
	}
}

// TestServerCredsWithOffersMoreProtocols: ServerCredsWith's handshakes
// offer the extra protocols beside "h2" (which a client offering both gets),
// and keep offering them with the files of a reload.
func TestServerCredsWithOffersMoreProtocols(t *testing.T) {
	dir := t.TempDir()
	sc := writePKI(t, dir, "first CA")
	srv, err := NewReloader(func() (Configs, error) { return Load(sc) })
	if err != nil {
		t.Fatal(err)
	}
	negotiateWith := func(creds credentials.TransportCredentials, protos ...string) (string, error) {
		t.Helper()
		cli, err := Load(sc)
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		got := make(chan string, 1)
		go func() {
			_, info, err := creds.ServerHandshake(b)
			if err != nil {
				got <- "refused: " + err.Error()
				return
			}
			got <- info.(credentials.TLSInfo).State.NegotiatedProtocol
		}()
		tc := cli.Client.Clone()
		tc.NextProtos, tc.ServerName = protos, "127.0.0.1"
		c := tls.Client(a, tc)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		herr := c.Handshake()
		if herr != nil {
			a.Close()
		}
		server := <-got
		if herr != nil {
			return "", herr
		}
		if server != c.ConnectionState().NegotiatedProtocol {
			t.Fatalf("server negotiated %q, client %q", server, c.ConnectionState().NegotiatedProtocol)
		}
		return server, nil
	}
	negotiate := func(protos ...string) (string, error) {
		return negotiateWith(srv.ServerCredsWith("walden-test/1"), protos...)
	}
	for round := range 2 {
		if p, err := negotiate("walden-test/1"); err != nil || p != "walden-test/1" {
			t.Fatalf("round %d: asking for walden-test/1: %q, %v", round, p, err)
		}
		if p, err := negotiate("walden-test/1", "h2"); err != nil || p != "h2" {
			t.Fatalf("round %d: asking for both: %q, %v; want h2 (the server's first)", round, p, err)
		}
		if _, err := negotiate("other/1"); err == nil {
			t.Fatalf("round %d: a protocol not offered was negotiated", round)
		}
		writePKI(t, dir, "second CA")
		if err := srv.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := negotiateWith(srv.ServerCreds(), "walden-test/1"); err == nil {
		t.Fatalf("ServerCreds without extra protocols negotiated %q", p)
	}
	if p, err := negotiateWith(srv.ServerCreds(), "h2"); err != nil || p != "h2" {
		t.Fatalf("ServerCreds: asking for h2: %q, %v", p, err)
	}
}
