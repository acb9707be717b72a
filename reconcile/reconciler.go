package reconcile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"walden/objformat"
	"walden/objstore"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
)

// Errors of the reconciler.
var (
	// ErrNoS3 means this member has no s3 section: as leader it cannot
	// list or read the objects written after the backup.
	ErrNoS3 = errors.New("reconcile: this member has no s3 section: it cannot read the objects written after the backup")
)

// State is the committed state the reconciler reads (package fsm's
// *State). Every method returns copies.
type State interface {
	RestoreState() *waldenv1.RestoreState
	Brokers() []*waldenv1.Broker
	Streams(owner, state string) []*waldenv1.Stream
	StreamEpochFloor(id uint64) uint64
	Object(id string) (*waldenv1.Object, bool)
	CommittedKeys() map[string][]uint64
	Job(id string) (*waldenv1.Job, bool)
	Changed() <-chan struct{}
}

// Cluster is this member's access to the raft group.
type Cluster interface {
	Propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error)
	LinearizableRead(ctx context.Context) error
	Leadership() (leader bool, term uint64)
	LiveMembers() []string
}

// Store is the part of the S3 client the reconciler reads with
// (*objstore.Client).
type Store interface {
	List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error)
	GetRange(ctx context.Context, key string, off, n int64) ([]byte, error)
	Prefix() string
}

// Config tunes a Reconciler.
type Config struct {
	// Readers is how many objects are read at once (default 4).
	Readers int
	// Chunk is how many objects one ReconcileObjects entry commits
	// (default 256).
	Chunk int
	// ProgressEvery is how often the check's progress is recorded
	// (default 2s).
	ProgressEvery time.Duration
	// Retry is how long a failed round waits (default 2s).
	Retry time.Duration
}

func (c *Config) fill() {
	if c.Readers <= 0 {
		c.Readers = 4
	}
	if c.Chunk <= 0 {
		c.Chunk = 256
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = 2 * time.Second
	}
	if c.Retry <= 0 {
		c.Retry = 2 * time.Second
	}
}

// Reconciler runs a restored cluster's scan and plan on the leader. Run it
// on every member; it does nothing while the cluster is not restored, not
// in a phase of the leader's, or this member does not lead.
type Reconciler struct {
	cfg     Config
	state   State
	cluster Cluster
	store   Store // nil: no s3 section
	log     *slog.Logger
	// warned is when the missing s3 section was last logged.
	warned time.Time
}

// New returns a Reconciler; store may be nil (a member without S3 says so
// when it leads a reconciliation it cannot run).
func New(cfg Config, state State, cluster Cluster, store Store, logger *slog.Logger) *Reconciler {
	cfg.fill()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{cfg: cfg, state: state, cluster: cluster, store: store, log: logger.With("component", "reconcile")}
}

