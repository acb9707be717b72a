package fsm

import (
	"fmt"
	"sort"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// knownStep reports whether step is one of the executor's steps.
func knownStep(step waldenv1.JobStep) bool {
	return step >= waldenv1.JobStep_JOB_STEP_FENCE && step <= waldenv1.JobStep_JOB_STEP_DONE
}

func jobActive(j *waldenv1.Job) bool {
	return j.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING || j.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING
}

// activeJobOf returns the pending or running job of broker id, or nil.
func (s *State) activeJobOf(brokerID string) *waldenv1.Job {
	for _, id := range sortedKeys(s.jobs) {
		if j := s.jobs[id]; j.GetBrokerId() == brokerID && jobActive(j) {
			return j
		}
	}
	return nil
}

// pickAssignee chooses a job's assignee among the live members that are
// current members: the one with the fewest pending or running jobs, ties to
// the smallest id. exclude (the previous assignee) is skipped unless it is
// the only candidate. "" when there is none.
func (s *State) pickAssignee(live []string, exclude string) string {
	seen := map[string]bool{}
	var cands []string
	for _, id := range live {
		if id != "" && !seen[id] && s.isMember(id) {
			seen[id] = true
			cands = append(cands, id)
		}
	}
	if len(cands) > 1 && seen[exclude] {
		kept := cands[:0]
		for _, id := range cands {
			if id != exclude {
				kept = append(kept, id)
			}
		}
		cands = kept
	}
	load := map[string]int{}
	for _, j := range s.jobs {
		if jobActive(j) {
			load[j.GetAssigneeId()]++
		}
	}
	sort.Strings(cands)
	best := ""
	for _, id := range cands {
		if best == "" || load[id] < load[best] {
			best = id
		}
	}
	return best
}

// job returns job id, or JOB_NOT_FOUND.
func (s *State) job(op, id string) (*waldenv1.Job, error) {
	j, ok := s.jobs[id]
	if !ok {
		return nil, fmt.Errorf("%s: job %q: %w", op, id, refusal.ErrUnknownJob)
	}
	return j, nil
}

// currentAttempt refuses a command for job j that is not pending or running
// (JOB_NOT_RUNNING) or not of its current attempt (STALE_ATTEMPT).
func currentAttempt(op string, j *waldenv1.Job, attempt uint32) error {
	if !jobActive(j) {
		return fmt.Errorf("%s: job %s is %s: %w", op, j.GetJobId(), j.GetJobState().Name(), refusal.ErrJobNotRunning)
	}
	if attempt != j.GetAttempt() {
		return fmt.Errorf("%s: job %s attempt %d, current attempt %d: %w",
			op, j.GetJobId(), attempt, j.GetAttempt(), refusal.ErrStaleAttempt)
	}
	return nil
}

// jobEvent appends an event of kind job about j: its attempt, assignee
// and state now, its broker's state now and from (touchBroker's), and d's
// other fields (the job's state before, a reason...).
func (s *State) jobEvent(index uint64, actor string, j *waldenv1.Job, from waldenv1.BrokerState, d *waldenv1.EventDetail) {
	d.Epoch, d.Attempt, d.Member, d.JobState = j.GetToken(), j.GetAttempt(), j.GetAssigneeId(), j.GetJobState()
	d.FromState, d.ToState = from, s.brokers[j.GetBrokerId()].GetBrokerState()
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_JOB, BrokerId: j.GetBrokerId(), JobId: j.GetJobId(),
		Actor: actor, Detail: d})
}

// startRunning moves the current attempt of pending job j to running.
func (s *State) startRunning(index uint64, j *waldenv1.Job) {
	j.JobState = waldenv1.JobState_JOB_STATE_RUNNING
	from := s.touchBroker(j)
	s.jobEvent(index, j.GetAssigneeId(), j, from, &waldenv1.EventDetail{FromJobState: waldenv1.JobState_JOB_STATE_PENDING})
}

// touchBroker re-derives the state of job j's broker and returns the state
// it had.
func (s *State) touchBroker(j *waldenv1.Job) waldenv1.BrokerState {
	b, ok := s.brokers[j.GetBrokerId()]
	if !ok {
		return waldenv1.BrokerState_BROKER_STATE_UNSPECIFIED
	}
	from := b.GetBrokerState()
	s.deriveState(b)
	return from
}

func jobResult(j *waldenv1.Job) *waldenv1.Result {
	return &waldenv1.Result{Value: &waldenv1.Result_Job{Job: clone(j)}}
}

