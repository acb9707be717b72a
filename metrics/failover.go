package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	waldenv1 "walden/proto/walden/v1"
	"walden/timeline"
)

// FailoverSource is the replicated state a FailoverWatcher reads (package
// fsm's *State); every method returns copies.
type FailoverSource interface {
	// Jobs returns the jobs of brokerID (all when empty) in state (all
	// when empty).
	Jobs(brokerID string, state waldenv1.JobState) []*waldenv1.Job
	// Events returns the event log of brokerID, oldest first (limit <= 0:
	// all kept).
	Events(brokerID string, limit int) []*waldenv1.Event
	// Changed is closed at the next apply that changes anything.
	Changed() <-chan struct{}
}

// FailoverWatcher observes each failover once it is over, from the
// replicated state, as the same phases `waldenctl failover show` and the web
// view print (package timeline):
//
//	walden_failover_phase_duration_seconds{phase}  detect, fence, lease_wait, attach, read, upload, commit, close, detach, reopen
//	walden_failover_duration_seconds               from the first suspicion (or a manual decision) to the streams open again
//	walden_recovery_job_stalled_seconds            the active job longest without progress, on this member's clock
//
// The phases' times are the proposers' clocks recorded in the state (for
// display and metrics, never for decisions). Every member observes every
// failover that completes while it runs: aggregate across members with
// max, not sum. Failovers completed before the member started (or while
// it replays its log) are not observed.
type FailoverWatcher struct {
	src   FailoverSource
	ready func() bool
	now   func() time.Time
	every time.Duration

	phases  *prometheus.HistogramVec
	total   prometheus.Histogram
	stalled prometheus.GaugeFunc

	mu sync.Mutex
	// seen: the job's steps (succeeded) and its reopen were observed or
	// predate this watcher.
	stepsSeen, reopenSeen map[string]bool
	// progress of each active job and when this member saw it change.
	progress map[string]progressMark
	started  bool
}

type progressMark struct {
	fingerprint [6]uint64
	at          time.Time
}

// failoverBuckets span 50ms to about 1.4 hours.
var failoverBuckets = prometheus.ExponentialBuckets(0.05, 2, 17)

// NewFailoverWatcher returns a watcher of src. ready gates the start: the
// watcher begins once it returns true (the member has replayed its log), so
// that history is not observed as new.
func NewFailoverWatcher(src FailoverSource, ready func() bool) *FailoverWatcher {
	w := &FailoverWatcher{
		src: src, ready: ready, now: time.Now, every: 250 * time.Millisecond,
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "walden_failover_phase_duration_seconds",
			Help:    "Duration of each phase of completed failovers: detect (first suspicion to decision), fence, lease_wait, the recovery steps (attach, read, upload, commit, close, detach) and reopen (until the streams are open on other brokers). Every member observes every failover: aggregate with max.",
			Buckets: failoverBuckets,
		}, []string{"phase"}),
		total: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "walden_failover_duration_seconds",
			Help:    "Duration of completed failovers, from the first suspicion (or a manual decision) until the broker's streams are open on other brokers. Every member observes every failover: aggregate with max.",
			Buckets: failoverBuckets,
		}),
		stepsSeen: map[string]bool{}, reopenSeen: map[string]bool{}, progress: map[string]progressMark{},
	}
	for _, p := range FailoverPhases {
		w.phases.WithLabelValues(p)
	}
	w.stalled = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walden_recovery_job_stalled_seconds",
		Help: "Seconds since this member saw the pending or running recovery job that has gone longest without progress (a step, a checkpoint, bytes uploaded, a new attempt) make progress; 0 when no job is active.",
	}, w.stalledSeconds)
	return w
}

// Collectors are the series to register.
func (w *FailoverWatcher) Collectors() []prometheus.Collector {
	return []prometheus.Collector{w.phases, w.total, w.stalled}
}

