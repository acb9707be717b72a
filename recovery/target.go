package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

// A Target is where a recovery takes a fenced broker's WAL: walden's own
// catalog and object format (builtin), an external command (exec), or
// AutoMQ's controller and object format (automq, package
// recovery/automqtarget). recovery.action chooses one per member.
//
// The Executor runs everything around a target: the job's attempts and
// their staleness checks, the fence step (plugin and lease wait), the retry
// loop with its backoff and the error shown in the job, the step metrics.
// The target runs the steps after fencing, through the Run it is given:
// attach (Run.Attach), whatever it needs to read, upload, commit and close,
// detach (Run.Detach), and finally Run.Finish.
//
// Its contract:
//
//   - Recover is idempotent: it may be called again after any failure, on
//     this member or, in a later attempt, on another one, after a crash at
//     any instant. What it committed before must not be committed twice, and
//     nothing acknowledged may be dropped: progress that must survive an
//     attempt goes into the job through Run.Checkpoint.
//   - Every side effect on the system of record carries the job's fencing
//     token and attempt, or is otherwise refused once the attempt is stale
//     (Run.Job reports ErrStale).
//   - It returns the step it was in when it failed (for the job's error and
//     the step metrics), or JOB_STEP_DONE with nil once Run.Finish succeeded.
//   - It returns ErrStale (wrapped) as soon as it learns its attempt is no
//     longer current, and returns when ctx is done.
type Target interface {
	Recover(ctx context.Context, r *Run) (waldenv1.JobStep, error)
}

// TargetDeps is what a registered target is built from.
type TargetDeps struct {
	// Config is the member's recovery section (the target reads its own
	// subsection, e.g. Config.AutoMQ).
	Config Config
	// NodeID is this coordinator's member id.
	NodeID string
	// Store is the S3 client of the member's s3 section (nil when none).
	Store Store
	// Logger is the recovery's logger.
	Logger *slog.Logger
}

// TargetFactory builds a target from its dependencies. It checks what it can
// without side effects (its configuration, its files) and does not dial.
type TargetFactory func(ctx context.Context, d TargetDeps) (Target, error)

var (
	targetsMu sync.Mutex
	targets   = map[string]TargetFactory{}
)

// RegisterTarget makes the target name available to recovery.action. The
// builtin and exec targets are registered by this package; others register
// from their own package (an init function), and the binary imports it.
// Registering a name twice is a programming error and panics.
func RegisterTarget(name string, f TargetFactory) {
	targetsMu.Lock()
	defer targetsMu.Unlock()
	if _, dup := targets[name]; dup {
		panic(fmt.Sprintf("recovery: target %q registered twice", name))
	}
	targets[name] = f
}

