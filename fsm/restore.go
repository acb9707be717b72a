package fsm

import (
	"fmt"
	"slices"
	"sort"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// The restore reconciliation (docs/state.md#restore-reconciliation). A
// cluster restored from a backup (backup.Restore writes RestoreState in
// phase scan) lacks what the old cluster committed after the backup, and
// the brokers' WALs hold what they acknowledged and never uploaded. Before
// any broker registers or any stream opens, so that no offset acknowledged
// before is issued again, the cluster finds all of it:
//
//   - scan (leader): the keys under the cluster's prefix in S3 name the
//     brokers that wrote after the backup; ReconcileScan adds those the
//     registry lacks and gives every broker a restore job (a new token,
//     fenced), which reads its WAL;
//   - survey (restore jobs): each job reports the runs of records its WAL
//     holds per stream and stream epoch (CheckpointJob.survey);
//   - plan (leader): the objects written after the backup are checked
//     against their own index and committed again in order
//     (ReconcileObjects), then each stream's records beyond its reconciled
//     end are given to the WAL that holds them (ReconcilePlan: the stream is
//     opened for that broker's job, every other stream is closed);
//   - recover (restore jobs): each job commits its streams' tails and
//     closes them, as a failover does;
//   - done: brokers register and streams open again.

// MaxSurveyRuns bounds the runs of a restore job's survey.
const MaxSurveyRuns = 1 << 16

// MaxRestoreReportItems bounds the damaged objects and the gaps a restore
// report keeps (the event log and the leader's log name them all).
const MaxRestoreReportItems = 1000

// reconcilingLocked reports whether the cluster is restored and not yet
// reconciled.
func (s *State) reconcilingLocked() bool {
	p := s.restore.GetRestorePhase()
	return p != waldenv1.RestorePhase_RESTORE_PHASE_UNSPECIFIED && p != waldenv1.RestorePhase_RESTORE_PHASE_DONE
}

// refuseReconciling is the refusal of op while the cluster reconciles.
func (s *State) refuseReconciling(op string) error {
	phase := s.restore.GetRestorePhase().Name()
	return refusal.WithMetadata(fmt.Errorf("%s: the cluster was restored from a backup of %q and is reconciling its catalog with "+
		"what was written after it (phase %s%s); it does so once the reconciliation is done (waldenctl restore status): %w",
		op, s.restore.GetFromCluster(), phase, s.restoreProgressText(), refusal.ErrRestoreReconciling),
		map[string]string{"phase": phase})
}

// restoreProgressText says how far the current phase is, for refusals.
func (s *State) restoreProgressText() string {
	switch s.restore.GetRestorePhase() {
	case waldenv1.RestorePhase_RESTORE_PHASE_SURVEY:
		n := 0
		for _, id := range s.restore.GetJobIds() {
			if j := s.jobs[id]; j != nil && j.GetSurvey() != nil {
				n++
			}
		}
		return fmt.Sprintf(": %d of %d WALs read", n, len(s.restore.GetJobIds()))
	case waldenv1.RestorePhase_RESTORE_PHASE_PLAN:
		if p := s.restore.GetProgress(); p.GetObjectsTotal() > 0 {
			return fmt.Sprintf(": %d of %d objects checked", p.GetObjectsChecked(), p.GetObjectsTotal())
		}
	case waldenv1.RestorePhase_RESTORE_PHASE_RECOVER:
		n := 0
		for _, id := range s.restore.GetJobIds() {
			if j := s.jobs[id]; j != nil && j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED {
				n++
			}
		}
		return fmt.Sprintf(": %d of %d restore jobs done", n, len(s.restore.GetJobIds()))
	}
	return ""
}

// RestoreState returns a copy of the restore reconciliation's state, or nil
// when the cluster was not restored.
func (s *State) RestoreState() *waldenv1.RestoreState {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return clone(s.restore)
}

// Reconciling reports whether the cluster was restored from a backup and
// has not reconciled its catalog yet.
func (s *State) Reconciling() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.reconcilingLocked()
}

// StreamEpochFloor is the lowest stream epoch a reconciled range of a
// stream may carry: its epoch at the backup (its epoch less the restore's
// bump), or the epoch of the last range reconciled since. 0 for a stream
// the catalog does not know (created after the backup).
func (s *State) StreamEpochFloor(id uint64) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.epochFloorLocked(s.streams[id])
}

