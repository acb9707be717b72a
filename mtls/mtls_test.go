package mtls

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"walden/config"
)

func TestLoadOff(t *testing.T) {
	m, err := Load(config.TLS{})
	if err != nil || m.Server != nil || m.Client != nil {
		t.Fatalf("Load(off) = %+v, %v", m, err)
	}
	if got := Creds(nil).Info().SecurityProtocol; got != "insecure" {
		t.Fatalf("Creds(nil) protocol = %q", got)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CertPool(notPEM); !errors.Is(err, ErrNoPEM) {
		t.Fatalf("CertPool(not PEM) = %v, want ErrNoPEM", err)
	}
	if _, err := CertPool(filepath.Join(dir, "missing.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CertPool(missing) = %v, want not exist", err)
	}
	_, err := ClientCreds(config.TLS{CertFile: filepath.Join(dir, "c.pem"), KeyFile: filepath.Join(dir, "k.pem"), CAFile: notPEM})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ClientCreds(missing cert) = %v, want not exist", err)
	}
}
