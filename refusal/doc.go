// Package refusal names every way walden refuses a request: the reasons
// programs match on (NODE_FENCED, EPOCH_EXPIRED, NOT_LEADER...), and the
// sentinel errors the replicated state machine, the fencing rule and the
// recovery return. It knows nothing of transports: package rpcerr holds the
// one table that turns a reason into a gRPC code and a google.rpc.ErrorInfo
// detail, and decodes them on the client's side.
//
// It is pure: no I/O, no clock, no gRPC.
package refusal
