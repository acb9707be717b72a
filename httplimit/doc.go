// Package httplimit bounds what one HTTP listener of a walden process can
// cost: how long a client may take to send its headers, how big they may
// be, how long an idle keep-alive connection is kept, and how many
// connections are open at once. Every HTTP server of walden (a
// coordinator's /metrics, /healthz, /readyz and web view, an agent's lease
// endpoint) is built here, so that a flood of idle connections cannot
// exhaust a process's file descriptors while the cluster still shows it
// healthy.
//
// It never decides what is served, and never reads or writes anything but
// the connections it is given.
package httplimit