// Run runs rounds until ctx ends: whenever the state changes, and every
// Retry while a round of this member's is due.
func (r *Reconciler) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Retry)
	defer t.Stop()
	for {
		changed := r.state.Changed()
		if err := r.Round(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("restore reconciliation round failed; retrying", "err", err, "retry_in", r.cfg.Retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// Round runs the leader's part of the current phase once: the scan or the
// plan. It returns nil when there is nothing for this member to do.
func (r *Reconciler) Round(ctx context.Context) error {
	rs := r.state.RestoreState()
	phase := rs.GetRestorePhase()
	if phase != waldenv1.RestorePhase_RESTORE_PHASE_SCAN && phase != waldenv1.RestorePhase_RESTORE_PHASE_PLAN {
		return nil
	}
	leader, term := r.cluster.Leadership()
	if !leader {
		return nil
	}
	if r.store == nil {
		if time.Since(r.warned) > time.Minute {
			r.warned = time.Now()
			r.log.Error("the restored cluster cannot reconcile its catalog while its leader has no s3 section: "+
				"give every member the s3 section of the cluster's bucket and restart it", "phase", phase.Name())
		}
		return nil
	}
	if err := r.cluster.LinearizableRead(ctx); err != nil {
		return fmt.Errorf("reconcile: read barrier: %w", err)
	}
	rs = r.state.RestoreState()
	switch rs.GetRestorePhase() {
	case waldenv1.RestorePhase_RESTORE_PHASE_SCAN:
		return r.scan(ctx, term, rs)
	case waldenv1.RestorePhase_RESTORE_PHASE_PLAN:
		return r.plan(ctx, term, rs)
	}
	return nil
}

// listPrefix is the S3 prefix every walden object key of the cluster
// starts with.
func (r *Reconciler) listPrefix() string {
	if p := strings.Trim(r.store.Prefix(), "/"); p != "" {
		return p + "/"
	}
	return ""
}

// afterBackup reports whether the object of key parts kp may have been
// written after the backup: under a broker epoch not below the broker's at
// the backup (or, for a broker the backup did not know, not below its next
// token).
func afterBackup(rs *waldenv1.RestoreState, kp objformat.KeyParts) bool {
	if e, ok := rs.GetBackupEpochs()[kp.Broker]; ok {
		return kp.Epoch >= e
	}
	return kp.Epoch >= rs.GetBackupNextEpoch()
}

// scan lists the cluster's prefix and proposes the brokers that wrote after
// the backup that the registry lacks.
func (r *Reconciler) scan(ctx context.Context, term uint64, rs *waldenv1.RestoreState) error {
	start := time.Now()
	objs, err := r.store.List(ctx, r.listPrefix())
	if err != nil {
		return fmt.Errorf("reconcile: scan: %w", err)
	}
	known := map[string]bool{}
	for _, b := range r.state.Brokers() {
		known[b.GetBrokerId()] = true
	}
	found := map[string]bool{}
	for _, o := range objs {
		kp, ok := objformat.ParseKey(r.store.Prefix(), o.Key)
		if ok && !known[kp.Broker] && afterBackup(rs, kp) {
			found[kp.Broker] = true
		}
	}
	var brokers []string
	for b := range found {
		brokers = append(brokers, b)
	}
	sort.Strings(brokers)
	r.log.Info("restore: scanned the cluster's prefix", "prefix", r.listPrefix(), "keys", len(objs), "brokers_found", brokers,
		"elapsed", time.Since(start).Round(time.Millisecond))
	_, err = r.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_ReconcileScan{ReconcileScan: &waldenv1.ReconcileScan{
		Term: term, BrokersFound: brokers, ObjectsListed: uint64(len(objs)), LiveMembers: r.cluster.LiveMembers()}}})
	return err
}

func (r *Reconciler) propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := r.cluster.Propose(pctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("reconcile: propose: %w", err)
	}
	return res, nil
}

// checked is one object read and checked against its own index.
type checked struct {
	info    objstore.ObjectInfo
	kp      objformat.KeyParts
	cand    *Candidate
	damaged string
	bytes   int64
}

