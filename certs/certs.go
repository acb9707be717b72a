package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"walden/authz"
)

// File names inside a certificate directory.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
	// GossipKeyFile is the gossip encryption key (base64 of 32 random
	// bytes, AES-256). Members and agents use the one beside their
	// tls.ca_file unless gossip.encryption_key_file names another.
	GossipKeyFile = "gossip.key"
)

// Default validities, as Consul's `consul tls`: five years for the CA, one
// year for the certificates it signs.
const (
	DefaultCAValidity   = 5 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
)

// backdate is subtracted from NotBefore so that a certificate is valid on a
// host whose clock is a little behind the one that issued it.
const backdate = 5 * time.Minute

// Errors of this package.
var (
	// ErrExists means a file to write already exists; nothing was written.
	ErrExists = errors.New("certs: refusing to overwrite")
	// ErrInvalid means a request is invalid (name, role, broker id, host,
	// validity); nothing was written.
	ErrInvalid = errors.New("certs: invalid request")
	// ErrNoCA means the directory holds no usable CA (ca.pem and
	// ca-key.pem).
	ErrNoCA = errors.New("certs: no usable CA")
)

// CA is a certificate authority: its certificate and private key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM is Cert in PEM.
	CertPEM []byte
}

// NewCA creates a CA named name (empty: "walden CA") valid for validity
// (0: DefaultCAValidity). It may sign leaf certificates only.
func NewCA(name string, validity time.Duration) (*CA, error) {
	if name == "" {
		name = "walden CA"
	}
	if validity == 0 {
		validity = DefaultCAValidity
	}
	if validity < 0 {
		return nil, fmt.Errorf("%w: validity must be positive, got %s", ErrInvalid, validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"walden"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true, // signs leaf certificates only
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pemBlock("CERTIFICATE", der)}, nil
}

// Request describes one certificate to issue.
type Request struct {
	// Identity is the name, role and (agent, broker) broker id.
	Identity authz.Identity
	// Hosts are the DNS names and IP addresses the certificate is valid
	// for as a server. Coordinators and brokers also get localhost,
	// 127.0.0.1 and ::1.
	Hosts []string
	// Validity is how long the certificate is valid (0:
	// DefaultCertValidity); it ends no later than the CA.
	Validity time.Duration
}

// serves reports whether certificates of role serve TLS (coordinators'
// admin and raft listeners, brokers' data API).
func serves(r authz.Role) bool { return r == authz.RoleCoordinator || r == authz.RoleBroker }

// Hosts returns the host names and addresses a certificate issued for req
// is valid for.
func (req Request) hosts() []string {
	var out []string
	if serves(req.Identity.Role) {
		out = append(out, "localhost", "127.0.0.1", "::1")
	}
	for _, h := range req.Hosts {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// Validate reports why req cannot be issued.
func (req Request) Validate() error {
	if err := req.Identity.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if req.Identity.Via != "" {
		return fmt.Errorf("%w: an identity in a certificate is never forwarded", ErrInvalid)
	}
	if req.Validity < 0 {
		return fmt.Errorf("%w: validity must be positive, got %s", ErrInvalid, req.Validity)
	}
	for _, h := range req.Hosts {
		if net.ParseIP(h) == nil && !hostnameOK(h) {
			return fmt.Errorf("%w: host %q is neither an IP address nor a DNS name", ErrInvalid, h)
		}
	}
	return nil
}

var hostnameRE = regexp.MustCompile(`^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

func hostnameOK(h string) bool { return len(h) <= 253 && hostnameRE.MatchString(h) }

// Issue creates a key and a certificate for req signed by ca; it returns
// both in PEM.
func (ca *CA) Issue(req Request) (certPEM, keyPEM []byte, err error) {
	if err := req.Validate(); err != nil {
		return nil, nil, err
	}
	validity := req.Validity
	if validity == 0 {
		validity = DefaultCertValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      authz.Subject(req.Identity),
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	hosts := req.hosts()
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: create certificate: %w", err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: encode key: %w", err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", kb), nil
}

// Init creates dir (when missing) and writes a new CA (ca.pem, ca-key.pem)
// and a new gossip key (gossip.key) into it. It refuses, writing nothing,
// when any of them exists.
func Init(dir, name string, validity time.Duration) (*CA, error) {
	for _, f := range []string{CAFile, CAKeyFile, GossipKeyFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return nil, fmt.Errorf("%w: %s already exists (a directory holds one CA; use another directory)", ErrExists, filepath.Join(dir, f))
		}
	}
	ca, err := NewCA(name, validity)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certs: encode CA key: %w", err)
	}
	gossipKey, err := NewGossipKey()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	if err := writeFiles([]file{
		{filepath.Join(dir, CAKeyFile), pemBlock("PRIVATE KEY", kb), 0o600},
		{filepath.Join(dir, CAFile), ca.CertPEM, 0o644},
		{filepath.Join(dir, GossipKeyFile), gossipKey, 0o600},
	}); err != nil {
		return nil, err
	}
	return ca, nil
}

// NewGossipKey returns a new gossip encryption key: 32 random bytes
// (AES-256) in base64, with a newline.
func NewGossipKey() ([]byte, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("certs: generate gossip key: %w", err)
	}
	return []byte(base64.StdEncoding.EncodeToString(k) + "\n"), nil
}

// LoadCA reads ca.pem and ca-key.pem of dir.
func LoadCA(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("%w in %s: %w (create one with walden certs init --dir %s)", ErrNoCA, dir, err, dir)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("%w in %s: %w", ErrNoCA, dir, err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrNoCA, filepath.Join(dir, CAFile))
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoCA, filepath.Join(dir, CAFile), err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%w: %s is not a CA certificate", ErrNoCA, filepath.Join(dir, CAFile))
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("%w: %s holds no PEM key", ErrNoCA, filepath.Join(dir, CAKeyFile))
	}
	key, err := parseKey(kb)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoCA, filepath.Join(dir, CAKeyFile), err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("%w: %s does not belong to %s", ErrNoCA, filepath.Join(dir, CAKeyFile), filepath.Join(dir, CAFile))
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

func parseKey(b *pem.Block) (crypto.Signer, error) {
	switch b.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
		if err != nil {
			return nil, err
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, errors.New("the key cannot sign")
		}
		return s, nil
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(b.Bytes)
	}
	return nil, fmt.Errorf("unsupported PEM block %q", b.Type)
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

// Files are the paths of one issued certificate and its key.
type Files struct {
	Cert string `json:"cert_file"`
	Key  string `json:"key_file"`
	// P12 is the PKCS#12 bundle written beside them, if any.
	P12 string `json:"p12_file,omitempty"`
}

// IssueFiles issues req with the CA of dir and writes NAME.pem and
// NAME-key.pem into out (dir when empty), refusing to overwrite either.
func IssueFiles(dir, out string, req Request) (Files, error) {
	if err := req.Validate(); err != nil {
		return Files{}, err
	}
	if out == "" {
		out = dir
	}
	f := Files{Cert: filepath.Join(out, req.Identity.Name+".pem"), Key: filepath.Join(out, req.Identity.Name+"-key.pem")}
	for _, p := range []string{f.Cert, f.Key} {
		if _, err := os.Lstat(p); err == nil {
			return Files{}, fmt.Errorf("%w: %s already exists (remove it first to issue a new certificate for %q)", ErrExists, p, req.Identity.Name)
		}
	}
	ca, err := LoadCA(dir)
	if err != nil {
		return Files{}, err
	}
	certPEM, keyPEM, err := ca.Issue(req)
	if err != nil {
		return Files{}, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return Files{}, fmt.Errorf("certs: %w", err)
	}
	if err := writeFiles([]file{{f.Key, keyPEM, 0o600}, {f.Cert, certPEM, 0o644}}); err != nil {
		return Files{}, err
	}
	return f, nil
}

type file struct {
	path string
	data []byte
	mode os.FileMode
}

// writeFiles creates every file exclusively; when one fails, the ones it
// created are removed.
func writeFiles(files []file) error {
	var created []string
	for _, f := range files {
		if err := writeExclusive(f.path, f.data, f.mode); err != nil {
			for _, p := range created {
				_ = os.Remove(p)
			}
			return err
		}
		created = append(created, f.path)
	}
	return nil
}

func writeExclusive(path string, data []byte, mode os.FileMode) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%w: %s already exists", ErrExists, path)
	}
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if _, err := fh.Write(data); err != nil {
		fh.Close()
		_ = os.Remove(path)
		return fmt.Errorf("certs: write %s: %w", path, err)
	}
	if err := fh.Sync(); err != nil {
		fh.Close()
		_ = os.Remove(path)
		return fmt.Errorf("certs: write %s: %w", path, err)
	}
	if err := fh.Close(); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("certs: write %s: %w", path, err)
	}
	return nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certs: serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}