func (s *State) epochFloorLocked(st *waldenv1.Stream) uint64 {
	if st == nil {
		return 0
	}
	return st.GetEpoch() - min(st.GetEpoch(), s.restore.GetEpochBump())
}

// restoreEvent appends an event of kind restore that records r, the
// reconciliation moved from phase from to its phase now.
func (s *State) restoreEvent(index uint64, actor string, from waldenv1.RestorePhase, r *waldenv1.RestoreEvent) {
	r.FromRestorePhase, r.RestorePhase = from, s.restore.GetRestorePhase()
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_RESTORE, Actor: actor, Detail: &waldenv1.EventDetail{Restore: r}})
}

// checkReconcileEntry refuses a reconciliation entry of a cluster not in
// phase, or appended in another term than the leader's that made it.
func (s *State) checkReconcileEntry(op string, term, opTerm uint64, phase waldenv1.RestorePhase) error {
	if s.restore == nil {
		return invalid("%s: this cluster was not restored from a backup", op)
	}
	if opTerm == 0 || opTerm != term {
		return fmt.Errorf("%s: decided in term %d, appended in term %d: %w", op, opTerm, term, refusal.ErrDecidedInAnotherTerm)
	}
	if cur := s.restore.GetRestorePhase(); cur != phase {
		return invalid("%s: the reconciliation is in phase %q, not %q", op, cur.Name(), phase.Name())
	}
	return nil
}

// setPhase moves the reconciliation to phase.
func (s *State) setPhase(phase waldenv1.RestorePhase) {
	s.restore.RestorePhase = phase
	s.restore.PhaseUnixMs = s.now()
	if phase == waldenv1.RestorePhase_RESTORE_PHASE_DONE {
		s.restore.DoneUnixMs = s.now()
	}
}

// applyReconcileScan ends the scan: the brokers S3 names beyond the
// registry are added, and every broker but AutoMQ's nodes (whose streams
// AutoMQ's controller keeps) gets a restore job under a new token, fenced,
// assigned to a live member. With no broker at all the plan comes next.
func (s *State) applyReconcileScan(index, term uint64, cmd *waldenv1.Command, op *waldenv1.ReconcileScan) (*waldenv1.Result, error) {
	if err := s.checkReconcileEntry("reconcile scan", term, op.GetTerm(), waldenv1.RestorePhase_RESTORE_PHASE_SCAN); err != nil {
		return nil, err
	}
	found := append([]string(nil), op.GetBrokersFound()...)
	sort.Strings(found)
	for i, id := range found {
		if id == "" {
			return nil, invalid("reconcile scan: brokers_found[%d] is empty", i)
		}
		if i > 0 && found[i-1] == id {
			return nil, invalid("reconcile scan: brokers_found: %q twice", id)
		}
	}
	var added []string
	for _, id := range found {
		if _, ok := s.brokers[id]; !ok {
			s.brokers[id] = &waldenv1.Broker{BrokerId: id, RecoveredWalOffset: -1, LeaseRemainingMs: -1}
			added = append(added, id)
		}
	}
	var jobs, skipped []string
	for _, id := range sortedKeys(s.brokers) {
		b := s.brokers[id]
		if b.GetAutomq() != nil {
			skipped = append(skipped, id)
			continue
		}
		token := s.issueEpoch()
		b.Epoch = token
		b.Fenced = true
		b.LeaseRemainingMs = -1
		b.FailoverRequested = nil
		j := &waldenv1.Job{
			JobId:              fmt.Sprintf("restore-%s-%d", id, token),
			BrokerId:           id,
			Token:              token,
			Attempt:            1,
			AssigneeId:         s.pickAssignee(op.GetLiveMembers(), ""),
			JobState:           waldenv1.JobState_JOB_STATE_PENDING,
			JobStep:            waldenv1.JobStep_JOB_STEP_FENCE,
			CreatedUnixMs:      s.now(),
			UpdatedUnixMs:      s.now(),
			RecoveredWalOffset: -1,
			LeaseWaitMs:        max(s.restore.GetLeaseWaitMs(), 0),
			Restore:            true,
			Wal:                clone(b.GetWal()),
		}
		s.jobs[j.GetJobId()] = j
		b.LastJobId = j.GetJobId()
		s.deriveState(b)
		jobs = append(jobs, j.GetJobId())
	}
	s.restore.BrokersFound = added
	s.restore.JobIds = jobs
	if s.restore.Report == nil {
		s.restore.Report = &waldenv1.RestoreReport{}
	}
	s.restore.Report.ObjectsListed = op.GetObjectsListed()
	next := waldenv1.RestorePhase_RESTORE_PHASE_SURVEY
	if len(jobs) == 0 {
		next = waldenv1.RestorePhase_RESTORE_PHASE_PLAN
	}
	s.setPhase(next)
	s.restoreEvent(index, actorOf("", cmd), waldenv1.RestorePhase_RESTORE_PHASE_SCAN, &waldenv1.RestoreEvent{
		ObjectsListed: op.GetObjectsListed(), BrokersAdded: slices.Clone(added), AutomqNodes: slices.Clone(skipped), JobIds: slices.Clone(jobs)})
	return &waldenv1.Result{}, nil
}