// plan reads and checks the objects written after the backup, plans the
// streams' continuations with the WALs' surveys, and proposes the commits
// and the plan.
func (r *Reconciler) plan(ctx context.Context, term uint64, rs *waldenv1.RestoreState) error {
	start := time.Now()
	rep := &waldenv1.RestoreReport{ObjectsListed: rs.GetReport().GetObjectsListed()}
	// 1. What the restore jobs found in the brokers' WALs.
	runs := r.surveyedRuns(rs)
	// 2. The objects written after the backup that the catalog does not
	// hold whole, read and checked against their own index.
	objs, err := r.store.List(ctx, r.listPrefix())
	if err != nil {
		return fmt.Errorf("reconcile: plan: %w", err)
	}
	rep.ObjectsListed = uint64(len(objs))
	committed := r.state.CommittedKeys()
	todo := r.toCheck(rs, objs, rep)
	if err := r.check(ctx, term, todo, committed); err != nil {
		return err
	}
	// 3. Each stream's continuation, from the catalog as it stands now.
	out := Plan(r.planInput(todo, runs, rep))
	// 4. The objects committed again, in the plan's order, then the plan.
	if err := r.proposeCommits(ctx, term, out.Commits); err != nil {
		return err
	}
	r.reportPlan(rep, out)
	_, err = r.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_ReconcilePlan{ReconcilePlan: &waldenv1.ReconcilePlan{
		Term: term, Tails: out.Tails, Report: rep}}})
	if err != nil {
		return err
	}
	r.log.Info("restore: the objects written after the backup are committed again", "objects", len(out.Commits),
		"ranges", out.RangesCommitted, "tails", len(out.Tails), "redundant", out.Redundant, "superseded", out.Superseded,
		"damaged", len(rep.GetDamaged()), "gaps", len(out.Gaps), "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// surveyedRuns are the runs of records the restore jobs' surveys found in
// their brokers' WALs.
func (r *Reconciler) surveyedRuns(rs *waldenv1.RestoreState) []Run {
	var runs []Run
	for _, id := range rs.GetJobIds() {
		j, ok := r.state.Job(id)
		if !ok {
			continue
		}
		for _, run := range j.GetSurvey().GetRuns() {
			runs = append(runs, Run{Broker: j.GetBrokerId(), Stream: run.GetStreamId(), Epoch: run.GetStreamEpoch(),
				Start: run.GetStartOffset(), End: run.GetEndOffset()})
		}
	}
	return runs
}

// toCheck are the objects of the listing to read and check: walden's,
// written after the backup, and not held whole by the catalog. The others
// are counted in rep by why they are left.
func (r *Reconciler) toCheck(rs *waldenv1.RestoreState, objs []objstore.ObjectInfo, rep *waldenv1.RestoreReport) []checked {
	var todo []checked
	for _, o := range objs {
		kp, ok := objformat.ParseKey(r.store.Prefix(), o.Key)
		switch {
		case !ok:
			rep.ObjectsNotWalden++
		case !afterBackup(rs, kp):
			rep.ObjectsOlder++
		default:
			if _, whole := r.state.Object(kp.ObjectID()); whole {
				rep.ObjectsKnown++
				continue
			}
			todo = append(todo, checked{info: o, kp: kp})
		}
	}
	return todo
}

// planInput is the plan's input: the catalog's streams, the objects checked
// that have ranges left to commit (in key order) and the WALs' runs. A
// damaged object is logged and reported, never a candidate.
func (r *Reconciler) planInput(todo []checked, runs []Run, rep *waldenv1.RestoreReport) Input {
	in := Input{Streams: map[uint64]Stream{}, Runs: runs}
	for _, st := range r.state.Streams("", "") {
		in.Streams[st.GetStreamId()] = Stream{End: st.GetEndOffset(), Floor: r.state.StreamEpochFloor(st.GetStreamId())}
	}
	for i := range todo {
		c := &todo[i]
		switch {
		case c.damaged != "":
			r.log.Warn("restore: an object written after the backup does not check out against its own index: not committed",
				"key", c.info.Key, "err", c.damaged)
			if len(rep.Damaged) < maxReportItems {
				rep.Damaged = append(rep.Damaged, &waldenv1.DamagedObject{Key: c.info.Key, Error: c.damaged})
			}
		case c.cand == nil:
			rep.ObjectsKnown++ // every range of it is committed already
		default:
			in.Candidates = append(in.Candidates, *c.cand)
		}
	}
	sort.SliceStable(in.Candidates, func(i, j int) bool { return in.Candidates[i].Object.GetKey() < in.Candidates[j].Object.GetKey() })
	return in
}

// proposeCommits proposes the plan's commits in order, Chunk objects to an
// entry.
func (r *Reconciler) proposeCommits(ctx context.Context, term uint64, commits []*waldenv1.ReconciledObject) error {
	for i := 0; i < len(commits); i += r.cfg.Chunk {
		chunk := commits[i:min(len(commits), i+r.cfg.Chunk)]
		if _, err := r.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_ReconcileObjects{ReconcileObjects: &waldenv1.ReconcileObjects{
			Term: term, Objects: chunk}}}); err != nil {
			return err
		}
	}
	return nil
}

// reportPlan records the plan's outcome in rep and logs its gaps and the
// tails the restore jobs commit from their WALs.
func (r *Reconciler) reportPlan(rep *waldenv1.RestoreReport, out Output) {
	rep.ObjectsCommitted = uint64(len(out.Commits))
	rep.RangesCommitted = out.RangesCommitted
	rep.ObjectsRedundant = out.Redundant
	rep.ObjectsSuperseded = out.Superseded
	rep.StreamsExtended = out.StreamsExtended
	for _, g := range out.Gaps {
		r.log.Warn("restore: records beyond a stream's reconciled end are out of reach", "gap", g)
		if len(rep.Gaps) < maxReportItems {
			rep.Gaps = append(rep.Gaps, g)
		}
	}
	for _, t := range out.Tails {
		r.log.Info("restore: a stream's tail is in a WAL", "stream_id", t.GetStreamId(), "broker_id", t.GetBrokerId(),
			"stream_epoch", t.GetStreamEpoch(), "from_offset", t.GetFromOffset(), "end_offset", t.GetEndOffset())
	}
}

