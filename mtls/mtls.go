package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"walden/authz"
	"walden/config"
	"walden/filecheck"
	"walden/gossip"
)

// ErrNoPEM means a CA file holds no PEM certificate.
var ErrNoPEM = errors.New("no PEM certificate")

// Configs are the two sides of mutual TLS of one member. Both are nil when
// TLS is off.
type Configs struct {
	// Server requires a client certificate signed by ca_file.
	Server *tls.Config
	// Client presents cert_file, checks the server against ca_file and the
	// address dialed, and requires the server's certificate to carry the
	// coordinator role: every client of the coordinators (ForServerRole
	// makes the configuration of the brokers' data API clients).
	Client *tls.Config
}

// maxPEMBytes bounds a certificate, key or CA file.
const maxPEMBytes = 1 << 20

// overrideKey is the configuration key that lets a private key be readable
// by its group.
const overrideKey = "tls.allow_group_readable_key: true"

// Load reads the files c names. With TLS off it returns empty Configs.
func Load(c config.TLS) (Configs, error) {
	if !c.Enabled() {
		return Configs{}, nil
	}
	cert, err := loadKeyPair(c)
	if err != nil {
		return Configs{}, err
	}
	pool, err := CertPool(c.CAFile)
	if err != nil {
		return Configs{}, fmt.Errorf("tls.ca_file: %w", err)
	}
	return Configs{
		Server: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool,
		},
		Client: &tls.Config{
			MinVersion:       tls.VersionTLS12,
			Certificates:     []tls.Certificate{cert},
			RootCAs:          pool,
			VerifyConnection: RequireServerRole(authz.RoleCoordinator),
		},
	}, nil
}

// loadKeyPair reads the certificate and key c names, each a regular file
// of at most 1 MiB, the key readable by its owner only (or its group with
// the override).
func loadKeyPair(c config.TLS) (tls.Certificate, error) {
	cert, err := LoadKeyPair(c.CertFile, c.KeyFile, c.AllowGroupReadableKey, overrideKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls.cert_file %s, tls.key_file %s: %w", c.CertFile, c.KeyFile, err)
	}
	return cert, nil
}

// LoadKeyPair reads a certificate and its private key, each a regular file
// of at most 1 MiB (checked before it is read: /dev/zero or a FIFO are
// refused at once); the key must not be readable by anyone but its owner
// (ssh's rule), or its group when allowGroup (override names the setting
// that allows it, for the refusal's hint).
func LoadKeyPair(certFile, keyFile string, allowGroup bool, override string) (tls.Certificate, error) {
	certPEM, err := filecheck.ReadRegular(certFile, "certificate file", maxPEMBytes)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := filecheck.CheckPrivateKey(keyFile, "private key", allowGroup, override); err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := filecheck.ReadRegular(keyFile, "private key", maxPEMBytes)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// CertPool reads the PEM certificates of file (a regular file of at most
// 1 MiB).
func CertPool(file string) (*x509.CertPool, error) {
	pem, err := filecheck.ReadRegular(file, "CA file", maxPEMBytes)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w in %s", ErrNoPEM, file)
	}
	return pool, nil
}

// Creds are the gRPC transport credentials of tc (a server's, or a client
// of the coordinators'): plain when tc is nil. Their handshake errors say
// who refused whom and why (ExplainingCreds).
func Creds(tc *tls.Config) credentials.TransportCredentials {
	return CredsFor(tc, authz.RoleCoordinator)
}

// CredsFor are Creds of a client of the servers of role (its tls.Config
// requires that role: ForServerRole).
func CredsFor(tc *tls.Config, role authz.Role) credentials.TransportCredentials {
	if tc == nil {
		return insecure.NewCredentials()
	}
	return explaining(tc, role)
}

// ClientCreds are the credentials of a client of the coordinators
// configured by c: mutual TLS, or plain when TLS is off.
func ClientCreds(c config.TLS) (credentials.TransportCredentials, error) {
	m, err := Load(c)
	if err != nil {
		return nil, err
	}
	return Creds(m.Client), nil
}

