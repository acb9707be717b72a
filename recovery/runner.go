package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

// JobRunner runs one attempt of a job (the Executor).
type JobRunner interface {
	Run(ctx context.Context, jobID string, attempt uint32) error
}

// Runner is the job loop of one coordinator. On the assignee of a job it
// runs the job's current attempt and renews its job lease; on the leader it
// reassigns jobs whose lease expired.
type Runner struct {
	cfg     Config
	nodeID  string
	state   State
	cluster Cluster
	exec    JobRunner
	log     *slog.Logger
	now     func() time.Time

	mu      sync.Mutex
	running map[string]*running
	// stopping are attempts cancelled here that have not returned yet; a
	// job's next attempt on this member waits for its previous one.
	stopping map[string]*running
	// wake makes Run tick again at once (a stopping attempt ended).
	wake chan struct{}
	// leader bookkeeping, reset at every gain of leadership
	term uint64
	seen map[string]*leaseSeen
	wg   sync.WaitGroup
}

type running struct {
	attempt uint32
	cancel  context.CancelFunc
	done    chan struct{}
}

// leaseSeen is what the leader last saw of a job's lease, and when (its own
// monotonic clock).
type leaseSeen struct {
	attempt  uint32
	assignee string
	renewed  int64
	at       time.Time
	tried    time.Time
}

// NewRunner returns a Runner; Run starts it.
func NewRunner(cfg Config, nodeID string, state State, cluster Cluster, exec JobRunner, logger *slog.Logger) *Runner {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, nodeID: nodeID, state: state, cluster: cluster, exec: exec,
		log: logger.With("component", "recovery-runner", "node_id", nodeID), now: time.Now, running: map[string]*running{},
		stopping: map[string]*running{}, wake: make(chan struct{}, 1)}
}

// Run runs the loops until ctx is done, then waits for the attempts it
// started to stop.
func (r *Runner) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.JobLease / 6)
	defer t.Stop()
	defer r.wg.Wait()
	for {
		changed := r.state.Changed()
		r.Tick(ctx)
		select {
		case <-ctx.Done():
			r.mu.Lock()
			for id, run := range r.running {
				run.cancel()
				delete(r.running, id)
			}
			r.mu.Unlock()
			return
		case <-changed:
		case <-t.C:
		case <-r.wake:
		}
	}
}

// kick makes Run tick again soon.
func (r *Runner) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Running returns the attempts this member runs, by job id (tests).
func (r *Runner) Running() map[string]uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]uint32{}
	for id, run := range r.running {
		out[id] = run.attempt
	}
	return out
}

// Tick starts and stops attempts to match the committed assignments, and
// on the leader reassigns expired jobs.
func (r *Runner) Tick(ctx context.Context) {
	active := map[string]*waldenv1.Job{}
	for _, j := range r.state.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED) {
		if j.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING || j.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING {
			active[j.GetJobId()] = j
		}
	}
	r.mu.Lock()
	for id, run := range r.running {
		j, ok := active[id]
		if !ok || j.GetAssigneeId() != r.nodeID || j.GetAttempt() != run.attempt {
			r.log.Info("attempt no longer current here: stopping it", "job_id", id, "attempt", run.attempt)
			run.cancel()
			delete(r.running, id)
			r.stopping[id] = run
		}
	}
	for id, run := range r.stopping {
		select {
		case <-run.done:
			delete(r.stopping, id)
		default:
		}
	}
	for id, j := range active {
		if j.GetAssigneeId() != r.nodeID {
			continue
		}
		if _, ok := r.running[id]; ok || ctx.Err() != nil {
			continue
		}
		if old, ok := r.stopping[id]; ok {
			// The previous attempt of this job on this member has not
			// finished stopping (its plugin processes are being killed and
			// reaped): the next starts only after it, never beside it.
			r.log.Info("next attempt waits for the previous one to stop", "job_id", id, "attempt", j.GetAttempt(), "previous", old.attempt)
			go func() {
				<-old.done
				r.kick()
			}()
			continue
		}
		rctx, cancel := context.WithCancel(ctx)
		run := &running{attempt: j.GetAttempt(), cancel: cancel, done: make(chan struct{})}
		r.running[id] = run
		r.wg.Add(1)
		go r.runAttempt(rctx, id, run)
	}
	r.mu.Unlock()
	r.leaderTick(ctx, active)
}

