// Package protocol is the wire form of AutoMQ 1.4.1's controller extension:
// the six messages walden sends to (and a development controller answers
// from) the active KRaft controller of an AutoMQ cluster, their frames and
// their error codes. docs/automq-protocol.md describes them.
//
// What it owns:
//
//   - OpenStreams (502, v0–1), CloseStreams (503, v0), PrepareS3Object
//     (505, v0), CommitStreamSetObject (506, v0–1), GetOpeningStreams (508,
//     v0) and AutomqGetNodes (514, v0), request and response, encoded and
//     decoded by hand in Kafka's flexible encoding (compact strings and
//     arrays, unsigned varints, a tagged-field section after every struct).
//     Each is a kmsg.Request or kmsg.Response, so that franz-go's kgo
//     client sends them; ApiVersions is kmsg's own, which encodes AutoMQ's
//     ApiVersions v3 frames byte for byte;
//   - the frames: the size prefix, request header v2 (v1 for requests that
//     are not flexible), response header v1 (v0 for ApiVersions, always);
//   - the error codes: AutoMQ's range 501–516 and 599 and the Kafka codes
//     that matter to a failover, each a named error (errors.Is(err,
//     ErrNodeFenced)) with a sentence for operators and whether a retry may
//     succeed, and the reference table of them.
//
// What it must never do:
//
//   - encode a value that the message's version cannot carry: a field the
//     version does not have that holds a value other than its default
//     (Attributes at CommitStreamSetObject v0, Tags at OpenStreams v0) is
//     refused with ErrFieldNotInVersion, as AutoMQ's own writer refuses it;
//   - panic, or allocate more than its input can hold, on any input: a cut
//     frame is ErrTruncated and a garbled one ErrMalformed, each naming the
//     message, the field and the byte offset; a message is changed only by
//     a decode that succeeds;
//   - accept a frame that it would not encode back to the same bytes
//     (overlong varints, bools other than 0 or 1, tags out of order,
//     trailing bytes);
//   - do I/O beyond the io.Reader given to ReadFrame, or decide anything:
//     which version to send, whom to ask and what to retry are package
//     controller's.
//
// The byte-level ground truth is AutoMQ's own frames, copied into
// testdata/ from the vectors AutoMQ 1.4.1's Java classes produced.
package protocol