// BrokerClientCreds are the credentials of a client of the brokers' data
// API configured by c: the servers' certificates must carry the broker
// role.
func BrokerClientCreds(c config.TLS) (credentials.TransportCredentials, error) {
	m, err := Load(c)
	if err != nil {
		return nil, err
	}
	return CredsFor(ForServerRole(m.Client, authz.RoleBroker), authz.RoleBroker), nil
}

// ErrGossipKey means TLS is on but the gossip encryption key cannot be
// used: gossip is encrypted whenever TLS is on.
var ErrGossipKey = errors.New("no usable gossip encryption key")

// CheckGossipKey checks, before anything starts, the gossip key a process
// with TLS on will use: the file named by gossip.encryption_key_file, or
// else the gossip.key beside tls.ca_file (`walden certs init` writes it).
// With TLS off it checks nothing (the gossip pool reads a named key itself).
func CheckGossipKey(c config.TLS, named string) error {
	if !c.Enabled() {
		return nil
	}
	path, from := named, "gossip.encryption_key_file"
	if path == "" {
		path, from = c.GossipKeyFile(), "the gossip.key beside tls.ca_file"
	}
	if err := filecheck.CheckPrivateKey(path, "gossip key", c.AllowGroupReadableKey, overrideKey); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: tls is set, so gossip is encrypted with %s (%s): %w", ErrGossipKey, from, path, err)
	}
	if _, err := gossip.LoadEncryptionKey(path); err != nil {
		reason := strings.TrimPrefix(err.Error(), gossip.ErrEncryptionKey.Error()+" "+path+": ")
		var pe *fs.PathError
		if errors.As(err, &pe) {
			reason = pe.Err.Error()
		}
		return fmt.Errorf("%w: tls is set, so gossip is encrypted with %s (%s), which cannot be used: %s; walden certs init writes one",
			ErrGossipKey, from, path, reason)
	}
	return nil
}

// ErrWrongIdentity means a process's own certificate does not carry the
// identity its configuration needs: its calls would all be refused.
var ErrWrongIdentity = errors.New("wrong certificate")

// CheckIdentity reads the identity of the certificate c names and checks
// it is want's role, name (for a coordinator, its node_id) and broker id;
// for the agent role, a broker certificate of the same broker id also
// does (the reference broker's agent uses the broker's certificate). With
// TLS off it checks nothing.
func CheckIdentity(c config.TLS, want authz.Identity) error {
	if !c.Enabled() {
		return nil
	}
	kp, err := loadKeyPair(c)
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		return fmt.Errorf("tls.cert_file %s: %w", c.CertFile, err)
	}
	got, err := authz.FromCertificate(leaf)
	if err != nil {
		var ie *authz.IdentityError
		if errors.As(err, &ie) {
			return fmt.Errorf("%w: tls.cert_file %s carries no walden identity (%s): issue one with walden certs issue --name %s --role %s%s",
				ErrWrongIdentity, c.CertFile, ie.Reason, want.Name, want.Role, brokerFlag(want))
		}
		return err
	}
	ok := got.Role == want.Role && got.BrokerID == want.BrokerID && (want.Name == "" || got.Name == want.Name)
	if want.Role == authz.RoleAgent && got.Role == authz.RoleBroker && got.BrokerID == want.BrokerID {
		ok = true
	}
	if !ok {
		return fmt.Errorf("%w: tls.cert_file %s is %s, but this process needs %s: issue one with walden certs issue --name %s --role %s%s",
			ErrWrongIdentity, c.CertFile, got, describeWant(want), firstNonEmpty(want.Name, want.BrokerID), want.Role, brokerFlag(want))
	}
	return nil
}

func brokerFlag(id authz.Identity) string {
	if id.BrokerID == "" {
		return ""
	}
	return " --broker-id " + id.BrokerID
}

func describeWant(id authz.Identity) string {
	switch {
	case id.Role == authz.RoleCoordinator:
		return fmt.Sprintf("the coordinator %q (its node_id)", id.Name)
	case id.Role.BrokerBound():
		return fmt.Sprintf("a %s certificate of broker %s", id.Role, id.BrokerID)
	}
	return string(id.Role)
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
