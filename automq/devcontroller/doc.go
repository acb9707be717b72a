// Package devcontroller is a development stand-in for the stream-metadata
// side of an AutoMQ 1.4.1 KRaft controller quorum, for walden's end-to-end
// tests, `walden dev --broker automq` and the chaos harness, where no AutoMQ
// (Java) can run. It is for development and tests only: it keeps everything
// in memory, persists nothing and replicates nothing.
//
// # What it owns
//
// State is the stream metadata as StreamControlManager and
// S3ObjectControlManager of AutoMQ 1.4.1 keep it, and applies each request
// with their rules, in their order, with their error codes:
//
//   - nodes: id → node epoch and failover flag (NodeWALMetadataRecord). Every
//     request but PrepareS3Object is checked against them: an unknown node
//     gets NODE_EPOCH_NOT_EXIST, an older epoch NODE_EPOCH_EXPIRED, a node
//     whose failover flag is set NODE_FENCED (not for CloseStreams, nor for a
//     CommitStreamSetObject in failover mode). GetOpeningStreams registers
//     the node or records a newer epoch, and sets or clears the flag with
//     its FailoverMode.
//   - streams: epoch, OPENED/CLOSED, ranges (owner node, epoch, offsets),
//     start and end offsets, stream objects. OpenStreams, CloseStreams and
//     the commit checks follow openStream, retryOpen, closeStream,
//     streamOwnershipCheck and streamAdvanceCheck (see each method).
//   - S3 objects: ids handed out in order by PrepareS3Object, PREPARED until
//     a deadline, then COMMITTED as a stream-set object (with its order id
//     and per-stream ranges) or a stream object, or MARK_DESTROYED.
//   - node registrations for AutomqGetNodes (NodeControlManager).
//
// Controller serves State over the Kafka protocol of a controller listener,
// to walden's AutoMQ client and to the AutoMQ-mode reference broker
// (frames and messages from package walden/automq/protocol):
//
//   - N voters, one listener each, sharing one State; one is active
//     (SetActive moves it), the others answer NOT_CONTROLLER as a standby
//     KRaft controller does — in each stream's answer for OpenStreams and
//     CloseStreams (each stream is its own controller event in AutoMQ),
//     top-level for the others;
//   - ApiVersions v0–v3 (a higher version gets UNSUPPORTED_VERSION with
//     ApiVersions' own range, KIP-511), always with response header v0;
//   - optional TLS, optional SASL: SaslHandshake v1 and SaslAuthenticate
//     v0–v2 with PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, the
//     server side written here on crypto/pbkdf2 and crypto/hmac; credentials
//     are kept as salted keys, never passwords). A failed exchange answers
//     SASL_AUTHENTICATION_FAILED and closes the connection, and any other
//     request before authentication closes it, as Kafka does;
//   - test hooks armed through Config.Faults while it runs: an error code
//     for an API, a garbage answer, a frame cut in the middle (after
//     applying), a delayed answer, a connection closed after applying and
//     before answering;
//   - Snapshot and HTTPHandler show the whole state (nodes, streams with
//     their ranges, objects with their keys, sizes, kinds and per-stream
//     ranges, the answers given) to tests and verifiers.
//
// # What it simplifies, and why
//
//   - Streams come from configuration (CLOSED, epoch −1, offsets 0, as
//     CreateStreams leaves them); CreateStreams, DeleteStreams, TrimStreams,
//     CommitStreamObject, DescribeStreams and the KV APIs are not served.
//   - Node locking (NODE_LOCKED, AutoMQ's circuit breaker) is not modelled.
//   - AutoMQ 1.4.1 checks a prepared object's deadline only every 30 minutes
//     or more, so a commit shortly after the deadline may still pass there.
//     Here an object is expired from the moment its deadline has passed
//     (S3Object.isExpired: now > deadline): the stricter reading, which a
//     client must handle anyway (OBJECT_NOT_EXIST: prepare again).
//   - A negative PreparedCount would hand out object ids again in AutoMQ;
//     here it gets INVALID_REQUEST and ids never go back.
//   - AutoMQ 1.4.1 (metadata version V2) keeps no ranges in a stream-set
//     object's metadata record (they are in the object's index); the
//     development controller keeps them so that a verifier can find every
//     record without listing the bucket. It never reads or deletes S3
//     objects: destroyed objects stay in the bucket.
//   - Open-source AutoMQ 1.4.1 brokers never send AutomqRegisterNode, so its
//     controller lists no node in AutomqGetNodes; here nodes are registered
//     by configuration (or RegisterNode), and a node's state (derived from
//     heartbeats in AutoMQ) is ACTIVE unless set otherwise.
//   - Requests are applied one at a time under one lock, as the active
//     controller's single event loop does; there is no raft log, and the
//     "voters" share one State, so moving the active voter loses nothing.
//   - SASL: no SASLprep of user names and passwords, no SCRAM extensions
//     (delegation tokens), no re-authentication (KIP-368), no SaslHandshake
//     v0 (unframed tokens); no ACLs (AutoMQ 1.4.1 checks none on these APIs).
//   - A request of an API or version the controller does not serve, or one
//     it cannot decode, closes the connection (Kafka answers some with an
//     error instead; a client sees a failed request either way).
//   - Where AutoMQ's behaviour is plainly accidental the answer is the one a
//     client sees there: a redundant commit of a committed object answers
//     NONE (not REDUNDANT_OPERATION); a commit whose stream's current range
//     belongs to another node answers STREAM_INNER_ERROR; compacting an
//     object that is not one of the node's stream-set objects answers
//     UNKNOWN_SERVER_ERROR (a NullPointerException there).
//
// # What it must never do
//
// Run in production or stand in for a real AutoMQ controller's durability:
// its state lives and dies with the process. Read a clock inside State: time
// is passed in. Change anything when it refuses a request.
package devcontroller
