package certs

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	pkcs12 "software.sslmate.com/src/go-pkcs12"
)

// MinP12PasswordLen is the shortest passphrase a PKCS#12 bundle is
// written with: the bundle holds a private key, and whoever has the file
// and the passphrase acts with the certificate's role.
const MinP12PasswordLen = 8

// ErrP12Password means the passphrase of a PKCS#12 bundle is too short or
// missing; nothing was written.
var ErrP12Password = errors.New("certs: unusable PKCS#12 passphrase")

// P12 bundles a certificate, its private key and the CA that signed it
// (all PEM) into a PKCS#12 file encrypted with password, in the form
// browsers import (Chromium and Firefox through their certificate
// settings, or NSS's pk12util): AES-256-CBC with PBKDF2-HMAC-SHA-256 for
// the key and the certificates, an HMAC-SHA-256 integrity check.
func P12(certPEM, keyPEM, caPEM []byte, password string) ([]byte, error) {
	if len(password) < MinP12PasswordLen {
		return nil, fmt.Errorf("%w: it must have at least %d characters", ErrP12Password, MinP12PasswordLen)
	}
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("certs: certificate: %w", err)
	}
	ca, err := parseCertPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	blk, _ := pem.Decode(keyPEM)
	if blk == nil {
		return nil, errors.New("certs: private key: no PEM block")
	}
	key, err := parseKey(blk)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, errors.New("certs: the private key is not the certificate's")
	}
	der, err := pkcs12.Modern.Encode(key, cert, []*x509.Certificate{ca}, password)
	if err != nil {
		return nil, fmt.Errorf("certs: encode PKCS#12: %w", err)
	}
	return der, nil
}

// WriteP12 writes the PKCS#12 bundle of the certificate and key files
// issued for files (with the CA of dir) to path, readable by its owner
// only, refusing to overwrite it.
func WriteP12(dir string, files Files, path, password string) error {
	read := func(p string) ([]byte, error) {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("certs: %w", err)
		}
		return b, nil
	}
	certPEM, err := read(files.Cert)
	if err != nil {
		return err
	}
	keyPEM, err := read(files.Key)
	if err != nil {
		return err
	}
	caPEM, err := read(filepath.Join(dir, CAFile))
	if err != nil {
		return err
	}
	der, err := P12(certPEM, keyPEM, caPEM, password)
	if err != nil {
		return err
	}
	return writeExclusive(path, der, 0o600)
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}
