// Package netns builds the chaos harness's network: one Linux network
// namespace per process (the S3 server, the coordinators, the brokers, the
// client), each with one veth whose peer is a port of a bridge that lives
// in a namespace of its own, addresses only inside those namespaces
// (198.18.0.0/24, the range RFC 2544 sets aside for benchmarking networks),
// and the tools to act in them: commands run inside a namespace (`ip netns
// exec`), connections dialled from one (setns on a locked thread),
// nftables and iptables run in the bridge's namespace.
//
// It owns every namespace, veth and rule whose name starts with Prefix, and
// nothing else: Create first removes what an earlier, killed run left under
// that prefix (its processes too), Close removes all of it, and a lock file
// keeps two runs from sharing the prefix. It never touches the host's own
// namespace beyond the lock file, the /run/netns entries of its namespaces
// and one nftables table there (wchaos_guard) that rejects every packet to
// the harness's subnet, so that a connection dialled by mistake from the
// host's namespace fails at once instead of leaving the machine.
package netns
