// Package reconcile owns the reconciliation of a cluster restored from a
// backup with what was written after the backup: the objects the old
// cluster's brokers and recovery jobs uploaded to S3 and committed, and the
// records the brokers acknowledged that only their WALs hold
// (docs/state.md#restore-reconciliation, docs/safety.md#restore).
//
// It owns:
//
//   - Plan, a pure function: from the restored catalog's streams, the
//     objects written after the backup that check out against their own
//     index, and the runs of records the brokers' WALs hold, it chooses each
//     stream's continuation — the objects to commit again, in an order in
//     which every range starts at its stream's end, and the WAL that holds
//     the stream's last records — by the rule that a stream epoch replaces
//     the ones before it from the offset it starts at;
//   - the Reconciler, run on every coordinator and acting on the leader: in
//     phase scan it lists the cluster's prefix for the brokers that wrote
//     after the backup; in phase plan it reads and checks every object
//     written after the backup, runs Plan, and proposes its entries in its
//     raft term, with progress.
//
// It must never commit a range of an object that does not check out against
// its own index (a damaged object is reported, never half-committed), commit
// anything before every restore job has surveyed its WAL, write or delete an
// object, or decide from anything but the committed state and what S3
// holds. The restore jobs (package recovery) read the WALs.
package reconcile
