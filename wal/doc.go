// Package wal reads and writes the block write-ahead log of AutoMQ 1.4 byte
// for byte: the two 4 KiB header slots, the ring of 4 KiB-aligned
// group-commit blocks, data and padding records, and the stream record batch
// body (StreamRecordBatchCodec).
//
// It owns:
//
//   - the on-disk format (format.go): header slots, record headers, record
//     bodies and the masked CRC32 used by all of them;
//   - the Writer: creates or reopens a WAL on a regular file or block
//     device, appends batches with group commit and acknowledges each one
//     only after fdatasync, trims, wraps round the ring with padding
//     records, refuses to overwrite untrimmed data (ErrFull), and writes a
//     graceful shutdown type on Close;
//   - the Reader: opens a WAL read-only, picks the header slot, and walks
//     the records from the trim offset with the recovery rules of format
//     version 1 (and the sliding-window rules of version 0), counting every
//     byte it skips and why; ReadHeader reads only the header in force;
//   - Reset, the end of a failover: a separate, explicit call that writes
//     one header, in the WAL's own format version, moving the trim offset
//     past everything the dead broker wrote so that the log is empty; it
//     never overwrites the header slot in force, refuses a WAL of another
//     node, and does nothing when the log moved on since it was read.
//
// It must never:
//
//   - open a file for writing from the Reader or ReadHeader (recovery
//     reads a dead broker's volume and leaves it exactly as it was; only
//     Reset, called on its own once the records are safe elsewhere, writes
//     to it);
//   - change a WAL's format version anywhere but in the Writer (a version
//     0 WAL that Reset empties stays version 0, so that the AutoMQ 1.4.0 or
//     1.4.1 broker that owns it can still open it);
//   - return a record whose header or body CRC does not match;
//   - acknowledge an Append before the block holding it is durable;
//   - overwrite a record at or after the trim offset;
//   - panic on any input: damaged files are errors or skipped bytes.
//
// The format, the recovery rules as implemented and the choices made where
// AutoMQ leaves room are described in docs/wal.md.
package wal
