package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// State is the committed state the executor and the runner read (package
// fsm's *State). Every method returns copies.
type State interface {
	Job(id string) (*waldenv1.Job, bool)
	Jobs(brokerID string, state waldenv1.JobState) []*waldenv1.Job
	OpeningStreams(brokerID string) []*waldenv1.Stream
	// StreamObjects returns up to max (all when max <= 0) committed
	// objects of a stream whose range ends after fromOffset, in offset
	// order.
	StreamObjects(streamID, fromOffset uint64, max int) []*waldenv1.Object
	Object(id string) (*waldenv1.Object, bool)
	// RestoreState is the reconciliation of a cluster restored from a
	// backup (nil when not restored): restore jobs wait for its plan.
	RestoreState() *waldenv1.RestoreState
	Changed() <-chan struct{}
}

// Cluster is this member's access to the raft group.
type Cluster interface {
	// Propose replicates cmd and returns its result once applied here.
	Propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error)
	// LinearizableRead returns once the local state reflects every entry
	// committed before the call.
	LinearizableRead(ctx context.Context) error
	// Leadership reports whether this member leads, and the term.
	Leadership() (leader bool, term uint64)
	// LiveMembers are the members the leader sees active, itself included.
	LiveMembers() []string
}

// Executor runs the steps of one attempt of a recovery job. It is safe for
// concurrent use by attempts of different jobs.
type Executor struct {
	cfg      Config
	nodeID   string
	state    State
	cluster  Cluster
	store    Store
	s3       *S3JSON
	fencer   Fencer
	attacher Attacher
	metrics  Metrics
	target   Target
	log      *slog.Logger
	// proposeTimeout bounds one proposal.
	proposeTimeout time.Duration
	// progressEvery throttles progress checkpoints.
	progressEvery time.Duration
}

// ExecutorConfig wires an Executor.
type ExecutorConfig struct {
	Config  Config
	NodeID  string
	State   State
	Cluster Cluster
	// Store is the S3 client; nil makes the builtin upload step fail with
	// ErrNoS3 (retried, shown in the job's error).
	Store Store
	// S3 describes the bucket for the exec action's JSON (optional).
	S3       *S3JSON
	Fencer   Fencer
	Attacher Attacher
	// Metrics receives the duration of every run of a step; nil records
	// nothing.
	Metrics Metrics
	// Target recovers the WAL after fencing. Nil means the builtin or exec
	// target, as Config.Action says; other targets are built with NewTarget
	// and passed here.
	Target Target
	Logger *slog.Logger
}

// Metrics receives the executor's measurements (metrics.Recovery).
type Metrics interface {
	// StepRun records one run of step that took d; failed says it ended
	// in an error (the step is retried).
	StepRun(step waldenv1.JobStep, d time.Duration, failed bool)
}

// TargetMetrics receives what a target reports in its own terms. A Metrics
// that also implements it gets them (metrics.Recovery does).
type TargetMetrics interface {
	// TargetCommitted counts objects of kind committed by target, holding
	// records record batches.
	TargetCommitted(target, kind string, objects int, records int64)
	// TargetStreamsClosed counts streams target closed.
	TargetStreamsClosed(target string, n int)
	// Uploaded counts n bytes uploaded by a target through a store of its
	// own (the member's store counts its own uploads).
	Uploaded(n int64)
}

type noMetrics struct{}

func (noMetrics) StepRun(waldenv1.JobStep, time.Duration, bool) {}
func (noMetrics) TargetCommitted(string, string, int, int64)    {}
func (noMetrics) TargetStreamsClosed(string, int)               {}
func (noMetrics) Uploaded(int64)                                {}

