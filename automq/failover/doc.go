// Package failover fails over a dead AutoMQ 1.x broker natively, the way
// AutoMQ's own failover code (Client#failover → S3Storage.recover in 1.4.1)
// does it, without Java: it is the code behind the coordinators' `automq`
// recovery target (package recovery/automqtarget) and `walden automq
// failover`, the command-line tool AutoMQ's maintainers planned around
// their failover.
//
// It owns the sequence, each step safe to run again after a failure at any
// point:
//
//  1. the WAL's header: it must name the node; the node epoch is the larger
//     of the header's and the controller's (AutomqGetNodes), or the one
//     asked for when it is not older than either;
//  2. GetOpeningStreams in failover mode, which fences the node at the
//     controller (its own opens and commits get NODE_FENCED);
//  3. AutoMQ's record filter, in batches of at most 512 MiB: records of the
//     opening streams at or beyond their end offsets, in offset order, the
//     records after a gap dropped (and reported), a stream whose records do
//     not start at its end offset reported and left opened;
//  4. PrepareS3Object, then the objects in AutoMQ's format (package
//     automq/object) streamed from the WAL's record bodies, without
//     re-encoding, into multipart uploads: one stream-set object, and a
//     stream object for each stream at or above the split size, as AutoMQ's
//     WAL upload lays them out;
//  5. CommitStreamSetObject in failover mode (REDUNDANT_OPERATION is done;
//     OBJECT_NOT_EXIST prepares again; OFFSET_NOT_MATCHED is done when an
//     earlier run committed the same records);
//  6. the WAL reset, in the WAL's own format version;
//  7. CloseStreams as the dead node.
//
// Nothing is committed twice: a commit must start at the stream's end
// offset at the controller, so what an earlier run committed is filtered
// out by the next run's read, and a stale run racing a newer one is
// refused OFFSET_NOT_MATCHED.
//
// It must never:
//
//   - commit, reset or close before the node is fenced at the controller;
//   - reset the WAL before every record it holds for the opening streams is
//     committed, or while a stream is left opened with records missing
//     (unless Config.CloseStreamsWithGaps says to do as AutoMQ does);
//   - overwrite an object with other bytes, or report success while an
//     opening stream is left opened;
//   - write to the WAL except through wal.Reset, at the end.
package failover
