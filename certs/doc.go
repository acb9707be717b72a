// Package certs makes the certificates of a walden deployment: a CA of the
// cluster's own, and certificates it signs that carry an identity (a name,
// one role and, for agents and brokers, one broker id) in the form package
// authz reads. It also writes the gossip encryption key that members and
// agents find beside the CA certificate. `walden certs init|issue` is its
// command line; `walden dev` and the tests use it directly.
//
// What it owns: key generation (ECDSA P-256), the certificate templates
// (validity, key usages, host names), and the files: ca.pem, ca-key.pem,
// gossip.key, NAME.pem and NAME-key.pem, private keys readable by their
// owner only.
//
// What it must never do: overwrite a file (a second `init` in the same
// directory is refused, so a CA's key is never lost to a typo), or put a
// role into a certificate other than through authz.Subject.
package certs