// maxReportItems bounds the damaged objects and gaps a report carries
// (fsm.MaxRestoreReportItems).
const maxReportItems = 1000

// check reads every object of todo, Readers at a time, and checks it
// against its own index: a damaged one is marked, a good one becomes a
// candidate with the ranges the catalog does not hold yet. A failure to
// read (not a damaged object) fails the round. Progress is recorded.
func (r *Reconciler) check(ctx context.Context, term uint64, todo []checked, committed map[string][]uint64) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu       sync.Mutex
		done     uint64
		read     uint64
		firstErr error
	)
	progress := func() {
		mu.Lock()
		p := &waldenv1.RestoreProgress{ObjectsTotal: uint64(len(todo)), ObjectsChecked: done, BytesRead: read}
		mu.Unlock()
		if _, err := r.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_ReconcileProgress{ReconcileProgress: &waldenv1.ReconcileProgress{
			Term: term, Progress: p}}}); err != nil {
			r.log.Debug("restore: progress not recorded", "err", err)
		}
	}
	stop := make(chan struct{})
	var tick sync.WaitGroup
	tick.Add(1)
	go func() {
		defer tick.Done()
		t := time.NewTicker(r.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				progress()
			}
		}
	}()
	work := make(chan int)
	var wg sync.WaitGroup
	for range r.cfg.Readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				err := r.checkOne(ctx, &todo[i], committed[todo[i].info.Key])
				mu.Lock()
				done++
				read += uint64(todo[i].bytes)
				if err != nil && firstErr == nil {
					firstErr = err
					cancel(err)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range todo {
		select {
		case work <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	close(stop)
	tick.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if len(todo) > 0 {
		progress()
	}
	return nil
}

// checkOne reads one object and checks it against its own index.
func (r *Reconciler) checkOne(ctx context.Context, c *checked, done []uint64) error {
	if c.info.Size <= 0 {
		c.damaged = "empty object"
		return nil
	}
	data, err := r.store.GetRange(ctx, c.info.Key, 0, c.info.Size)
	if err != nil {
		return fmt.Errorf("reconcile: read %s: %w", c.info.Key, err)
	}
	c.bytes = int64(len(data))
	if int64(len(data)) != c.info.Size {
		c.damaged = fmt.Sprintf("read %d bytes, the listing says %d", len(data), c.info.Size)
		return nil
	}
	ix, batches, err := objformat.ReadAll(bytes.NewReader(data), c.info.Size)
	if err != nil {
		c.damaged = strings.ReplaceAll(err.Error(), "objformat: ", "")
		return nil
	}
	var sum producer.Summary
	for _, b := range batches {
		// A malformed producer header: the batch is stored all the same
		// (its CRC held); only its producer's retries are not recognized.
		_ = sum.Add(b.StreamID, b.BaseOffset, b.Count, b.Payload)
	}
	prods := map[uint64][]*waldenv1.ProducerState{}
	for _, sp := range sum.Streams() {
		prods[sp.GetStreamId()] = sp.GetProducers()
	}
	skip := map[uint64]bool{}
	for _, s := range done {
		skip[s] = true
	}
	all := ix.Ranges()
	var ranges []*waldenv1.ObjectRange
	for _, rg := range all {
		if !skip[rg.GetStreamId()] {
			ranges = append(ranges, rg)
		}
	}
	if len(ranges) == 0 {
		return nil
	}
	kp := c.kp
	c.cand = &Candidate{
		Object: &waldenv1.Object{ObjectId: kp.ObjectID(), Key: c.info.Key, Size: uint64(c.info.Size), Ranges: ranges,
			BrokerId: kp.Broker, BrokerEpoch: kp.Epoch, FirstWalOffset: kp.FirstWAL, LastWalOffset: kp.LastWAL,
			Crc32C: objformat.CRC32C(data)},
		Whole:     len(ranges) == len(all),
		Producers: prods,
	}
	return nil
}
