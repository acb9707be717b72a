// Package raftnode runs one member of walden's Raft group on go.etcd.io/raft/v3.
//
// It owns the raft.Node (one goroutine drives it), the durable log (Storage:
// segment files of frames, one fdatasync per Ready, with the snapshots and the
// data directory's identity in bbolt), the peer transport (Transport, gRPC
// streams in production and an in-memory network with fault hooks in tests),
// snapshots and log compaction, membership changes (ConfChangeV2) and the
// wait registry that returns an applied result to the proposer.
//
// It never interprets commands: it hands committed entries to a StateMachine
// and never reads clocks or randomness on behalf of it. It must never send a
// message that depends on state it has not yet persisted, and never starts on
// a data directory it cannot read whole.
package raftnode
