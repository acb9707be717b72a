// Package agent holds one broker's registration and lease with the walden
// coordinators. It is the code behind `walden agent` (a sidecar for brokers
// in any language, answering GET /v1/lease on a local HTTP endpoint) and a Go
// library for brokers written in Go (Lease, Check, WaitRegistered,
// OnEpochChange).
//
// What it owns:
//   - registering the broker through any coordinator (following leader hints,
//     waiting while a recovery job for the broker is running);
//   - renewing the quorum lease with every voter every lease_ttl/3 and
//     self-fencing on the boot clock (lease.Holder): a voter's grant counts
//     until t_sent + lease_ttl - safety_margin, where t_sent is when the
//     renewal it answered was sent, and the lease is valid while a majority
//     of the voters' grants count, so that the broker stops acknowledging
//     writes strictly before a majority of coordinators (each measuring from
//     when it granted, plus a drift margin) may attest that it expired;
//   - carrying the renewals to each coordinator over one long-lived stream
//     (renewal.go: Renewer), or one call each to a coordinator of an
//     earlier walden that does not serve the stream;
//   - re-registering (a new epoch) after the cluster refuses the old epoch
//     with NODE_FENCED or EPOCH_EXPIRED;
//   - the agent's membership in the gossip pool (role "agent") and the local
//     HTTP endpoint that the broker asks and the coordinators probe;
//   - watching the broker when configured (supervisor.go): starting it as
//     its child or finding it by a pid file, checking it (TCP connect,
//     health command), and when it dies stopping the renewals, answering
//     the probes 503, and registering again once the cluster could fail it
//     over;
//   - the watchdog (watchdog.go) for a broker that never checks its lease:
//     a separate process, told at every change the instant the broker must
//     be dead by (the lease's validity end minus watchdog.kill_margin),
//     that kills the broker's process group then on its own timer, so that
//     the broker is dead before any majority of the coordinators may attest
//     — also when the agent itself stalls;
//   - reporting an AutoMQ broker's node id and the node epoch of its WAL
//     header at registration.
//
// What it must never do: decide a failover (it can only stop vouching for
// its broker), write the broker's WAL (it reads an AutoMQ WAL's header,
// read-only), report a lease as valid from a wall-clock comparison, report
// it valid after the instant it can no longer be sure the cluster still
// honours it, let a broker that does not check its lease run without a
// deadline in the watchdog, or kill a process it cannot tell is the broker
// (a pid is checked against the process's start time first).
package agent