// checkSurvey refuses a malformed survey.
func checkSurvey(jobID string, sv *waldenv1.RestoreSurvey) error {
	if n := len(sv.GetRuns()); n > MaxSurveyRuns {
		return invalid("checkpoint job %s: survey: %d runs, more than %d", jobID, n, MaxSurveyRuns)
	}
	for i, r := range sv.GetRuns() {
		switch {
		case r.GetStreamEpoch() == 0:
			return invalid("checkpoint job %s: survey.runs[%d].stream_epoch: must not be 0", jobID, i)
		case r.GetStartOffset() >= r.GetEndOffset() || r.GetEndOffset() >= OffsetLimit:
			return invalid("checkpoint job %s: survey.runs[%d]: offsets [%d, %d) are empty or beyond 2^63", jobID, i, r.GetStartOffset(), r.GetEndOffset())
		}
	}
	return nil
}

// recordSurvey keeps a restore job's survey (once: a later one of another
// attempt is the same WAL read again) and moves on when every job has one.
func (s *State) recordSurvey(index uint64, j *waldenv1.Job, sv *waldenv1.RestoreSurvey) {
	if j.GetSurvey() != nil {
		return
	}
	j.Survey = clone(sv)
	s.advanceRestore(index, j.GetAssigneeId())
}

// advanceRestore moves the reconciliation on when its phase is over: the
// survey once every restore job has surveyed its WAL (or was resolved with
// it lost), the recovery once every restore job succeeded.
func (s *State) advanceRestore(index uint64, actor string) {
	switch s.restore.GetRestorePhase() {
	case waldenv1.RestorePhase_RESTORE_PHASE_SURVEY:
		var runs, lost uint32
		for _, id := range s.restore.GetJobIds() {
			j := s.jobs[id]
			if j == nil || j.GetSurvey() == nil {
				return
			}
			runs += uint32(len(j.GetSurvey().GetRuns()))
			if j.GetSurvey().GetWalLost() {
				lost++
			}
		}
		s.setPhase(waldenv1.RestorePhase_RESTORE_PHASE_PLAN)
		s.restoreEvent(index, actor, waldenv1.RestorePhase_RESTORE_PHASE_SURVEY, &waldenv1.RestoreEvent{Runs: runs, WalsLost: lost})
	case waldenv1.RestorePhase_RESTORE_PHASE_RECOVER:
		for _, id := range s.restore.GetJobIds() {
			if j := s.jobs[id]; j == nil || j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED {
				return
			}
		}
		s.setPhase(waldenv1.RestorePhase_RESTORE_PHASE_DONE)
		s.restoreEvent(index, actor, waldenv1.RestorePhase_RESTORE_PHASE_RECOVER, &waldenv1.RestoreEvent{
			FromCluster: s.restore.GetFromCluster(), FromIndex: s.restore.GetFromIndex()})
	}
}

