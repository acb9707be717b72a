package server

import (
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc/credentials"

	"walden/config"
	"walden/mtls"
)

// ErrTLSConfig means a certificate, key or CA file named in tls could not
// be used.
var ErrTLSConfig = errors.New("server: unusable tls files")

// tlsSetup holds the TLS settings of one member: servers require a client
// certificate signed by ca_file, clients present cert_file and check the
// server against ca_file. Every new connection uses the files of the last
// successful (re)load; everything is plain when TLS is off.
type tlsSetup struct {
	mu    sync.Mutex
	files config.TLS // the files the next (re)load reads
	r     *mtls.Reloader
}

func loadTLS(c config.TLS) (*tlsSetup, error) {
	t := &tlsSetup{files: c}
	r, err := mtls.NewReloader(func() (mtls.Configs, error) {
		t.mu.Lock()
		files := t.files
		t.mu.Unlock()
		return mtls.Load(files)
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTLSConfig, err)
	}
	t.r = r
	return t, nil
}

// reload reads the certificate, key and CA files that c names (SIGHUP):
// new connections use them from now on. On an error the files loaded
// before stay in use.
func (t *tlsSetup) reload(c config.TLS) error {
	t.mu.Lock()
	old := t.files
	t.files = c
	t.mu.Unlock()
	if err := t.r.Reload(); err != nil {
		t.mu.Lock()
		t.files = old
		t.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrTLSConfig, err)
	}
	return nil
}

func (t *tlsSetup) enabled() bool { return t.r.Enabled() }

// serverCreds are the credentials of the gRPC listeners.
func (t *tlsSetup) serverCreds() credentials.TransportCredentials {
	return t.r.ServerCreds()
}

// clientCreds are the credentials of connections to other members.
func (t *tlsSetup) clientCreds() credentials.TransportCredentials {
	return t.r.ClientCreds()
}
