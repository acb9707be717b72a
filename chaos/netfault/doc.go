// Package netfault injects network faults into a netns.Topology with the
// kernel's own tools, in the bridge's namespace only:
//
//   - cuts: an nftables table of the bridge family whose forward-hook rule
//     drops, silently, every packet from one node's address to another's
//     listed in a set; a cut is one element (one direction), healing
//     removes it;
//   - loss and jitter: iptables rules (br_netfilter) send a node's packets
//     to an NFQUEUE queue, where a userspace Delayer, built on
//     github.com/florianl/go-nfqueue, drops a share of them and releases
//     the rest after a random delay (the kernel here has no sch_netem, and
//     nftables' queue statement is not built in).
//
// It must never act outside the topology's bridge namespace, and every
// Delayer is bounded: packets held at once, the delay of each, and its
// life (Stop, or the context given to Start).
package netfault
