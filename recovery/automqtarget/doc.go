// Package automqtarget is the recovery target `automq`: a coordinator fails
// over a dead AutoMQ 1.x broker at AutoMQ's own controller, with the code of
// package automq/failover (the same as `walden automq failover`). It adapts
// that failover to a recovery job: the job's attach and detach plugins, its
// checkpoints (each step, with a target report in AutoMQ's terms: node,
// epoch, object ids, per-stream end offsets before and after), its progress
// and metrics, and the executor's attempts and retries.
//
// It registers itself with package recovery; a binary that imports it
// accepts `recovery.action: automq`.
//
// It must never run a failover for a job whose attempt is no longer
// current: every step first checks the job (a stale attempt stops), and
// AutoMQ's controller refuses a stale run's commits by their offsets.
package automqtarget
