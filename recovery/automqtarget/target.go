package automqtarget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"walden/automq/controller"
	"walden/automq/failover"
	"walden/objstore"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// Name is the value of recovery.action that selects this target.
const Name = recovery.ActionAutoMQ

func init() { recovery.RegisterTarget(Name, New) }

// ErrNoNode means the job's broker registered no AutoMQ node id: its agent
// is not configured as an AutoMQ broker's (automq.node_id).
var ErrNoNode = errors.New("the broker registered no AutoMQ node")

// target is the automq recovery target of one coordinator.
type target struct {
	cfg   failover.Config
	log   *slog.Logger
	ctl   *controller.Client
	store failover.Store
	// ownStore says the target uploads through its own S3 client (then it
	// counts the bytes itself).
	ownStore bool
}

// New builds the target from the member's recovery section. It reads the
// controller's TLS and password files and builds its clients; it does not
// dial.
func New(ctx context.Context, d recovery.TargetDeps) (recovery.Target, error) {
	cfg := d.Config.AutoMQ
	if err := cfg.Validate(); err != nil {
		return nil, configError(err)
	}
	cc, err := cfg.ControllerClientConfig()
	if err != nil {
		return nil, configError(err)
	}
	cc.Logger = d.Logger.With("component", "automq-controller")
	t := &target{cfg: cfg, log: d.Logger}
	switch {
	case cfg.S3.Bucket != "":
		c, err := objstore.New(ctx, cfg.S3, objstore.Options{Concurrency: d.Config.UploadConcurrency, PartSize: d.Config.PartSize, Logger: d.Logger})
		if err != nil {
			return nil, fmt.Errorf("automq target: s3: %w", err)
		}
		t.store, t.ownStore = c, true
	case d.Store != nil:
		if d.Store.Prefix() != "" {
			return nil, &recovery.ConfigError{Key: "automq.s3.bucket",
				Reason: fmt.Sprintf("the member's s3 section has prefix %q, but AutoMQ's object keys start at the bucket's root: set recovery.automq.s3 to AutoMQ's data bucket", d.Store.Prefix())}
		}
		t.store = d.Store
	default:
		return nil, &recovery.ConfigError{Key: "automq.s3.bucket", Reason: "required: AutoMQ's data bucket (or the member's s3 section)"}
	}
	ctl, err := controller.New(cc)
	if err != nil {
		return nil, configError(err)
	}
	t.ctl = ctl
	return t, nil
}

func configError(err error) error {
	var fe *failover.ConfigError
	if errors.As(err, &fe) {
		return &recovery.ConfigError{Key: "automq." + fe.Key, Reason: fe.Reason}
	}
	var ce *controller.ConfigError
	if errors.As(err, &ce) {
		return &recovery.ConfigError{Key: "automq.controller." + ce.Key, Reason: ce.Reason}
	}
	return fmt.Errorf("automq target: %w", err)
}

// jobStep is the job step each failover step is checkpointed as.
var jobStep = map[failover.Step]waldenv1.JobStep{
	failover.StepHeader: waldenv1.JobStep_JOB_STEP_READ,
	failover.StepFence:  waldenv1.JobStep_JOB_STEP_READ,
	failover.StepRead:   waldenv1.JobStep_JOB_STEP_READ,
	failover.StepUpload: waldenv1.JobStep_JOB_STEP_UPLOAD,
	failover.StepCommit: waldenv1.JobStep_JOB_STEP_COMMIT,
	failover.StepReset:  waldenv1.JobStep_JOB_STEP_CLOSE,
	failover.StepClose:  waldenv1.JobStep_JOB_STEP_CLOSE,
}

// stepDone says which failover steps end a job step (a checkpoint
// appended); the others only say where the job is.
var stepDone = map[failover.Step]bool{
	failover.StepRead:   true,
	failover.StepUpload: true,
	failover.StepCommit: true,
	failover.StepClose:  true,
}

