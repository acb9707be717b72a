package server

import (
	"net"

	"google.golang.org/grpc/credentials"

	"walden/detect"
)

// Option changes how New builds a member. Production passes none; tests
// hand over listeners they bound themselves and inject faults.
type Option func(*options)

type options struct {
	listeners Listeners
	// prober replaces the observer's HTTP probes of the agents' /healthz.
	prober detect.Prober
	// raftCreds wraps the credentials of the member's raft connections.
	raftCreds func(credentials.TransportCredentials) credentials.TransportCredentials
	// quiet runs none of the loops that propose on their own (observer,
	// decider, maintenance expiry, recovery jobs): only requests change
	// the state.
	quiet bool
}

// Listeners are listeners the caller bound already, used instead of
// binding the config's listen addresses (a nil one is bound from the
// config). A test binds port 0 and hands the listener over, so that no
// port is ever guessed free and then taken by someone else. The server
// closes them when it stops, or when New fails.
type Listeners struct {
	Admin, Raft, HTTP, Metrics net.Listener
}

// WithListeners makes New use the given listeners.
func WithListeners(l Listeners) Option {
	return func(o *options) { o.listeners = l }
}

// withProber makes the member's observer probe agents through p instead of
// HTTP (tests inject probe faults with it).
func withProber(p detect.Prober) Option {
	return func(o *options) { o.prober = p }
}

// withoutLoops makes Run start none of the loops that propose on their own
// (the API fuzzer compares the state before and after each request).
func withoutLoops() Option {
	return func(o *options) { o.quiet = true }
}

// withRaftCredentials wraps the credentials of the member's raft peer
// connections (tests inject link faults into its raft traffic with it).
func withRaftCredentials(wrap func(credentials.TransportCredentials) credentials.TransportCredentials) Option {
	return func(o *options) { o.raftCreds = wrap }
}