// NewExecutor returns an Executor. Fencer and Attacher default to none and
// local.
func NewExecutor(c ExecutorConfig) *Executor {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Fencer == nil {
		c.Fencer = noFence{}
	}
	if c.Attacher == nil {
		c.Attacher = localAttach{template: c.Config.PathTemplate}
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	if c.Target == nil {
		c.Target = builtinTarget{}
		if c.Config.Action == ActionExec {
			c.Target = execTarget{}
		}
	}
	return &Executor{cfg: c.Config, nodeID: c.NodeID, state: c.State, cluster: c.Cluster, store: c.Store, s3: c.S3,
		fencer: c.Fencer, attacher: c.Attacher, metrics: c.Metrics, target: c.Target, log: c.Logger.With("component", "recovery", "node_id", c.NodeID),
		proposeTimeout: 5 * time.Second, progressEvery: 250 * time.Millisecond}
}

// attempt is one run of one attempt of one job.
type attempt struct {
	e       *Executor
	jobID   string
	attempt uint32
	log     *slog.Logger
	// reported is set once the read step's gaps and skips are recorded as
	// an event in this run.
	reported bool
	// stepStart is when the step now running started (for Metrics).
	stepStart time.Time
	// progressed is set when a step is done: the failures before it do not
	// count towards blocked_after.
	progressed bool
}

// stepEnded reports the run of step that started at stepStart and starts
// the next one.
func (a *attempt) stepEnded(step waldenv1.JobStep, failed bool) {
	now := time.Now()
	a.e.metrics.StepRun(step, now.Sub(a.stepStart), failed)
	a.stepStart = now
}

// Run executes attempt att of job jobID until the job succeeded (nil), the
// attempt is no longer current (ErrStale), or ctx is done. Every failing
// step is retried with capped exponential backoff and its error shown in
// the job; nothing but staleness or ctx ends a run early.
func (e *Executor) Run(ctx context.Context, jobID string, att uint32) error {
	a := &attempt{e: e, jobID: jobID, attempt: att, log: e.log.With("job_id", jobID, "attempt", att)}
	j, err := a.job()
	if err != nil {
		return err
	}
	a.log = a.log.With("broker_id", j.GetBrokerId(), "token", j.GetToken())
	a.log.Info("recovery attempt starting", "step", j.GetJobStep().Name(), "action", e.cfg.Action)
	start := time.Now()
	if err := a.retry(ctx, func(ctx context.Context) (waldenv1.JobStep, error) {
		return waldenv1.JobStep_JOB_STEP_FENCE, a.fence(ctx)
	}); err != nil {
		return err
	}
	run := &Run{a: a}
	target := e.target
	if j.GetRestore() {
		// A restore job reconciles walden's own catalog, whatever the
		// member's recovery.action.
		target = builtinTarget{}
	}
	if err := a.retry(ctx, func(ctx context.Context) (waldenv1.JobStep, error) { return target.Recover(ctx, run) }); err != nil {
		return err
	}
	a.log.Info("recovery attempt succeeded", "elapsed", time.Since(start))
	return nil
}

// job returns the job, or ErrStale when this attempt is not current.
func (a *attempt) job() (*waldenv1.Job, error) {
	j, ok := a.e.state.Job(a.jobID)
	if !ok {
		return nil, fmt.Errorf("recovery: job %s: not found: %w", a.jobID, ErrStale)
	}
	if j.GetAttempt() != a.attempt || (j.GetJobState() != waldenv1.JobState_JOB_STATE_PENDING && j.GetJobState() != waldenv1.JobState_JOB_STATE_RUNNING) {
		return nil, fmt.Errorf("recovery: job %s: attempt %d is not current (attempt %d, %s): %w",
			a.jobID, a.attempt, j.GetAttempt(), j.GetJobState().Name(), ErrStale)
	}
	return j, nil
}

func (a *attempt) failover(j *waldenv1.Job) *waldenv1.FailoverContext {
	return &waldenv1.FailoverContext{JobId: j.GetJobId(), Attempt: a.attempt, Token: j.GetToken()}
}

// propose replicates cmd; a refusal saying the attempt is stale becomes
// ErrStale.
func (a *attempt) propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	pctx, cancel := context.WithTimeout(ctx, a.e.proposeTimeout)
	defer cancel()
	res, err := a.e.cluster.Propose(pctx, cmd)
	if err != nil && (errors.Is(err, refusal.ErrStaleAttempt) || errors.Is(err, refusal.ErrJobNotRunning) || errors.Is(err, refusal.ErrUnknownJob)) {
		return nil, fmt.Errorf("recovery: job %s attempt %d: %w: %w", a.jobID, a.attempt, ErrStale, err)
	}
	return res, err
}

