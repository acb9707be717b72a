// Package object writes and reads the S3 objects of AutoMQ 1.4 byte for
// byte: the stream-set objects and stream objects that an AutoMQ broker
// uploads from its WAL (s3stream's ObjectWriter and ObjectReader), the key
// each object is stored under, and the attributes the controller records
// for it. walden's AutoMQ recovery uses it to upload a dead broker's WAL
// records so that AutoMQ's own brokers can read them.
//
// It owns:
//
//   - the layout (format.go): data blocks of one stream each, the index of
//     36-byte entries, the 48-byte footer, and the stream record batch
//     encoding of the records inside the blocks;
//   - the Writer, which streams one object to an io.Writer with AutoMQ's
//     block splitting rule and ordering rules, refusing what AutoMQ's writer
//     refuses (and a little more: gaps in a stream's offsets), and copies
//     records that are already encoded (a WAL record body) without
//     re-encoding them; the Planner, the same rules without the bytes, which
//     gives an object's exact size, index and stream ranges in advance;
//   - the reader (ReadIndex, Object.ReadBlock), which reads an object
//     through an io.ReaderAt the way AutoMQ's ObjectReader does (tail read,
//     footer, second read of the index when needed) and checks every field
//     it reads, and Describe, which an inspection command prints;
//   - the object key rule (Key) and the object attributes (Attributes).
//
// It must never:
//
//   - write an object AutoMQ would lay out differently from the same calls,
//     or one whose index disagrees with its blocks;
//   - return records from a block, index or footer that does not check out:
//     a damaged object is an error, never a shorter result;
//   - panic on any input, or do I/O beyond the io.Writer and io.ReaderAt it
//     is given.
//
// The layout byte by byte, the rules and how the golden vectors made by
// AutoMQ's own classes prove them are in docs/automq-object-format.md.
// walden's own object format (package objformat) is unrelated.
package object
