// Package mtls builds walden's mutual-TLS settings from a config.TLS
// section: the server side (a certificate, and client certificates required
// and checked against ca_file), the client side (the same certificate
// presented, servers checked against ca_file and required to carry the role
// dialled), and their gRPC transport credentials, plain when TLS is off.
//
// What it owns: reading the PEM files a config.TLS names (their type, size
// and permissions checked first) and the TLS parameters every walden
// listener and client uses (TLS 1.2 at least); the checks that a
// certificate is the process's own identity and that gossip is encrypted
// whenever TLS is on; handshake failures explained in a sentence; and the
// reload of those settings for certificate rotation (Reloader, and Files
// for a process's tls section read again at SIGHUP): every new connection
// uses the last successful load, a failed one changes nothing.
//
// What it must never do: decide whether TLS is wanted (the configuration
// does), listen, dial, or read any file other than the ones a section names
// (and the gossip.key that walden certs init writes beside its ca_file).
// Its errors carry no package prefix: callers wrap them with their own
// sentinel (e.g. "agent: invalid config: tls.ca_file: ...").
package mtls