// applyRenewJobLease renews the job lease of the current attempt's
// assignee; the first renewal moves the job from pending to running.
func (s *State) applyRenewJobLease(index uint64, cmd *waldenv1.Command, op *waldenv1.RenewJobLease) (*waldenv1.Result, error) {
	if op.GetAssigneeId() == "" {
		return nil, invalid("renew job lease %s: assignee_id is empty", op.GetJobId())
	}
	j, err := s.job("renew job lease", op.GetJobId())
	if err != nil {
		return nil, err
	}
	if err := currentAttempt("renew job lease", j, op.GetAttempt()); err != nil {
		return nil, err
	}
	if op.GetAssigneeId() != j.GetAssigneeId() {
		return nil, fmt.Errorf("renew job lease: job %s is assigned to %q, not %q: %w",
			j.GetJobId(), j.GetAssigneeId(), op.GetAssigneeId(), refusal.ErrStaleAttempt)
	}
	j.LeaseRenewedUnixMs = s.now()
	j.UpdatedUnixMs = s.now()
	if j.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING {
		s.startRunning(index, j)
	}
	return jobResult(j), nil
}

// applyReassignJob starts attempt+1 of a pending or running job on another
// live member. It applies only if the job is still at attempt.
func (s *State) applyReassignJob(index, term uint64, cmd *waldenv1.Command, op *waldenv1.ReassignJob) (*waldenv1.Result, error) {
	j, err := s.job("reassign job", op.GetJobId())
	if err != nil {
		return nil, err
	}
	if op.GetTerm() != 0 && op.GetTerm() != term {
		return nil, fmt.Errorf("reassign job %s: decided in term %d, appended in term %d: %w",
			j.GetJobId(), op.GetTerm(), term, refusal.ErrDecidedInAnotherTerm)
	}
	if err := currentAttempt("reassign job", j, op.GetAttempt()); err != nil {
		return nil, err
	}
	prev, fromJob := j.GetAssigneeId(), j.GetJobState()
	// The job's own load must not count against the candidates.
	j.JobState = waldenv1.JobState_JOB_STATE_UNSPECIFIED
	next := s.pickAssignee(op.GetLiveMembers(), prev)
	j.JobState = waldenv1.JobState_JOB_STATE_PENDING
	j.Attempt++
	j.AssigneeId = next
	j.Error = op.GetReason()
	j.UpdatedUnixMs = s.now()
	from := s.touchBroker(j)
	s.jobEvent(index, cmd.GetProposerId(), j, from, &waldenv1.EventDetail{FromJobState: fromJob, FromMember: prev, Reason: op.GetReason()})
	return jobResult(j), nil
}

// applyCheckpointJob records the progress of the current attempt. Non-zero
// counters replace the job's; error replaces it (empty clears); step_done
// appends a Checkpoint and moves to the next step.
func (s *State) applyCheckpointJob(index uint64, op *waldenv1.CheckpointJob) (*waldenv1.Result, error) {
	j, err := s.job("checkpoint job", op.GetJobId())
	if err != nil {
		return nil, err
	}
	if err := currentAttempt("checkpoint job", j, op.GetAttempt()); err != nil {
		return nil, err
	}
	if err := checkCheckpoint(j, op); err != nil {
		return nil, err
	}
	if j.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING {
		// The attempt started with a checkpoint, before any lease renewal.
		s.startRunning(index, j)
	}
	s.recordCheckpoint(index, j, op)
	return jobResult(j), nil
}

// checkCheckpoint checks a checkpoint of j: a known step, step_done with a
// step, a survey only of a restore job, a bounded target report.
func checkCheckpoint(j *waldenv1.Job, op *waldenv1.CheckpointJob) error {
	step := op.GetJobStep()
	if step != waldenv1.JobStep_JOB_STEP_UNSPECIFIED && !knownStep(step) {
		return invalid("checkpoint job %s: step %q is not one of %v", j.GetJobId(), step.Name(), waldenv1.Names[waldenv1.JobStep]())
	}
	if op.GetStepDone() && step == waldenv1.JobStep_JOB_STEP_UNSPECIFIED {
		return invalid("checkpoint job %s: step_done without step", j.GetJobId())
	}
	if sv := op.GetSurvey(); sv != nil {
		if !j.GetRestore() {
			return invalid("checkpoint job %s: survey: only a restore job surveys its WAL", j.GetJobId())
		}
		if err := checkSurvey(j.GetJobId(), sv); err != nil {
			return err
		}
	}
	if r := op.GetTargetReport(); r != nil && (len(r.GetStreams()) > MaxTargetReportItems || len(r.GetObjects()) > MaxTargetReportItems) {
		return invalid("checkpoint job %s: target_report: %d streams and %d objects, more than %d", j.GetJobId(),
			len(r.GetStreams()), len(r.GetObjects()), MaxTargetReportItems)
	}
	return nil
}

