// Package objformat encodes and decodes the objects that walden uploads to
// S3: the record batches of one or more streams taken from a broker's WAL,
// grouped into one section per stream, followed by an index of the sections
// and a fixed-size footer. The layout is described byte by byte in
// docs/object-format.md.
//
// It owns:
//
//   - the Builder, which accepts batches in offset order per stream and
//     refuses a batch that does not start where the stream's previous batch
//     ended, then writes the object to a byte slice or an io.Writer;
//   - the readers (ReadIndex, ReadSection, ParseSection), which verify the
//     footer, index and section checksums before returning anything;
//   - the deterministic object key and object id of an upload (Key,
//     ObjectID), so that a retried upload rewrites the same key.
//
// It must never:
//
//   - return a batch from a section, index or footer whose CRC32C does not
//     match, or whose offsets disagree with the index;
//   - panic on any input: a damaged or truncated object is an error;
//   - do I/O of its own beyond the io.ReaderAt / io.Writer it is given.
package objformat
