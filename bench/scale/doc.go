// Command scale measures how many brokers one walden cluster supervises: it
// runs 3 coordinator processes (`walden server`, default policy unless
// -policy tuned) against 10, 100, 1,000 and 5,000 brokers and prints, per
// number of brokers, each coordinator's CPU (cores) and RSS, the raft
// entries and the lease renewals per second, the probes the agents
// answered per second, and the detection latency (kill → FAILED committed,
// on the leader) of brokers killed among them, with the false failovers and
// the lease lapses of the live brokers; -o json prints the same rows for
// scripts.
//
// The brokers are lightweight simulated agents hosted by load processes
// (this binary run with -load, -per-process agents each), so that the load
// generator's limits stay apart from the coordinators': each agent has an
// address of its own in 127.0.0.0/8, registers, renews its lease with every
// voter on connections of its own as package agent does (over frames, a
// gRPC stream or one call each: -transports), answers the
// coordinators' probes through the agent's HTTP limits, and, for
// -gossip-members of them spread evenly over the load processes, is a
// memberlist gossip member. The load processes' own CPU and memory are
// reported beside the coordinators'.
//
// It owns only its temporary directory (removed on exit unless -keep), the
// processes it starts (killed if it dies) and the loopback addresses it
// binds; every phase is bounded in time.
//
// Usage (from the bench module):
//
//	go run ./scale [-brokers 10,100,1000,5000] [-kills 20] [-steady 60s]
//		[-transports unary,stream,frames,frames-direct,frames-epoll] [-slots 0,100ms] [-baseline OTHER-WALDEN]
//		[-per-process 1000] [-gossip-members 1000] [-policy default|tuned] [-o table|json]
//
// Every number of brokers is measured with every variant side by side: the
// -baseline binary if given, then each transport with each renewal slot of
// the coordinators (renewals.slot; 0 turns the slots off). The transports:
// frames (package agent's default: one connection of frames per agent and
// coordinator, plain with renewframe's preface, as the coordinators here
// run without TLS; a coordinator that does not serve frames fails those
// renewals, none is measured over another transport), frames-direct (the
// same connections and frames on the wire, renewed by the load generator's
// own loop, directRenewer, instead of package agent's Renewer: the
// coordinators see the same traffic while the load processes spend less on
// each renewal, so that one host can simulate a larger fleet), frames-epoll
// (the same connections and frames again, every connection of a load
// process driven by one goroutine through an epoll set of its own,
// renewLoop: the lightest load side, on Linux), stream (one gRPC
// stream each) and unary (one RenewLease call per renewal, as agents
// before streamed renewals did).
//
// The figures and what they say: docs/scale.md.
package main
