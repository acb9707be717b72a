// Package fencing owns walden's fencing tokens and the refusals that protect
// them: the Token type (a broker epoch, issued only by raft commit), the
// sentinel errors with their machine-readable reasons (EPOCH_EXPIRED,
// NODE_FENCED, ...), the broker-epoch rule (Check), a Guard for storage that
// verifies tokens itself, and the mapping of those errors to gRPC statuses
// with a google.rpc.ErrorInfo detail and back.
//
// It is pure: it must never issue tokens (only the replicated state machine
// does, by applying a committed entry), read a clock, or do I/O.
package fencing
