// Package connlimit bounds what the connections of one listener of a
// walden process can cost, for every gRPC server (a coordinator's admin and
// raft listeners, a broker's data API) and, through package httplimit,
// every HTTP server: how many connections are open at once, in all and
// from one source address; how long a new connection has for its TLS and
// HTTP/2 handshakes; how many calls one connection has in flight; how
// often a client may ping. Each bound is a configuration key with a safe
// default (Defaults), and what each one refused is counted in metrics
// (walden_listener_*). Two floods of 10,500 idle connections without a
// certificate once filled a coordinator's file descriptors, and waldenctl
// status and /readyz stopped answering.
//
// What it owns: the listener that counts and bounds connections, the gRPC
// server options of a bounded listener, the counting of failed TLS
// handshakes, and the listeners' metrics.
//
// What it must never do: decide what is served or who may call it (package
// authz), read a connection's bytes, or block a listener's Accept for
// anything but its own bound.
package connlimit
