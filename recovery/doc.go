// Package recovery executes recovery jobs: it recovers a fenced broker's
// write-ahead log into S3 and closes the broker's streams, exactly once,
// on exactly one coordinator at a time.
//
// It owns:
//
//   - the Runner, started on every coordinator: on the job's assignee it
//     runs the Executor for the job's current attempt and renews the job
//     lease through raft every job_lease/3; on the leader it measures those
//     renewals on its own monotonic clock and proposes ReassignJob (attempt+1)
//     after job_lease without one (a new leader starts every clock at its
//     election);
//   - the Executor: the job's attempts, the fence step, the retry loop with
//     capped exponential backoff and the error shown in the job, the step
//     metrics; it hands everything after fencing to a Target;
//   - the Target seam (target.go): one interface, the recovery of a fenced
//     broker's WAL into a system of record, with a registry that
//     recovery.action names. The builtin target (walden's catalog and object
//     format: attach → read → upload → commit → close → detach → done, each
//     step idempotent and checkpointed through CheckpointJob) and the exec
//     target (the JSON contract) live here; others live in their own package
//     and register themselves (recovery/automqtarget: AutoMQ's controller).
//     A Target works through a Run: the job, checkpoints, events, the
//     attach and detach plugins, progress and the finish;
//   - the plugins: fence (none, exec, aws-ec2-stop), attach (local, ebs,
//     exec) and the whole-recovery exec action, with their JSON contract
//     (docs/recovery.md);
//   - the producer summary of what it commits: each object's commit names
//     the last batch of every idempotent producer it holds (read from the
//     reference broker's batch framing, package producer), so that the
//     streams' next owners recognize retries of recovered batches.
//
// It must never:
//
//   - write to the dead broker's WAL (package wal's Reader opens it
//     read-only); a target whose system of record requires it (AutoMQ's
//     failover resets the WAL's header once its records are committed)
//     does so itself, explicitly, after the commit;
//   - make a side effect without the job's (token, attempt): every catalog
//     write carries the FailoverContext, and an executor whose attempt is no
//     longer current stops at once;
//   - mark a job succeeded while a stream of the broker is still opened or
//     a planned object is not committed;
//   - decide anything from wall-clock time of two machines: job lease expiry
//     is measured on the leader's monotonic clock only.
package recovery