// applyReconcileObjects commits again, in order, objects written after the
// backup: each range must start at its stream's end, at a stream epoch not
// below the stream's floor (its epoch at the backup, or that of the range
// reconciled before it). A stream the catalog does not know (created after
// the backup) is created, closed, from offset 0. An object id already
// committed is skipped (a retried entry). All or nothing.
func (s *State) applyReconcileObjects(index, term uint64, op *waldenv1.ReconcileObjects) (*waldenv1.Result, error) {
	if err := s.checkReconcileEntry("reconcile objects", term, op.GetTerm(), waldenv1.RestorePhase_RESTORE_PHASE_PLAN); err != nil {
		return nil, err
	}
	take, err := s.checkReconciledObjects(op.GetObjects())
	if err != nil {
		return nil, err
	}
	for _, ro := range take {
		s.commitReconciled(index, ro)
	}
	return &waldenv1.Result{}, nil
}

// reconcileCursor is where a stream stands while the objects of one entry
// are checked: its end offset and epoch floor, as the objects before left
// them.
type reconcileCursor struct {
	end, floor uint64
}

// checkReconciledObjects checks the objects of a ReconcileObjects entry in
// order, each against the streams as the ones before it leave them, and
// returns those to commit (the ids not committed yet). It changes nothing.
func (s *State) checkReconciledObjects(objs []*waldenv1.ReconciledObject) ([]*waldenv1.ReconciledObject, error) {
	cur := map[uint64]*reconcileCursor{}
	at := func(id uint64) *reconcileCursor {
		c := cur[id]
		if c == nil {
			c = &reconcileCursor{}
			if st := s.streams[id]; st != nil {
				c.end, c.floor = st.GetEndOffset(), s.epochFloorLocked(st)
			}
			cur[id] = c
		}
		return c
	}
	seenID := map[string]bool{}
	var take []*waldenv1.ReconciledObject
	for i, ro := range objs {
		obj := ro.GetObject()
		id := obj.GetObjectId()
		switch {
		case id == "":
			return nil, invalid("reconcile objects: objects[%d].object.object_id is empty", i)
		case seenID[id]:
			return nil, invalid("reconcile objects: object %s twice", id)
		case obj.GetKey() == "":
			return nil, invalid("reconcile objects: object %s: key is empty", id)
		case len(obj.GetRanges()) == 0:
			return nil, invalid("reconcile objects: object %s: ranges is empty", id)
		}
		seenID[id] = true
		if _, ok := s.objects[id]; ok {
			continue
		}
		if err := checkReconciledObject(ro, at); err != nil {
			return nil, err
		}
		for _, r := range obj.GetRanges() {
			c := at(r.GetStreamId())
			c.end, c.floor = r.GetEndOffset(), r.GetStreamEpoch()
		}
		take = append(take, ro)
	}
	return take, nil
}

// checkReconciledObject checks one object not committed yet: its ranges,
// each starting at its stream's end (at) at an epoch not below the
// stream's floor, and its producers.
func checkReconciledObject(ro *waldenv1.ReconciledObject, at func(uint64) *reconcileCursor) error {
	obj := ro.GetObject()
	id := obj.GetObjectId()
	if fe := CheckObject(obj); fe != nil {
		return invalid("reconcile objects: object %s: %s", id, fe)
	}
	seen := map[uint64]bool{}
	for k, r := range obj.GetRanges() {
		if seen[r.GetStreamId()] {
			return invalid("reconcile objects: object %s: ranges[%d]: stream %d twice", id, k, r.GetStreamId())
		}
		seen[r.GetStreamId()] = true
		c := at(r.GetStreamId())
		if r.GetStreamEpoch() < c.floor {
			return fmt.Errorf("reconcile objects: object %s: stream %d epoch %d is below %d, the stream's epoch at the backup or "+
				"of the range reconciled before: %w", id, r.GetStreamId(), r.GetStreamEpoch(), c.floor, refusal.ErrEpochExpired)
		}
		if r.GetStartOffset() != c.end {
			return refusal.WithMetadata(fmt.Errorf("reconcile objects: object %s: stream %d range starts at %d, end offset is %d: %w",
				id, r.GetStreamId(), r.GetStartOffset(), c.end, refusal.ErrOffsetMismatch),
				map[string]string{"stream_id": fmt.Sprint(r.GetStreamId()), "end_offset": fmt.Sprint(c.end)})
		}
	}
	return checkProducers(obj, ro.GetProducers(), ChecksBounded)
}

