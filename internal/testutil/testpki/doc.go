// Package testpki issues the certificates of tests: a CA of the test's own
// in a temporary directory, and certificates for any identity, the way
// `walden certs` issues them. It is apart from package testutil, which
// every package's tests may import, because it depends on certs and config.
package testpki
