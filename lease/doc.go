// Package lease is walden's quorum lease: the rule by which a broker's agent
// knows it may still acknowledge writes, and the rule by which a coordinator
// may promise that it no longer can.
//
// The agent renews with every coordinator in parallel. Each coordinator
// grants from its own clock (Grantor) and remembers nothing else about the
// grant; the agent (Holder) counts a grant live until the moment it sent the
// renewal plus the granted TTL minus a safety margin, and holds a valid lease
// while a majority of the voters' grants are live. A coordinator attests that
// its grant for (broker, epoch) expired only after its own clock says the
// grant plus a drift allowance is over, and from then on promises to grant
// that epoch nothing more (durably, across restarts). The failover decision
// needs a majority of such attestations; any two majorities share a
// coordinator, so no decision is made while the agent still counts a
// majority of live grants. docs/safety.md gives the argument and the margins.
//
// Times are readings of one machine's boot clock (CLOCK_BOOTTIME on Linux),
// which keeps running while the host is suspended; readings of two machines
// are never compared; the grants made together may share one reading
// taken after all their renewals arrived (Readings). The package does no
// network I/O; Grantor persists its promises through a Store.
package lease