// commitReconciled commits a checked object again, reconciled: its streams
// (created closed when the catalog does not know them) end where its ranges
// end, at a stream epoch past each range's by the restore's epoch bump.
func (s *State) commitReconciled(index uint64, ro *waldenv1.ReconciledObject) {
	bump := s.restore.GetEpochBump()
	o := clone(ro.GetObject())
	o.Reconciled = true
	o.Failover = false
	o.JobId = ""
	o.CommittedIndex = index
	o.CommittedUnixMs = s.now()
	for _, r := range o.GetRanges() {
		st := s.streams[r.GetStreamId()]
		if st == nil {
			st = &waldenv1.Stream{StreamId: r.GetStreamId(), State: StreamClosed}
			s.streams[st.GetStreamId()] = st
		}
		st.EndOffset = r.GetEndOffset()
		st.Epoch = max(st.GetEpoch(), r.GetStreamEpoch()+bump)
		st.Objects++
		st.UpdatedUnixMs = s.now()
		s.streamObjects[st.GetStreamId()] = append(s.streamObjects[st.GetStreamId()], o.GetObjectId())
	}
	s.objects[o.GetObjectId()] = o
	for _, sp := range ro.GetProducers() {
		s.producerTable(sp.GetStreamId()).Merge(sp.GetProducers())
	}
}

// applyReconcilePlan ends the plan: each stream whose records beyond its
// reconciled end are in a WAL is opened for that broker's restore job
// (from its end, at a stream epoch past every one the tail may carry),
// every other stream is closed at its end, and the report is kept. The
// restore jobs then commit the tails and close the streams.
func (s *State) applyReconcilePlan(index, term uint64, cmd *waldenv1.Command, op *waldenv1.ReconcilePlan) (*waldenv1.Result, error) {
	if err := s.checkReconcileEntry("reconcile plan", term, op.GetTerm(), waldenv1.RestorePhase_RESTORE_PHASE_PLAN); err != nil {
		return nil, err
	}
	jobOf := s.restoreJobsByBroker()
	rep := op.GetReport()
	if err := s.checkReconcilePlan(op, jobOf); err != nil {
		return nil, err
	}
	per := s.openTails(op.GetTails(), jobOf)
	s.restore.Report = clone(rep)
	if s.restore.Report == nil {
		s.restore.Report = &waldenv1.RestoreReport{}
	}
	s.restore.Report.Tails = uint32(len(op.GetTails()))
	s.setPhase(waldenv1.RestorePhase_RESTORE_PHASE_RECOVER)
	var tails []*waldenv1.BrokerTails
	for _, b := range sortedKeys(per) {
		tails = append(tails, &waldenv1.BrokerTails{BrokerId: b, Tails: uint32(per[b])})
	}
	s.restoreEvent(index, actorOf("", cmd), waldenv1.RestorePhase_RESTORE_PHASE_PLAN, &waldenv1.RestoreEvent{Report: clone(rep), Tails: tails})
	s.advanceRestore(index, actorOf("", cmd))
	return &waldenv1.Result{}, nil
}

// restoreJobsByBroker are the restore's jobs by broker id.
func (s *State) restoreJobsByBroker() map[string]*waldenv1.Job {
	jobOf := map[string]*waldenv1.Job{}
	for _, id := range s.restore.GetJobIds() {
		if j := s.jobs[id]; j != nil {
			jobOf[j.GetBrokerId()] = j
		}
	}
	return jobOf
}

// checkReconcilePlan checks the plan's report and its tails: each names a
// stream once, a broker with a restore job, an epoch not below the
// stream's floor and a range from the stream's end. It changes nothing.
func (s *State) checkReconcilePlan(op *waldenv1.ReconcilePlan, jobOf map[string]*waldenv1.Job) error {
	rep := op.GetReport()
	if n := len(rep.GetDamaged()); n > MaxRestoreReportItems {
		return invalid("reconcile plan: report.damaged: %d objects, more than %d", n, MaxRestoreReportItems)
	}
	if n := len(rep.GetGaps()); n > MaxRestoreReportItems {
		return invalid("reconcile plan: report.gaps: %d, more than %d", n, MaxRestoreReportItems)
	}
	seen := map[uint64]bool{}
	for i, t := range op.GetTails() {
		if seen[t.GetStreamId()] {
			return invalid("reconcile plan: tails[%d]: stream %d twice", i, t.GetStreamId())
		}
		if err := s.checkTail(i, t, jobOf); err != nil {
			return err
		}
		seen[t.GetStreamId()] = true
	}
	return nil
}

