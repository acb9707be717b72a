// Package history records what the clients of a walden cluster saw — every
// append with its result, every read, every stream and broker state read
// from the catalog, every lease answer of a broker's agent — each with its
// invoke and complete times, and checks it: a Porcupine model of a stream
// (appends acknowledged at consecutive, increasing offsets; a read of the
// owner returns exactly the stream's content from its offset on; no append
// acknowledged under a stream epoch the client already saw closed or
// superseded) decides whether the history is linearizable, and direct
// counts find stale writes and stale lease answers.
//
// It records through a gRPC client interceptor, so the producer and the
// reader need no change to be recorded. It judges only what clients saw:
// it never reads a process's files or logs.
package history
