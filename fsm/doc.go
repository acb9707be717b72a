// Package fsm is walden's replicated state machine: one State, changed only
// by applying committed raft entries in log order, and serialized into raft
// snapshots as a walden.v1.StateSnapshot.
//
// It owns the cluster's membership as the log describes it (ids and
// addresses of the coordinators), the applied index and the time carried by
// the last applied command, and walden's replicated domains, one file each:
// brokers, observations, failover decisions and fencing tokens (brokers.go),
// runtime policy overrides (policyops.go), the bounded event log
// (events.go; each event's typed fields, and its message rendered from
// them, eventtext.go), the stream catalog with the streams' idempotent-producer
// tables (catalog.go) and the recovery jobs
// (jobs.go). Every command is validated fully before anything changes: a
// refused command returns an error wrapping a fencing sentinel and leaves
// the state as it was.
//
// It must never read a clock, draw random numbers or do I/O: the same
// entries in the same order produce the same State on every member. Time and
// choices enter only as values inside the commands. It never imports
// raftnode, the server or any transport; raftnode drives it through the
// raftnode.StateMachine interface.
package fsm