// recordCheckpoint records a checked checkpoint in j: its step, its
// non-zero counters, gaps, report and error, its survey, and a Checkpoint
// with the move to the next step when the step is done.
func (s *State) recordCheckpoint(index uint64, j *waldenv1.Job, op *waldenv1.CheckpointJob) {
	step := op.GetJobStep()
	if step != waldenv1.JobStep_JOB_STEP_UNSPECIFIED {
		j.JobStep = step
	}
	setNonZero(&j.BytesUploaded, op.GetBytesUploaded())
	setNonZero(&j.BytesTotal, op.GetBytesTotal())
	setNonZero(&j.StreamsClosed, op.GetStreamsClosed())
	setNonZero(&j.StreamsTotal, op.GetStreamsTotal())
	setNonZero(&j.SkippedBytes, op.GetSkippedBytes())
	setNonZero(&j.RecordsUploaded, op.GetRecordsUploaded())
	if op.GetRecoveredWalOffset() != 0 {
		j.RecoveredWalOffset = op.GetRecoveredWalOffset()
	}
	if len(op.GetGaps()) > 0 {
		j.Gaps = append([]string(nil), op.GetGaps()...)
	}
	if r := op.GetTargetReport(); r != nil {
		j.TargetReport = clone(r)
	}
	j.Error = op.GetError()
	j.UpdatedUnixMs = s.now()
	if sv := op.GetSurvey(); sv != nil {
		s.recordSurvey(index, j, sv)
	}
	if op.GetStepDone() {
		j.Checkpoints = append(j.Checkpoints, &waldenv1.Checkpoint{JobStep: step, Attempt: j.GetAttempt(),
			Index: index, UnixMs: s.now(), Detail: op.GetDetail()})
		if step < waldenv1.JobStep_JOB_STEP_DONE {
			j.JobStep = step + 1
		}
	}
}

// MaxTargetReportItems bounds the streams and the objects of a job's
// target report (an AutoMQ node holds a few thousand streams at most).
const MaxTargetReportItems = 1 << 16

func setNonZero[T uint32 | uint64](dst *T, v T) {
	if v != 0 {
		*dst = v
	}
}

// applyFinishJob ends the current attempt. Succeeded needs every stream of
// the broker closed (STREAM_NOT_CLOSED) and marks the broker recovered with
// the recovered WAL offset; failed records the error.
func (s *State) applyFinishJob(index uint64, cmd *waldenv1.Command, op *waldenv1.FinishJob) (*waldenv1.Result, error) {
	j, err := s.job("finish job", op.GetJobId())
	if err != nil {
		return nil, err
	}
	if err := currentAttempt("finish job", j, op.GetAttempt()); err != nil {
		return nil, err
	}
	switch op.GetJobState() {
	case waldenv1.JobState_JOB_STATE_SUCCEEDED:
		for _, id := range sortedKeys(s.streams) {
			if st := s.streams[id]; st.GetOwnerBrokerId() == j.GetBrokerId() && st.GetState() == StreamOpened {
				return nil, fmt.Errorf("finish job %s: stream %d of broker %q is still opened: %w",
					j.GetJobId(), id, j.GetBrokerId(), refusal.ErrStreamNotClosed)
			}
		}
	case waldenv1.JobState_JOB_STATE_FAILED:
	default:
		return nil, invalid("finish job %s: state %q is not succeeded or failed", j.GetJobId(), op.GetJobState().Name())
	}
	fromJob := j.GetJobState()
	j.JobState = op.GetJobState()
	j.Error = op.GetError()
	j.FinishedUnixMs = s.now()
	j.UpdatedUnixMs = s.now()
	if op.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED {
		j.JobStep = waldenv1.JobStep_JOB_STEP_DONE
		j.RecoveredWalOffset = op.GetRecoveredWalOffset()
		if b, ok := s.brokers[j.GetBrokerId()]; ok && b.GetLastJobId() == j.GetJobId() {
			b.RecoveredWalOffset = op.GetRecoveredWalOffset()
			if !j.GetRestore() {
				// The cooldown counts failovers: a restore's job is none
				// (the broker did not fail), and every broker has one.
				b.RecoveredUnixMs = s.now()
			}
		}
	}
	from := s.touchBroker(j)
	s.jobEvent(index, cmd.GetProposerId(), j, from, &waldenv1.EventDetail{FromJobState: fromJob, Reason: op.GetError()})
	if j.GetRestore() {
		s.advanceRestore(index, cmd.GetProposerId())
	}
	return jobResult(j), nil
}

