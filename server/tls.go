package server

import (
	"errors"
	"fmt"

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
type tlsSetup struct{ *mtls.Files }

func loadTLS(c config.TLS) (*tlsSetup, error) {
	f, err := mtls.LoadFiles(c)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTLSConfig, err)
	}
	return &tlsSetup{f}, nil
}

// reload reads the certificate, key and CA files that c names (SIGHUP):
// new connections use them from now on. On an error the files loaded
// before stay in use.
func (t *tlsSetup) reload(c config.TLS) error {
	if err := t.ReloadFiles(c); err != nil {
		return fmt.Errorf("%w: %w", ErrTLSConfig, err)
	}
	return nil
}
