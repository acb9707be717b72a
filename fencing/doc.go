// Package fencing owns walden's fencing tokens: the Token type (a broker
// epoch, issued only by raft commit), the broker-epoch rule (Check: a fenced
// broker is refused with refusal.ErrNodeFenced, any epoch but the current
// one with refusal.ErrEpochExpired), and Guard, for storage that verifies
// tokens itself (the highest token seen per resource; a lower one refused).
// The refusals it returns are package refusal's sentinels, wrapped with the
// epochs in question; their gRPC form is package rpcerr's.
//
// It is pure: it must never issue tokens (only the replicated state machine
// does, by applying a committed entry), read a clock, or do I/O.
package fencing
