// Package raftnode runs one member of walden's Raft group on go.etcd.io/raft/v3.
//
// It owns the raft.Node (one goroutine drives it and hands each Ready to a
// raftlog.Storage: persist, send, apply, advance), the peer transport
// (Transport, gRPC streams in production and an in-memory network with fault
// hooks in tests), when to snapshot and compact the log, membership changes
// (ConfChangeV2), ReadIndex, the wait registry that returns an applied
// result to the proposer, and the offline rewrites of a log for disaster
// recovery (WriteRestoredState, ForceNewCluster). The log on disk is
// package raftlog's.
//
// It never interprets commands: it hands committed entries to a StateMachine
// and never reads clocks or randomness on behalf of it. It must never send a
// message that depends on state it has not yet persisted, and never starts on
// a data directory it cannot read whole.
package raftnode