func (a *attempt) checkpoint(ctx context.Context, cp *waldenv1.CheckpointJob) error {
	cp.JobId, cp.Attempt = a.jobID, a.attempt
	_, err := a.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_CheckpointJob{CheckpointJob: cp}})
	if err != nil {
		return fmt.Errorf("recovery: checkpoint %s: %w", cp.GetJobStep().Name(), err)
	}
	if cp.GetStepDone() {
		a.stepEnded(cp.GetJobStep(), false)
		a.progressed = true
	}
	return nil
}

func (a *attempt) stepDone(ctx context.Context, step waldenv1.JobStep, detail string) error {
	a.log.Info("step done", "step", step.Name(), "detail", detail)
	return a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: step, StepDone: true, Detail: detail})
}

// event records an executor's note about job j, made in step (unspecified:
// not known), with the job's epoch, the attempt and this member as fields.
func (a *attempt) event(ctx context.Context, j *waldenv1.Job, step waldenv1.JobStep, msg string) {
	_, err := a.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_RecordEvent{RecordEvent: &waldenv1.RecordEvent{Event: &waldenv1.Event{
		EventKind: waldenv1.EventKind_EVENT_KIND_RECOVERY, BrokerId: j.GetBrokerId(), JobId: j.GetJobId(), Actor: a.e.nodeID, Message: msg,
		Detail: &waldenv1.EventDetail{Epoch: j.GetToken(), Attempt: a.attempt, Member: a.e.nodeID, JobStep: step},
	}}}})
	if err != nil {
		a.log.Warn("record event failed", "err", err)
	}
}

// retry runs fn until it succeeds, the attempt is stale or ctx is done.
// After each failure it shows the error in the job (CheckpointJob.error)
// and waits retry_min·2ⁿ, capped at retry_max. When one step has failed
// without interruption for blocked_after (a step done in between, or
// another step failing, starts the count again), the job enters blocked
// with the error (BlockJob) and the run ends with ErrBlocked.
func (a *attempt) retry(ctx context.Context, fn func(ctx context.Context) (waldenv1.JobStep, error)) error {
	wait := a.e.cfg.RetryMin
	var failing waldenv1.JobStep
	var failingSince time.Time
	for n := 1; ; n++ {
		if _, err := a.job(); err != nil {
			return err
		}
		a.stepStart = time.Now()
		step, err := fn(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil && !errors.Is(err, ErrStale) {
			a.stepEnded(step, true)
		}
		if errors.Is(err, ErrStale) {
			a.log.Warn("attempt is stale: stopping", "step", step.Name(), "err", err)
			return err
		}
		if errors.Is(err, ErrRecordsMissing) {
			a.log.Error("job failed: acknowledged records are missing", "step", step.Name(), "err", err)
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("recovery: job %s attempt %d: %w", a.jobID, a.attempt, context.Cause(ctx))
		}
		if step != failing || a.progressed {
			failing, failingSince = step, time.Now()
		}
		a.progressed = false
		if failed := time.Since(failingSince); failed >= a.e.cfg.BlockedAfter {
			return a.block(ctx, step, failed, err)
		}
		a.log.Warn("step failed: retrying", "step", step.Name(), "retry", n, "backoff", wait, "err", err)
		if cerr := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: step, Error: fmt.Sprintf("%s (retry %d in %s)", err, n, wait)}); errors.Is(cerr, ErrStale) {
			return cerr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("recovery: job %s attempt %d: %w", a.jobID, a.attempt, context.Cause(ctx))
		case <-time.After(wait):
		}
		wait = min(2*wait, a.e.cfg.RetryMax)
	}
}

