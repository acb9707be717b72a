package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"walden/config"
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
	if !c.Enabled() {
		return &tlsSetup{}, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: tls.cert_file %s, tls.key_file %s: %v", ErrTLSConfig, c.CertFile, c.KeyFile, err)
	}
	caPEM, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("%w: tls.ca_file: %v", ErrTLSConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%w: tls.ca_file %s holds no PEM certificate", ErrTLSConfig, c.CAFile)
	}
	return &tlsSetup{
		server: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool,
		},
		client: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{cert},
			RootCAs:      pool,
		},
	}, nil
}

func (t *tlsSetup) enabled() bool { return t.server != nil }

// serverCreds are the credentials of the gRPC listeners.
func (t *tlsSetup) serverCreds() credentials.TransportCredentials {
	if t.server == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(t.server)
}

// clientCreds are the credentials of connections to other members.
func (t *tlsSetup) clientCreds() credentials.TransportCredentials {
	if t.client == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(t.client)
}
