// Package agent holds one broker's registration and lease with the walden
// coordinators. It is the code behind `walden agent` (a sidecar for brokers
// in any language, answering GET /v1/lease on a local HTTP endpoint) and a Go
// library for brokers written in Go (Lease, Check, WaitRegistered,
// OnEpochChange).
//
// What it owns:
//   - registering the broker through any coordinator (following leader hints,
//     waiting while a recovery job for the broker is running);
//   - renewing the lease every lease_ttl/3 and self-fencing on the monotonic
//     clock: the lease is confirmed until t_sent + lease_ttl - safety_margin,
//     where t_sent is when the last successful renewal was sent, so that the
//     broker stops acknowledging writes strictly before the leader (which
//     measures from when it received the renewal, plus a drift margin) could
//     declare it failed;
//   - re-registering (a new epoch) after the cluster refuses the old epoch
//     with NODE_FENCED or EPOCH_EXPIRED;
//   - the agent's membership in the gossip pool (role "agent") and the local
//     HTTP endpoint that the broker asks and the coordinators probe.
//
// What it must never do: decide that a broker failed, touch the broker's WAL,
// report a lease as valid from a wall-clock comparison, or report it valid
// after the instant it can no longer be sure the cluster still honours it.
package agent
