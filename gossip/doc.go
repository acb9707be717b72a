// Package gossip runs walden's membership pool on hashicorp/memberlist: the
// coordinators and the broker agents of one cluster gossip with each other so
// that every coordinator learns quickly when a member stops answering.
//
// It owns the memberlist instance of one process (Pool), the node metadata
// every member advertises (Meta: role, cluster name, id, agent and admin
// addresses), the refusal of members of another cluster (an AliveDelegate and
// a MergeDelegate compare Meta.ClusterName), the optional gossip encryption
// key read from a file, and a bounded event queue: memberlist's callbacks only
// enqueue Join, Leave, Update and Ping events, and a consumer reads them from
// Pool.Events. For tests, Faults injects packet loss, delay and cut links
// into what a member sends, and Listen binds a member's sockets (TCP and UDP
// on one port) for a caller that hands them to Start (Config.Listener)
// instead of an address it would have to pick free.
//
// It must never decide anything: gossip suggests, Raft decides. A Leave event
// (memberlist declared the member dead, or it left) is one input for the
// observer, never a failover by itself. memberlist v0.7.0 does not expose its
// suspicion of a member through its public API, so this package reports only
// alive, dead and left.
//
// It must never block memberlist: a callback takes a short lock, appends to
// the queue and returns. When the consumer is slow, Ping events of one member
// are coalesced and then the oldest events are dropped and counted
// (Stats.EventsDropped); a consumer that sees drops reconciles with
// Pool.Members. It never calls back into memberlist from a callback.
package gossip
