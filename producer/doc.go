// Package producer owns walden's idempotent producer (Kafka's model): a
// producer id and a sequence number per stream make a retried append
// acknowledged once and stored once, also when the retry lands on another
// broker after a failover.
//
// It owns:
//   - the batch payload framing the reference broker writes into the WAL
//     (the WAL format itself is AutoMQ's and does not change): the records,
//     each a big-endian u32 length and its bytes, preceded for an idempotent
//     append by a header carrying the producer id and the batch's first
//     sequence number (Encode, Decode, HeaderOf);
//   - the per-stream producer table: the last batch of each producer, the
//     check of an append against it (a new batch, a retry of the last one,
//     or out of order) and its bound (MaxPerStream, the most recent by
//     offset are kept);
//   - the Summary a commit carries: per stream, the last batch of each
//     producer among the batches of an object, read from their framing, so
//     that the catalog knows the producer state of everything committed —
//     by a broker or by a recovery of its WAL.
//
// It is pure: no I/O, no clock, no randomness (the state machine uses the
// table), and it never decides anything about fencing.
package producer
