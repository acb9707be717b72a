// Package rpcerr is where walden's refusals meet gRPC: the one table that
// maps each refusal.Reason to a gRPC code, the status every service answers
// with (the code, a message that starts with the reason, and a
// google.rpc.ErrorInfo detail of domain "walden" with the reason and its
// metadata), and the decoding clients use to read the reason back. Like
// etcd's toGRPCErrorMap, it keeps the transport out of the state machine:
// fsm, fencing and recovery return refusal errors and never see a code.
package rpcerr