// runAttempt renews the job lease and runs the executor until it returns.
// It stops the executor when a renewal says the attempt is stale, or when
// no renewal succeeded for job_lease (the leader reassigns by then).
func (r *Runner) runAttempt(ctx context.Context, jobID string, run *running) {
	defer r.wg.Done()
	defer close(run.done)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	log := r.log.With("job_id", jobID, "attempt", run.attempt)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		every := r.cfg.JobLease / 3
		lastOK := r.now()
		for {
			pctx, pcancel := context.WithTimeout(ctx, every)
			_, err := r.cluster.Propose(pctx, &waldenv1.Command{Op: &waldenv1.Command_RenewJobLease{RenewJobLease: &waldenv1.RenewJobLease{
				JobId: jobID, Attempt: run.attempt, AssigneeId: r.nodeID}}})
			pcancel()
			switch {
			case err == nil:
				lastOK = r.now()
			case isStale(err):
				log.Warn("job lease renewal refused: attempt is stale", "err", err)
				cancel(fmt.Errorf("recovery: renew job lease: %w: %w", ErrStale, err))
				return
			case ctx.Err() != nil:
				return
			default:
				log.Warn("job lease renewal failed", "err", err, "since_last_renewal", r.now().Sub(lastOK))
				if r.now().Sub(lastOK) >= r.cfg.JobLease {
					log.Error("no job lease renewal for job_lease: stopping the attempt (the leader reassigns it)")
					cancel(fmt.Errorf("recovery: job lease not renewed for %s: %w", r.cfg.JobLease, ErrStale))
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
		}
	}()
	err := r.exec.Run(ctx, jobID, run.attempt)
	switch {
	case err == nil:
	case errors.Is(err, ErrStale):
		log.Warn("attempt stopped: stale", "err", err)
	case errors.Is(err, ErrBlocked):
		log.Error("attempt stopped: the job is blocked until an operator retries or resolves it", "err", err)
	case ctx.Err() != nil:
		log.Info("attempt stopped", "cause", context.Cause(ctx))
	default:
		log.Error("attempt ended", "err", err)
	}
	cancel(nil)
	<-renewed
	r.mu.Lock()
	if r.running[jobID] == run {
		delete(r.running, jobID)
	}
	r.mu.Unlock()
}

func isStale(err error) bool {
	return errors.Is(err, ErrStale) || errors.Is(err, fencingStale) || errors.Is(err, fencingNotRunning) || errors.Is(err, fencingUnknownJob)
}

// leaderTick, on the leader, notes every renewal it sees applied (on its
// own monotonic clock) and reassigns a job after job_lease without one. A
// job without assignee is reassigned at once. A new term starts every
// clock afresh.
func (r *Runner) leaderTick(ctx context.Context, active map[string]*waldenv1.Job) {
	leader, term := r.cluster.Leadership()
	now := r.now()
	r.mu.Lock()
	if !leader {
		r.term, r.seen = 0, nil
		r.mu.Unlock()
		return
	}
	if r.term != term || r.seen == nil {
		r.term, r.seen = term, map[string]*leaseSeen{}
		r.log.Info("leader: every job lease starts a full job_lease now", "term", term, "active_jobs", len(active))
	}
	var expired []*waldenv1.Job
	for id := range r.seen {
		if _, ok := active[id]; !ok {
			delete(r.seen, id)
		}
	}
	for id, j := range active {
		s, ok := r.seen[id]
		if !ok || s.attempt != j.GetAttempt() || s.assignee != j.GetAssigneeId() || s.renewed != j.GetLeaseRenewedUnixMs() {
			r.seen[id] = &leaseSeen{attempt: j.GetAttempt(), assignee: j.GetAssigneeId(), renewed: j.GetLeaseRenewedUnixMs(), at: now}
			if j.GetAssigneeId() != "" {
				continue
			}
			s = r.seen[id]
		}
		if (j.GetAssigneeId() == "" || now.Sub(s.at) >= r.cfg.JobLease) && now.Sub(s.tried) >= r.cfg.JobLease/3 {
			s.tried = now
			expired = append(expired, j)
		}
	}
	r.mu.Unlock()
	for _, j := range expired {
		reason := fmt.Sprintf("job lease expired: no renewal from %q for %s", j.GetAssigneeId(), r.cfg.JobLease)
		if j.GetAssigneeId() == "" {
			reason = "unassigned"
		}
		live := r.cluster.LiveMembers()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := r.cluster.Propose(pctx, &waldenv1.Command{Op: &waldenv1.Command_ReassignJob{ReassignJob: &waldenv1.ReassignJob{
			JobId: j.GetJobId(), Attempt: j.GetAttempt(), Reason: reason, LiveMembers: live, Term: term}}})
		cancel()
		if err != nil {
			r.log.Warn("reassign job failed", "job_id", j.GetJobId(), "attempt", j.GetAttempt(), "term", term, "err", err)
			continue
		}
		nj := res.GetJob()
		r.log.Warn("job reassigned", "job_id", j.GetJobId(), "broker_id", j.GetBrokerId(), "from", j.GetAssigneeId(),
			"to", nj.GetAssigneeId(), "attempt", nj.GetAttempt(), "term", term, "reason", reason, "live_members", live)
	}
}