// RegisteredTargets lists the names of the registered targets, sorted.
func RegisteredTargets() []string {
	targetsMu.Lock()
	defer targetsMu.Unlock()
	names := make([]string, 0, len(targets))
	for n := range targets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// NewTarget builds the target that d.Config.Action names.
func NewTarget(ctx context.Context, d TargetDeps) (Target, error) {
	targetsMu.Lock()
	f, ok := targets[d.Config.Action]
	targetsMu.Unlock()
	if !ok {
		return nil, &ConfigError{Key: "action", Reason: fmt.Sprintf("%q is not a recovery target this binary knows (it knows %v)", d.Config.Action, RegisteredTargets())}
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return f(ctx, d)
}

func init() {
	RegisterTarget(ActionBuiltin, func(context.Context, TargetDeps) (Target, error) { return builtinTarget{}, nil })
	RegisterTarget(ActionExec, func(context.Context, TargetDeps) (Target, error) { return execTarget{}, nil })
}

// Run is one run of one attempt of a recovery job, as a Target sees it: the
// job, its checkpoints and events, the attach plugin, progress and the
// finish. Its methods turn a refusal meaning the attempt is over into
// ErrStale.
type Run struct {
	a *attempt
}

// JobID and Attempt name the attempt.
func (r *Run) JobID() string { return r.a.jobID }

// Attempt is the attempt number this run executes.
func (r *Run) Attempt() uint32 { return r.a.attempt }

// Job returns the job as committed now, or ErrStale when this attempt is no
// longer its current one.
func (r *Run) Job() (*waldenv1.Job, error) { return r.a.job() }

// Logger is the attempt's logger (job, attempt, broker and token set).
func (r *Run) Logger() *slog.Logger { return r.a.log }

// Config is the member's recovery configuration.
func (r *Run) Config() Config { return r.a.e.cfg }

// NodeID is this coordinator's member id.
func (r *Run) NodeID() string { return r.a.e.nodeID }

// Metrics receives what the target reports in its own terms (nothing is
// recorded when the executor's Metrics does not take them).
func (r *Run) Metrics() TargetMetrics {
	if m, ok := r.a.e.metrics.(TargetMetrics); ok {
		return m
	}
	return noMetrics{}
}

// Checkpoint records progress in the job (job id and attempt are set here).
// A checkpoint with StepDone also ends the step's metric.
func (r *Run) Checkpoint(ctx context.Context, cp *waldenv1.CheckpointJob) error {
	return r.a.checkpoint(ctx, cp)
}

// StepDone checkpoints step as done with a detail for people.
func (r *Run) StepDone(ctx context.Context, step waldenv1.JobStep, detail string) error {
	return r.a.stepDone(ctx, step, detail)
}

// Event records a recovery event of the job in the cluster's event log
// (best effort: a failure is logged).
func (r *Run) Event(ctx context.Context, msg string) {
	j, err := r.a.job()
	if err != nil {
		return
	}
	r.a.event(ctx, j, waldenv1.JobStep_JOB_STEP_UNSPECIFIED, msg)
}

// Attach runs the attach step: it makes the broker's WAL readable on this
// member through the attach plugin and returns its path.
func (r *Run) Attach(ctx context.Context) (string, error) { return r.a.attach(ctx) }

// Detach runs the detach step: it releases what Attach took.
func (r *Run) Detach(ctx context.Context) error { return r.a.detach(ctx) }

// Finish marks the job succeeded. recovered is the WAL offset up to which
// the recovery took the WAL (the broker trims to it when it registers
// again), or -1 when not known.
func (r *Run) Finish(ctx context.Context, recovered int64) error {
	return r.a.finish(ctx, recovered)
}

// Progress starts reporting the bytes of step done so far in the job, at
// most every progress interval, until Stop. Add and Set may be called from
// any goroutine. onStale (may be nil) is called when a progress checkpoint
// learns that the attempt is stale (typically it cancels the step).
func (r *Run) Progress(ctx context.Context, step waldenv1.JobStep, total uint64, onStale func(error)) *Progress {
	p := &Progress{}
	p.total.Store(total)
	p.start(ctx, r.a, step, onStale, p.Done)
	return p
}

// start reports done() every progress interval while it changes.
func (p *Progress) start(ctx context.Context, a *attempt, step waldenv1.JobStep, onStale func(error), done func() uint64) {
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.done)
		t := time.NewTicker(a.e.progressEvery)
		defer t.Stop()
		var last uint64
		for {
			select {
			case <-p.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if n := done(); n != last {
					last = n
					err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: step, BytesUploaded: n, BytesTotal: p.total.Load()})
					if err != nil && onStale != nil && errors.Is(err, ErrStale) {
						onStale(err)
					}
				}
			}
		}
	}()
}

// stepMarker runs the start of a step: a checkpoint naming it (so the job
// shows where it is), then fn; on success a checkpoint marking it done with
// fn's detail.
func (a *attempt) stepMarker(ctx context.Context, step waldenv1.JobStep, fn func() (string, error)) error {
	if err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: step}); err != nil {
		return err
	}
	detail, err := fn()
	if err != nil {
		return err
	}
	return a.stepDone(ctx, step, detail)
}

// attach is the attach step of the targets that read the WAL themselves.
func (a *attempt) attach(ctx context.Context) (string, error) {
	j, err := a.job()
	if err != nil {
		return "", err
	}
	var path string
	err = a.stepMarker(ctx, waldenv1.JobStep_JOB_STEP_ATTACH, func() (string, error) {
		p, err := a.e.attacher.Attach(ctx, j)
		path = p
		return "attached " + p, err
	})
	return path, err
}

// detach is the detach step.
func (a *attempt) detach(ctx context.Context) error {
	j, err := a.job()
	if err != nil {
		return err
	}
	detail, err := a.e.attacher.Detach(ctx, j)
	if err != nil {
		return err
	}
	return a.stepDone(ctx, waldenv1.JobStep_JOB_STEP_DETACH, detail)
}

// knownActions are the values of recovery.action that Validate accepts
// even before the target's package registered it (the config is read by
// binaries and tests that do not link every target).
var knownActions = []string{ActionBuiltin, ActionExec, ActionAutoMQ}

func validAction(name string) bool {
	return slices.Contains(knownActions, name) || slices.Contains(RegisteredTargets(), name)
}

// Progress counts the bytes a step has done, for the job's progress
// checkpoints (Run.Progress).
type Progress struct {
	n     atomic.Uint64
	total atomic.Uint64
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// Add counts n more bytes done.
func (p *Progress) Add(n uint64) { p.n.Add(n) }

// Set sets the bytes done.
func (p *Progress) Set(n uint64) { p.n.Store(n) }

// SetTotal changes the step's total.
func (p *Progress) SetTotal(n uint64) { p.total.Store(n) }

// Done returns the bytes done so far.
func (p *Progress) Done() uint64 { return p.n.Load() }

// Stop stops the reporting and waits for it.
func (p *Progress) Stop() {
	p.once.Do(func() { close(p.stop) })
	<-p.done
}
