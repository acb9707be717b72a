// Package controller is walden's client of the active KRaft controller of
// an AutoMQ 1.x cluster: the six extension APIs a failover needs
// (GetOpeningStreams, PrepareS3Object, CommitStreamSetObject, CloseStreams,
// OpenStreams, AutomqGetNodes), called in the caller's terms (int32 node
// ids, int64 epochs and offsets) over the controller listener.
//
// What it owns:
//
//   - finding the active controller: the voter that answered last first,
//     then each voter of controller.quorum.voters in turn, moving on at
//     NOT_CONTROLLER, a refused connection or a dead address, remembering
//     the one that answered;
//   - the version of each request: the highest both walden and the voter
//     speak, from the voter's ApiVersions (CommitStreamSetObject and
//     OpenStreams v1 when the controller has them, else v0 — and then
//     object attributes or stream tags are refused before anything is
//     sent, never dropped);
//   - deadlines and retries: every attempt at a voter is bounded by
//     Config.RequestTimeout (connecting included) and every call by its
//     context and Config.Attempts rounds over the voters, with a growing
//     backoff between rounds. A request is sent again only when that is
//     harmless: always when it was not sent (the connection failed) or a
//     standby answered NOT_CONTROLLER; after a lost answer (a connection
//     that died, a deadline, an answer that does not decode) or a
//     retriable code (REQUEST_TIMED_OUT) only for GetOpeningStreams and
//     AutomqGetNodes (the same epoch and flag leave the controller as the
//     first call did), CloseStreams (a closed stream closes again),
//     CommitStreamSetObject (the controller answers a repeated commit of
//     the same object as done: REDUNDANT_OPERATION or success) and
//     PrepareS3Object (ids held by a lost answer are never used and expire
//     after their time to live). OpenStreams is never sent again after a
//     lost answer: it fails with ErrOutcomeUnknown;
//   - the controller's answers as named errors: every error code, top-level
//     or per stream, is a *protocol.APIError naming the API and the stream
//     (errors.Is(err, protocol.ErrNodeFenced)); per-stream results are
//     returned per stream.
//
// franz-go's kgo holds the connections, TLS, SASL (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512) and kgo's own ApiVersions; package protocol encodes the
// messages.
//
// What it must never do: decide a failover's steps (whether a stream is
// skipped, whether an OFFSET_NOT_MATCHED after a partial attempt means
// done), send a request again that is not safe to repeat, wait without a
// deadline, or send a request at a version that would drop a field.
package controller