// checkTail checks the i-th tail of a plan against its stream and the
// restore's jobs.
func (s *State) checkTail(i int, t *waldenv1.StreamTail, jobOf map[string]*waldenv1.Job) error {
	end, floor := uint64(0), uint64(0)
	if st := s.streams[t.GetStreamId()]; st != nil {
		end, floor = st.GetEndOffset(), s.epochFloorLocked(st)
	}
	switch {
	case jobOf[t.GetBrokerId()] == nil:
		return invalid("reconcile plan: tails[%d]: broker %q has no restore job", i, t.GetBrokerId())
	case t.GetStreamEpoch() == 0 || t.GetStreamEpoch() < floor:
		return fmt.Errorf("reconcile plan: tails[%d]: stream %d epoch %d is below %d, the stream's floor: %w",
			i, t.GetStreamId(), t.GetStreamEpoch(), floor, refusal.ErrEpochExpired)
	case t.GetFromOffset() != end:
		return refusal.WithMetadata(fmt.Errorf("reconcile plan: tails[%d]: stream %d tail from %d, end offset is %d: %w",
			i, t.GetStreamId(), t.GetFromOffset(), end, refusal.ErrOffsetMismatch),
			map[string]string{"stream_id": fmt.Sprint(t.GetStreamId()), "end_offset": fmt.Sprint(end)})
	case t.GetEndOffset() <= t.GetFromOffset() || t.GetEndOffset() >= OffsetLimit:
		return invalid("reconcile plan: tails[%d]: stream %d ends at %d, not beyond %d", i, t.GetStreamId(), t.GetEndOffset(), t.GetFromOffset())
	}
	return nil
}

// openTails opens each stream with a tail for its broker's restore job
// (created when the catalog does not know it) and closes every other
// stream at its end, in stream id order; it returns the number of tails
// per broker.
func (s *State) openTails(ts []*waldenv1.StreamTail, jobOf map[string]*waldenv1.Job) map[string]int {
	bump := s.restore.GetEpochBump()
	tails := map[uint64]*waldenv1.StreamTail{}
	per := map[string]int{}
	for _, t := range ts {
		tails[t.GetStreamId()] = t
		if s.streams[t.GetStreamId()] == nil {
			s.streams[t.GetStreamId()] = &waldenv1.Stream{StreamId: t.GetStreamId(), State: StreamClosed}
		}
	}
	for _, id := range sortedKeys(s.streams) {
		st := s.streams[id]
		if t := tails[id]; t != nil {
			j := jobOf[t.GetBrokerId()]
			st.State = StreamOpened
			st.OwnerBrokerId = t.GetBrokerId()
			st.OwnerEpoch = j.GetToken()
			st.Epoch = max(st.GetEpoch(), t.GetStreamEpoch()+bump)
			st.ClosedByJobId = ""
			st.UpdatedUnixMs = s.now()
			j.Tails = append(j.Tails, clone(t))
			j.UpdatedUnixMs = s.now()
			per[t.GetBrokerId()]++
			continue
		}
		if st.GetState() != StreamClosed {
			st.State = StreamClosed
			st.ClosedByJobId = ""
			st.UpdatedUnixMs = s.now()
		}
	}
	return per
}

// applyReconcileProgress records how far the leader's check of the objects
// is.
func (s *State) applyReconcileProgress(term uint64, op *waldenv1.ReconcileProgress) (*waldenv1.Result, error) {
	if err := s.checkReconcileEntry("reconcile progress", term, op.GetTerm(), waldenv1.RestorePhase_RESTORE_PHASE_PLAN); err != nil {
		return nil, err
	}
	s.restore.Progress = clone(op.GetProgress())
	return &waldenv1.Result{}, nil
}

// CommittedKeys returns, for every S3 key the catalog's objects name, the
// streams committed from it (an object reconciled in part is committed
// under several ids with one key).
func (s *State) CommittedKeys() map[string][]uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string][]uint64, len(s.objects))
	for _, o := range s.objects {
		for _, r := range o.GetRanges() {
			out[o.GetKey()] = append(out[o.GetKey()], r.GetStreamId())
		}
	}
	return out
}