// applyCancelJob cancels a pending or running job; its broker stays fenced.
func (s *State) applyCancelJob(index uint64, cmd *waldenv1.Command, op *waldenv1.CancelJob) (*waldenv1.Result, error) {
	j, err := s.job("cancel job", op.GetJobId())
	if err != nil {
		return nil, err
	}
	if !jobActive(j) && j.GetJobState() != waldenv1.JobState_JOB_STATE_BLOCKED {
		return nil, fmt.Errorf("cancel job: job %s is %s: %w", j.GetJobId(), j.GetJobState().Name(), refusal.ErrJobNotRunning)
	}
	if j.GetRestore() && s.reconcilingLocked() {
		// The reconciliation waits for every restore job: a cancelled one
		// would hold it, and its streams, forever.
		return nil, s.refuseReconciling(fmt.Sprintf("cancel job %s (resolve it with --wal-lost if its WAL is gone for good)", j.GetJobId()))
	}
	fromJob := j.GetJobState()
	j.JobState = waldenv1.JobState_JOB_STATE_CANCELLED
	j.FinishedUnixMs = s.now()
	j.UpdatedUnixMs = s.now()
	from := s.touchBroker(j)
	s.jobEvent(index, actorOf(op.GetActor(), cmd), j, from, &waldenv1.EventDetail{FromJobState: fromJob})
	return jobResult(j), nil
}

// applyRetryJob starts a failed or cancelled job again with attempt+1, while
// its broker is still fenced at the job's token.
func (s *State) applyRetryJob(index uint64, cmd *waldenv1.Command, op *waldenv1.RetryJob) (*waldenv1.Result, error) {
	j, err := s.job("retry job", op.GetJobId())
	if err != nil {
		return nil, err
	}
	switch j.GetJobState() {
	case waldenv1.JobState_JOB_STATE_FAILED, waldenv1.JobState_JOB_STATE_CANCELLED, waldenv1.JobState_JOB_STATE_BLOCKED:
	case waldenv1.JobState_JOB_STATE_PENDING, waldenv1.JobState_JOB_STATE_RUNNING:
		return nil, fmt.Errorf("retry job: job %s is %s: %w", j.GetJobId(), j.GetJobState().Name(), refusal.ErrRecoveryRunning)
	default:
		return nil, invalid("retry job: job %s already succeeded", j.GetJobId())
	}
	if b, ok := s.brokers[j.GetBrokerId()]; !ok || !b.GetFenced() || b.GetEpoch() != j.GetToken() {
		return nil, fmt.Errorf("retry job: job %s token %d: broker %q registered again since: %w",
			j.GetJobId(), j.GetToken(), j.GetBrokerId(), refusal.ErrEpochExpired)
	}
	fromJob, fromMember := j.GetJobState(), j.GetAssigneeId()
	next := s.pickAssignee(op.GetLiveMembers(), "")
	j.JobState = waldenv1.JobState_JOB_STATE_PENDING
	j.Attempt++
	j.AssigneeId = next
	j.Error = ""
	j.FinishedUnixMs = 0
	j.UpdatedUnixMs = s.now()
	from := s.touchBroker(j)
	s.jobEvent(index, actorOf(op.GetActor(), cmd), j, from, &waldenv1.EventDetail{FromJobState: fromJob, FromMember: fromMember})
	return jobResult(j), nil
}

// applyBlockJob moves the current attempt of a pending or running job to
// blocked: its step failed without interruption for longer than
// recovery.blocked_after. The job keeps its broker fenced; an operator
// retries or resolves it.
func (s *State) applyBlockJob(index uint64, cmd *waldenv1.Command, op *waldenv1.BlockJob) (*waldenv1.Result, error) {
	j, err := s.job("block job", op.GetJobId())
	if err != nil {
		return nil, err
	}
	if err := currentAttempt("block job", j, op.GetAttempt()); err != nil {
		return nil, err
	}
	if op.GetError() == "" {
		return nil, invalid("block job %s: error is empty: a blocked job says why", j.GetJobId())
	}
	fromJob := j.GetJobState()
	j.JobState = waldenv1.JobState_JOB_STATE_BLOCKED
	if knownStep(op.GetJobStep()) {
		j.JobStep = op.GetJobStep()
	}
	j.Error = op.GetError()
	j.BlockedUnixMs = s.now()
	j.UpdatedUnixMs = s.now()
	from := s.touchBroker(j)
	s.jobEvent(index, cmd.GetProposerId(), j, from, &waldenv1.EventDetail{FromJobState: fromJob, JobStep: j.GetJobStep(),
		DurationMs: op.GetFailingMs(), Reason: op.GetError()})
	return jobResult(j), nil
}

