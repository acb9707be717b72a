// Package mtls builds walden's mutual-TLS settings from a config.TLS
// section: the server side (a certificate, and client certificates required
// and checked against ca_file), the client side (the same certificate
// presented, servers checked against ca_file), and their gRPC transport
// credentials, plain when TLS is off.
//
// What it owns: reading the PEM files a config.TLS names and the TLS
// parameters every walden listener and client uses (TLS 1.2 at least).
//
// What it must never do: decide whether TLS is wanted (the configuration
// does), listen, dial, or read any file other than the ones it is given.
// Its errors carry no package prefix: callers wrap them with their own
// sentinel (e.g. "agent: invalid config: tls.ca_file: ...").
package mtls