// Recover runs the job's failover: attach, the failover's steps (each
// checkpointed with the report), detach, finish.
func (t *target) Recover(ctx context.Context, r *recovery.Run) (waldenv1.JobStep, error) {
	j, err := r.Job()
	if err != nil {
		return waldenv1.JobStep_JOB_STEP_ATTACH, err
	}
	node := j.GetAutomq()
	if node == nil {
		return waldenv1.JobStep_JOB_STEP_READ, fmt.Errorf("automq target: broker %q: %w: its agent's configuration names no automq.node_id, "+
			"so the node to fail over at AutoMQ's controller is not known", j.GetBrokerId(), ErrNoNode)
	}
	path, err := r.Attach(ctx)
	if err != nil {
		return waldenv1.JobStep_JOB_STEP_ATTACH, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	prog := r.Progress(ctx, waldenv1.JobStep_JOB_STEP_UPLOAD, 0, func(err error) { cancel(err) })
	defer prog.Stop()

	prior := reportFromProto(j.GetTargetReport())
	w := newWatch(ctx, r, prior)
	f, err := failover.New(t.cfg, t.ctl, t.store, failover.Options{Logger: r.Logger(), Observe: w.observe,
		Uploaded: func(done, total int64) { prog.SetTotal(uint64(total)); prog.Set(uint64(done)) }})
	if err != nil {
		return w.step, err
	}
	rep, err := f.Run(ctx, failover.Request{WALPath: path, NodeID: node.GetNodeId(), Prior: prior})
	prog.Stop()
	if rep != nil {
		if cerr := t.ended(ctx, r, prior, rep, w.step); cerr != nil && err == nil {
			err = cerr
		}
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && errors.Is(cause, recovery.ErrStale) {
			err = cause
		}
		return w.step, err
	}
	if err := r.Detach(ctx); err != nil {
		return waldenv1.JobStep_JOB_STEP_DETACH, err
	}
	return waldenv1.JobStep_JOB_STEP_DONE, r.Finish(ctx, -1)
}

// ended counts what the failover's run did beyond the prior report and
// checkpoints the report as it ended, whatever happened: what `waldenctl
// job` shows.
func (t *target) ended(ctx context.Context, r *recovery.Run, prior, rep *failover.Report, step waldenv1.JobStep) error {
	if t.ownStore {
		r.Metrics().Uploaded(rep.BytesUploaded - prior.BytesUploaded)
	}
	if n := rep.StreamsClosed() - prior.StreamsClosed(); n > 0 {
		r.Metrics().TargetStreamsClosed(Name, n)
	}
	return r.Checkpoint(context.WithoutCancel(ctx), checkpoint(step, rep))
}

// watch follows a failover's events: it checkpoints the job at each step
// done (and at a reset) and counts the objects and records committed
// beyond those of the prior report.
type watch struct {
	ctx context.Context
	r   *recovery.Run
	// step is the job step the failover is at.
	step           waldenv1.JobStep
	counted        map[int64]string
	countedRecords int64
}

func newWatch(ctx context.Context, r *recovery.Run, prior *failover.Report) *watch {
	return &watch{ctx: ctx, r: r, step: waldenv1.JobStep_JOB_STEP_READ, counted: committedObjects(prior), countedRecords: prior.Records}
}

// observe is the failover's Observe: an error stops it (a stale job).
func (w *watch) observe(ev failover.Event) error {
	if _, err := w.r.Job(); err != nil {
		return err // stale: stop
	}
	w.step = jobStep[ev.Step]
	if !ev.Done && ev.Step != failover.StepReset {
		return nil
	}
	cp := checkpoint(w.step, ev.Report)
	cp.Detail = ev.Detail
	cp.StepDone = stepDone[ev.Step]
	if err := w.r.Checkpoint(w.ctx, cp); err != nil {
		return err
	}
	if ev.Step == failover.StepCommit {
		w.countCommitted(ev.Report)
	}
	return nil
}

// countCommitted counts the objects (by kind) and records rep committed
// that were not counted yet.
func (w *watch) countCommitted(rep *failover.Report) {
	kinds := map[string]int{}
	for id, kind := range committedObjects(rep) {
		if _, ok := w.counted[id]; !ok {
			w.counted[id] = kind
			kinds[kind]++
		}
	}
	for kind, n := range kinds {
		w.r.Metrics().TargetCommitted(Name, kind, n, 0)
	}
	w.r.Metrics().TargetCommitted(Name, "", 0, rep.Records-w.countedRecords)
	w.countedRecords = rep.Records
}

// committedObjects are the report's committed objects: id → kind.
func committedObjects(rep *failover.Report) map[int64]string {
	out := map[int64]string{}
	for _, o := range rep.Objects {
		if o.State == failover.StateCommitted {
			out[o.ObjectID] = o.Kind
		}
	}
	return out
}

// checkpoint is a checkpoint of the job's counters and target report.
func checkpoint(step waldenv1.JobStep, rep *failover.Report) *waldenv1.CheckpointJob {
	cp := &waldenv1.CheckpointJob{JobStep: step, TargetReport: reportToProto(rep),
		StreamsTotal: uint32(len(rep.Streams)), StreamsClosed: uint32(rep.StreamsClosed()), RecordsUploaded: uint64(rep.Records),
		SkippedBytes: uint64(max(rep.SkippedBytes, 0)), BytesUploaded: uint64(max(rep.BytesUploaded, 0)), BytesTotal: uint64(max(rep.BytesUploaded, 0))}
	if len(rep.Gaps) > 0 {
		cp.Gaps = rep.Gaps
	}
	var problems []string
	for _, s := range rep.Streams {
		if s.Problem != "" {
			problems = append(problems, s.Problem)
		}
	}
	if len(problems) > 0 {
		cp.Gaps = append(cp.Gaps, strings.Join(problems, "; "))
	}
	return cp
}

func reportToProto(r *failover.Report) *waldenv1.TargetReport {
	out := &waldenv1.TargetReport{Target: Name, NodeId: int64(r.NodeID), NodeEpoch: r.NodeEpoch, Fenced: r.Fenced, WalReset: r.WALReset,
		BytesUploaded: uint64(max(r.BytesUploaded, 0))}
	for _, s := range r.Streams {
		out.Streams = append(out.Streams, &waldenv1.TargetStream{StreamId: s.StreamID, StreamEpoch: s.StreamEpoch, EndOffsetBefore: s.EndOffsetBefore,
			EndOffsetAfter: s.EndOffsetAfter, Records: uint64(max(s.Records, 0)), Closed: s.Closed, Problem: s.Problem})
	}
	for _, o := range r.Objects {
		out.Objects = append(out.Objects, &waldenv1.TargetObject{ObjectId: o.ObjectID, Key: o.Key, Size: uint64(max(o.Size, 0)), Kind: o.Kind, State: o.State})
	}
	return out
}

func reportFromProto(p *waldenv1.TargetReport) *failover.Report {
	r := &failover.Report{}
	if p == nil {
		return r
	}
	r.NodeID, r.NodeEpoch, r.Fenced, r.WALReset, r.BytesUploaded = int32(p.GetNodeId()), p.GetNodeEpoch(), p.GetFenced(), p.GetWalReset(), int64(p.GetBytesUploaded())
	for _, s := range p.GetStreams() {
		r.Streams = append(r.Streams, failover.StreamReport{StreamID: s.GetStreamId(), StreamEpoch: s.GetStreamEpoch(), EndOffsetBefore: s.GetEndOffsetBefore(),
			EndOffsetAfter: s.GetEndOffsetAfter(), Records: int64(s.GetRecords()), Closed: s.GetClosed(), Problem: s.GetProblem()})
		r.Records += int64(s.GetRecords())
	}
	for _, o := range p.GetObjects() {
		r.Objects = append(r.Objects, failover.ObjectReport{ObjectID: o.GetObjectId(), Key: o.GetKey(), Size: int64(o.GetSize()), Kind: o.GetKind(), State: o.GetState()})
	}
	return r
}