// applyResolveJob is an operator's resolution of a blocked or failed job: a
// new attempt, with the reason recorded in the job and the event log; with
// wal_lost the attempts recover nothing from the WAL.
func (s *State) applyResolveJob(index uint64, cmd *waldenv1.Command, op *waldenv1.ResolveJob) (*waldenv1.Result, error) {
	j, err := s.job("resolve job", op.GetJobId())
	if err != nil {
		return nil, err
	}
	if op.GetReason() == "" {
		return nil, invalid("resolve job %s: reason is empty: a resolution says why (--reason)", j.GetJobId())
	}
	switch j.GetJobState() {
	case waldenv1.JobState_JOB_STATE_BLOCKED, waldenv1.JobState_JOB_STATE_FAILED:
	case waldenv1.JobState_JOB_STATE_PENDING, waldenv1.JobState_JOB_STATE_RUNNING:
		return nil, fmt.Errorf("resolve job: job %s is %s, not blocked: wait for it, or cancel it: %w",
			j.GetJobId(), j.GetJobState().Name(), refusal.ErrRecoveryRunning)
	default:
		return nil, invalid("resolve job: job %s is %s: only a blocked or failed job is resolved", j.GetJobId(), j.GetJobState().Name())
	}
	if b, ok := s.brokers[j.GetBrokerId()]; !ok || !b.GetFenced() || b.GetEpoch() != j.GetToken() {
		return nil, fmt.Errorf("resolve job: job %s token %d: broker %q registered again since: %w",
			j.GetJobId(), j.GetToken(), j.GetBrokerId(), refusal.ErrEpochExpired)
	}
	fromJob, fromMember := j.GetJobState(), j.GetAssigneeId()
	next := s.pickAssignee(op.GetLiveMembers(), "")
	j.JobState = waldenv1.JobState_JOB_STATE_PENDING
	j.Attempt++
	j.AssigneeId = next
	j.Error = ""
	j.FinishedUnixMs = 0
	j.UpdatedUnixMs = s.now()
	j.WalLost = j.GetWalLost() || op.GetWalLost()
	j.Resolution = op.GetReason()
	from := s.touchBroker(j)
	s.jobEvent(index, actorOf(op.GetActor(), cmd), j, from, &waldenv1.EventDetail{FromJobState: fromJob, FromMember: fromMember,
		Reason: op.GetReason(), WalLost: op.GetWalLost()})
	if j.GetRestore() && j.GetWalLost() && j.GetSurvey() == nil {
		// Its WAL is gone for good: nothing to survey.
		s.recordSurvey(index, j, &waldenv1.RestoreSurvey{WalLost: true})
	}
	return jobResult(j), nil
}

// Job returns a copy of job id.
func (s *State) Job(id string) (*waldenv1.Job, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	j, ok := s.jobs[id]
	if !ok {
		return nil, false
	}
	return clone(j), true
}

// Jobs returns copies of the jobs of brokerID (all when empty) in state
// (all when unspecified), oldest first (by token).
func (s *State) Jobs(brokerID string, state waldenv1.JobState) []*waldenv1.Job {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*waldenv1.Job
	for _, j := range s.sortedJobs() {
		if (brokerID == "" || j.GetBrokerId() == brokerID) && (state == waldenv1.JobState_JOB_STATE_UNSPECIFIED || j.GetJobState() == state) {
			out = append(out, j)
		}
	}
	return out
}

// sortedJobs returns copies of every job ordered by token.
func (s *State) sortedJobs() []*waldenv1.Job {
	out := make([]*waldenv1.Job, 0, len(s.jobs))
	for _, id := range sortedKeys(s.jobs) {
		out = append(out, clone(s.jobs[id]))
	}
	sort.SliceStable(out, func(i, k int) bool { return out[i].GetToken() < out[k].GetToken() })
	return out
}

// ActiveJobs is the number of pending or running jobs.
func (s *State) ActiveJobs() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, j := range s.jobs {
		if jobActive(j) {
			n++
		}
	}
	return n
}