// Run watches the state until ctx is done.
func (w *FailoverWatcher) Run(ctx context.Context) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for !w.ready() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	for {
		changed := w.src.Changed()
		w.Scan()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		// At most one scan per period, however fast entries apply.
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Scan compares the state with what the watcher saw last and observes the
// failovers that completed since. The first Scan only records what is
// there.
func (w *FailoverWatcher) Scan() {
	jobs := w.src.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED)
	now := w.now()
	w.mu.Lock()
	first := !w.started
	w.started = true
	w.mu.Unlock()

	active := map[string]bool{}
	for _, j := range jobs {
		id := j.GetJobId()
		switch j.GetJobState() {
		case waldenv1.JobState_JOB_STATE_PENDING, waldenv1.JobState_JOB_STATE_RUNNING:
			active[id] = true
			w.noteProgress(id, j, now)
			continue
		case waldenv1.JobState_JOB_STATE_SUCCEEDED:
		default:
			// Failed or cancelled: not a completed failover.
			w.markSeen(id, true, true)
			continue
		}
		stepsDone, reopenDone := w.seen(id)
		reopened := reopenComplete(j)
		if first {
			w.markSeen(id, true, reopened)
			continue
		}
		if stepsDone && (reopenDone || !reopened) {
			continue
		}
		f := timeline.Build(j, w.src.Events(j.GetBrokerId(), 0))
		if !stepsDone {
			w.observeSteps(f)
		}
		if reopened && !reopenDone {
			w.observeReopen(f, j)
		}
		w.markSeen(id, true, reopened)
	}
	w.mu.Lock()
	for id := range w.progress {
		if !active[id] {
			delete(w.progress, id)
		}
	}
	w.mu.Unlock()
}

// reopenComplete says every stream the job closed is open again (or it
// closed none).
func reopenComplete(j *waldenv1.Job) bool {
	closed := max(j.GetStreamsClosed(), j.GetStreamsTotal())
	return closed == 0 || j.GetStreamsReopened() >= closed
}

func (w *FailoverWatcher) seen(id string) (steps, reopen bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stepsSeen[id], w.reopenSeen[id]
}

func (w *FailoverWatcher) markSeen(id string, steps, reopen bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if steps {
		w.stepsSeen[id] = true
	}
	if reopen {
		w.reopenSeen[id] = true
	}
}

// observeSteps observes detect and the phases up to the end of the job.
func (w *FailoverWatcher) observeSteps(f *waldenv1.Failover) {
	if !f.GetManual() && f.GetFirstSuspectUnixMs() > 0 && f.GetDecidedUnixMs() >= f.GetFirstSuspectUnixMs() {
		w.phases.WithLabelValues("detect").Observe(ms(f.GetDecidedUnixMs() - f.GetFirstSuspectUnixMs()))
	}
	sums := map[string]int64{}
	for _, p := range f.GetPhases() {
		switch p.GetKind() {
		case timeline.KindObserve, timeline.KindDecide, timeline.KindReopen:
			continue
		}
		if p.GetEndUnixMs() > 0 {
			sums[p.GetKind()] += timeline.Duration(p, p.GetEndUnixMs())
		}
	}
	for _, phase := range FailoverPhases {
		if d, ok := sums[phase]; ok {
			w.phases.WithLabelValues(phase).Observe(ms(d))
		}
	}
}

// observeReopen observes the reopen phase and the whole failover.
func (w *FailoverWatcher) observeReopen(f *waldenv1.Failover, j *waldenv1.Job) {
	end := j.GetFinishedUnixMs()
	for _, p := range f.GetPhases() {
		if p.GetKind() == timeline.KindReopen && p.GetEndUnixMs() > 0 {
			w.phases.WithLabelValues("reopen").Observe(ms(timeline.Duration(p, p.GetEndUnixMs())))
			end = max(end, p.GetEndUnixMs())
		}
	}
	start := f.GetDecidedUnixMs()
	if !f.GetManual() && f.GetFirstSuspectUnixMs() > 0 {
		start = min(start, f.GetFirstSuspectUnixMs())
	}
	if start > 0 && end >= start {
		w.total.Observe(ms(end - start))
	}
}

func ms(d int64) float64 { return float64(d) / 1000 }

// noteProgress records when this member saw job j change.
func (w *FailoverWatcher) noteProgress(id string, j *waldenv1.Job, now time.Time) {
	fp := [6]uint64{uint64(j.GetAttempt()), uint64(len(j.GetCheckpoints())), j.GetBytesUploaded(),
		uint64(j.GetStreamsClosed()), uint64(j.GetJobStep()), uint64(j.GetJobState())}
	w.mu.Lock()
	defer w.mu.Unlock()
	if m, ok := w.progress[id]; ok && m.fingerprint == fp {
		return
	}
	w.progress[id] = progressMark{fingerprint: fp, at: now}
}

func (w *FailoverWatcher) stalledSeconds() float64 {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var worst time.Duration
	for _, m := range w.progress {
		worst = max(worst, now.Sub(m.at))
	}
	return worst.Seconds()
}