// block moves the job to blocked: step has failed for failed, last with
// err. The run ends with ErrBlocked (or ErrStale if the attempt is not
// current any more).
func (a *attempt) block(ctx context.Context, step waldenv1.JobStep, failed time.Duration, err error) error {
	a.log.Error("step failed for too long: the job is blocked until an operator retries or resolves it",
		"step", step.Name(), "failing_for", failed.Round(time.Second), "blocked_after", a.e.cfg.BlockedAfter, "err", err)
	_, perr := a.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_BlockJob{BlockJob: &waldenv1.BlockJob{
		JobId: a.jobID, Attempt: a.attempt, JobStep: step, Error: err.Error(), FailingMs: failed.Milliseconds(),
	}}})
	if perr != nil {
		return fmt.Errorf("recovery: job %s attempt %d: block after %s failing at %s (%w): %w", a.jobID, a.attempt, failed, step.Name(), err, perr)
	}
	return fmt.Errorf("recovery: job %s attempt %d: %w after %s failing at %s: %w", a.jobID, a.attempt, ErrBlocked, failed.Round(time.Second), step.Name(), err)
}

// fence runs the fence plugin once per job: a fence checkpoint of any
// attempt means the machine is already fenced.
func (a *attempt) fence(ctx context.Context) error {
	j, err := a.job()
	if err != nil {
		return err
	}
	for _, cp := range j.GetCheckpoints() {
		if cp.GetJobStep() == waldenv1.JobStep_JOB_STEP_FENCE {
			return nil
		}
	}
	if err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: waldenv1.JobStep_JOB_STEP_FENCE}); err != nil {
		return err
	}
	detail := "restore job: the restore revoked the broker's epoch; no fence plugin"
	if !j.GetRestore() {
		// A restored cluster's brokers are not failed: their machines
		// keep running and serve again once it is reconciled.
		var err error
		if detail, err = a.e.fencer.Fence(ctx, j); err != nil {
			return err
		}
	}
	if wait := time.Duration(j.GetLeaseWaitMs()) * time.Millisecond; wait > 0 {
		// A broker failed over while it still held a lease (a manual
		// failover, or a restore: a lease of the old cluster) may
		// acknowledge writes until that lease runs out; the WAL is read
		// only after that, so the recovery sees every one.
		a.log.Info("waiting for the broker's lease to run out before reading its WAL", "wait", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("recovery: fence: waiting for the broker's lease: %w", context.Cause(ctx))
		case <-t.C:
		}
		detail = fmt.Sprintf("%s; waited %s for the broker's lease to run out", detail, wait)
	}
	return a.stepDone(ctx, waldenv1.JobStep_JOB_STEP_FENCE, detail)
}

// closeStreams closes every stream the broker still has opened, in
// failover mode, and returns how many it closed.
func (a *attempt) closeStreams(ctx context.Context, j *waldenv1.Job, total int) error {
	if err := a.e.cluster.LinearizableRead(ctx); err != nil {
		return fmt.Errorf("recovery: close: read barrier: %w", err)
	}
	open := a.e.state.OpeningStreams(j.GetBrokerId())
	if total < len(open) {
		total = len(open)
	}
	for i, st := range open {
		_, err := a.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_CloseStream{CloseStream: &waldenv1.CloseStreamRequest{
			BrokerId: j.GetBrokerId(), BrokerEpoch: j.GetToken(), StreamId: st.GetStreamId(), StreamEpoch: st.GetEpoch(), Failover: a.failover(j),
		}}})
		if err != nil {
			return fmt.Errorf("recovery: close stream %d: %w", st.GetStreamId(), err)
		}
		closed := total - len(open) + i + 1
		if err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: waldenv1.JobStep_JOB_STEP_CLOSE, StreamsClosed: uint32(closed), StreamsTotal: uint32(total)}); err != nil {
			return err
		}
	}
	return a.stepDone(ctx, waldenv1.JobStep_JOB_STEP_CLOSE, fmt.Sprintf("closed %d of %d streams", len(open), total))
}

func (a *attempt) finish(ctx context.Context, recovered int64) error {
	_, err := a.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_FinishJob{FinishJob: &waldenv1.FinishJob{
		JobId: a.jobID, Attempt: a.attempt, JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED, RecoveredWalOffset: recovered,
	}}})
	if err != nil {
		return fmt.Errorf("recovery: finish: %w", err)
	}
	return nil
}
