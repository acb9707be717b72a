// Package broker is walden's reference broker (`walden broker`): a small
// log broker built on the agent library, the wal package and the stream
// catalog. It is what `walden dev`, the end-to-end tests and the benchmarks
// run, and the pattern a broker written for walden follows.
//
// It owns:
//   - the data API (walden.v1.BrokerAPI): Append acknowledges records only
//     after the WAL holding them is durable and the lease is valid; Read
//     serves committed data from S3 through the catalog, plus the broker's
//     own tail that is not uploaded yet;
//   - the startup sequence of one broker epoch ("incarnation"): register,
//     upload the part of its old WAL that the catalog lacks (re-opening its
//     own streams with the new epoch), reset the WAL, open its configured
//     streams;
//   - the upload loop: WAL records → one object (objformat) → S3 under a
//     deterministic key → CommitObject → inclusive WAL trim;
//   - stream takeover: with takeover set, opening CLOSED streams as soon as
//     the coordinators' Watch shows them closed, polling as the fallback
//     (the catalog decides races).
//
// In mode automq (AutomqBroker) it is an AutoMQ 1.x broker instead, so that
// walden's AutoMQ failover can be shown and tested end to end where no
// AutoMQ runs: no agent and no coordinators; the WAL header names its node
// id and node epoch (its start time in ms); the startup is AutoMQ's
// S3Storage recovery (GetOpeningStreams without failover, the own WAL's
// records uploaded and committed, the WAL reset, the streams closed);
// streams are opened with OpenStreams (a new leader retrying
// STREAM_NOT_CLOSED with backoff), uploads are AutoMQ objects under AutoMQ's
// keys committed with CommitStreamSetObject; reads go through the
// controller's metadata view and the objects (package automq/metaview).
// It acknowledges an append once it is durable in the WAL and asks no one,
// as AutoMQ does: the agent beside it, as a watchdog, is what protects it.
//
// It must never acknowledge a record that is not durable in its WAL, write
// with an epoch the agent does not confirm (mode walden), trim its WAL past
// a record the catalog or controller has not committed, or decide that
// another broker failed.
package broker
