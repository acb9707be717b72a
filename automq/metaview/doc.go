// Package metaview reads AutoMQ streams the way an AutoMQ broker finds them
// in its KRaft metadata image: from the controller's view of the stream
// metadata (each stream's epoch, state, owner and end offset; the committed
// S3 objects with their per-stream ranges) and the AutoMQ objects in S3.
// Open-source AutoMQ 1.4.1 replicates that metadata to its brokers through
// the metadata log; walden's development AutoMQ controller serves the same
// facts as JSON (GET /v1/streams, /v1/objects), which is what Client reads.
//
// It owns:
//
//   - Client, the HTTP client of the view (the development controller's
//     /v1 endpoints, decoded into its own types);
//   - Segments, the committed ranges of one stream in offset order, each
//     with the object that holds it, refusing an overlap and naming a gap;
//   - Reader, which reads a stream's records from those objects through
//     package automq/object (the index, then the stream's blocks, every
//     one checked).
//
// The reference broker in mode automq (reads, and the producer state it
// rebuilds when it opens a stream), `walden verify --automq` and
// `walden dev --broker automq` use it.
//
// It must never write anything (S3 or the controller), return a record from
// an object that does not check out, or paper over a gap or an overlap in
// a stream's committed ranges: both are reported.
package metaview
