// Package fsm is walden's replicated state machine: one State, changed only
// by applying committed raft entries in log order, and serialized into raft
// snapshots as a walden.v1.StateSnapshot.
//
// It owns the cluster's membership as the log describes it (ids and
// addresses of the coordinators), the applied index and the time carried by
// the last applied command; later work adds brokers, epochs, recovery jobs
// and streams the same way: a field of State, a case in Apply and an apply
// function of its own.
//
// It must never read a clock, draw random numbers or do I/O: the same
// entries in the same order produce the same State on every member. Time and
// choices enter only as values inside the commands. It never imports
// raftnode, the server or any transport; raftnode drives it through the
// raftnode.StateMachine interface.
package fsm
