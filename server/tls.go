package server

import (
	"crypto/tls"
	"errors"
	"fmt"

	"google.golang.org/grpc/credentials"

	"walden/config"
	"walden/mtls"
)

// ErrTLSConfig means a certificate, key or CA file named in tls could not
// be used.
var ErrTLSConfig = errors.New("server: unusable tls files")

// tlsSetup holds the TLS configurations of one member: servers require a
// client certificate signed by ca_file, clients present cert_file and check
// the server against ca_file. Both are nil when TLS is off.
type tlsSetup struct {
	server *tls.Config
	client *tls.Config
}

func loadTLS(c config.TLS) (*tlsSetup, error) {
	m, err := mtls.Load(c)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTLSConfig, err)
	}
	return &tlsSetup{server: m.Server, client: m.Client}, nil
}

func (t *tlsSetup) enabled() bool { return t.server != nil }

// serverCreds are the credentials of the gRPC listeners.
func (t *tlsSetup) serverCreds() credentials.TransportCredentials {
	return mtls.Creds(t.server)
}

// clientCreds are the credentials of connections to other members.
func (t *tlsSetup) clientCreds() credentials.TransportCredentials {
	return mtls.Creds(t.client)
}
