package recovery

import (
	"errors"

	"walden/refusal"
)

// Errors of the package; test for them with errors.Is.
var (
	// ErrStale means the executor's attempt is no longer the job's current
	// attempt (reassigned, cancelled or finished): it stopped without side
	// effects beyond those already made.
	ErrStale = errors.New("attempt is no longer current")
	// ErrInvalidConfig means a Config value is unusable; the message names
	// the key.
	ErrInvalidConfig = errors.New("invalid recovery config")
	// ErrNoS3 means the builtin action has no S3 bucket to upload to.
	ErrNoS3 = errors.New("s3 is not configured (s3.bucket)")
	// ErrPlugin means a fence, attach or exec plugin failed; the message
	// says which and why.
	ErrPlugin = errors.New("plugin failed")
	// ErrRecordsMissing means that records the dead broker acknowledged
	// (they are in its WAL) lie in a range the catalog has committed but
	// no object in the store backs: the recovery finished the job as
	// failed instead of succeeding without them (the error names the
	// streams and offsets).
	ErrRecordsMissing = errors.New("acknowledged records are missing")
	// ErrNoWAL means the job has no WAL location to read (the broker's agent
	// registered no wal.path and no path_template is set).
	ErrNoWAL = errors.New("no WAL location")
	// ErrBlocked means a step failed without interruption for longer than
	// recovery.blocked_after: the job entered blocked and waits for an
	// operator (waldenctl retry, waldenctl jobs resolve).
	ErrBlocked = errors.New("the job is blocked")
)

// Refusals of the state machine that mean an attempt is over.
var (
	fencingStale      = refusal.ErrStaleAttempt
	fencingNotRunning = refusal.ErrJobNotRunning
	fencingUnknownJob = refusal.ErrUnknownJob
)
