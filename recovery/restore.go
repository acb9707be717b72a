package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"

	waldenv1 "walden/proto/walden/v1"
	"walden/wal"
)

// A restore job (Job.restore) belongs to the reconciliation of a cluster
// restored from a backup (package reconcile, docs/state.md): it reads its
// broker's WAL twice. First it surveys it — the runs of contiguous records
// per stream and stream epoch — and reports them in the job; then it waits
// while the leader commits again the objects written after the backup and
// gives each stream's records beyond its reconciled end to the WAL that
// holds them (the job's tails). Then it recovers like a failover: the
// records of its tails' streams at the tails' epochs, from each stream's
// end, are uploaded and committed, the streams closed. Restore jobs always
// run these builtin steps, whatever recovery.action says: they reconcile
// walden's own catalog.

// tailEpochs maps each stream of a restore job's tails to the stream
// epoch of its records to take; nil for any other job.
func tailEpochs(j *waldenv1.Job) map[uint64]uint64 {
	if !j.GetRestore() {
		return nil
	}
	out := map[uint64]uint64{}
	for _, t := range j.GetTails() {
		out[t.GetStreamId()] = t.GetStreamEpoch()
	}
	return out
}

// survey reports, once per job, the runs of records the broker's WAL holds
// (or nothing when an operator declared the WAL lost), then waits until
// the reconciliation reaches its recovery.
func (a *attempt) survey(ctx context.Context, j *waldenv1.Job) (waldenv1.JobStep, error) {
	if j.GetSurvey() == nil && !j.GetWalLost() {
		path, err := a.attach(ctx)
		if err != nil {
			return waldenv1.JobStep_JOB_STEP_ATTACH, err
		}
		sv, err := surveyWAL(path)
		if err != nil {
			return waldenv1.JobStep_JOB_STEP_READ, err
		}
		streams := map[uint64]bool{}
		for _, r := range sv.GetRuns() {
			streams[r.GetStreamId()] = true
		}
		detail := fmt.Sprintf("surveyed %s: %s of %s in %s; waiting for the reconciliation's plan",
			path, plural(int64(sv.GetRecords()), "record", "records"), plural(int64(len(streams)), "stream", "streams"),
			plural(int64(len(sv.GetRuns())), "run", "runs"))
		if err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: waldenv1.JobStep_JOB_STEP_READ, Detail: detail, Survey: sv}); err != nil {
			return waldenv1.JobStep_JOB_STEP_READ, err
		}
		a.log.Info("restore: WAL surveyed", "path", path, "records", sv.GetRecords(), "runs", len(sv.GetRuns()), "streams", len(streams))
	}
	// The plan gives the tails once every job has surveyed and the leader
	// has committed the objects written after the backup.
	for {
		changed := a.e.state.Changed()
		if _, err := a.job(); err != nil {
			return waldenv1.JobStep_JOB_STEP_READ, err
		}
		switch a.e.state.RestoreState().GetRestorePhase() {
		case waldenv1.RestorePhase_RESTORE_PHASE_RECOVER, waldenv1.RestorePhase_RESTORE_PHASE_DONE,
			waldenv1.RestorePhase_RESTORE_PHASE_UNSPECIFIED:
			return waldenv1.JobStep_JOB_STEP_READ, nil
		}
		select {
		case <-ctx.Done():
			return waldenv1.JobStep_JOB_STEP_READ, fmt.Errorf("recovery: job %s: waiting for the reconciliation's plan: %w", a.jobID, context.Cause(ctx))
		case <-changed:
		}
	}
}

// surveyWAL reads the WAL at path and returns its runs of contiguous
// records per stream and stream epoch, in the order they start.
func surveyWAL(path string) (*waldenv1.RestoreSurvey, error) {
	rd, err := wal.Open(path)
	if err != nil {
		return nil, fmt.Errorf("recovery: survey: %w", err)
	}
	defer rd.Close()
	type key struct{ stream, epoch uint64 }
	open := map[key]*waldenv1.WalRun{}
	sv := &waldenv1.RestoreSurvey{}
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("recovery: survey: %w", err)
		}
		b := rec.Batch
		sv.Records++
		k := key{b.StreamID, b.Epoch}
		r := open[k]
		switch {
		case r != nil && b.BaseOffset == r.GetEndOffset():
			r.EndOffset = b.EndOffset()
			r.Records++
		case r != nil && b.BaseOffset >= r.GetStartOffset() && b.EndOffset() <= r.GetEndOffset():
			// Written again (a retried write of the same batch).
		default:
			if b.Epoch == 0 || b.Count == 0 {
				continue
			}
			r = &waldenv1.WalRun{StreamId: b.StreamID, StreamEpoch: b.Epoch, StartOffset: b.BaseOffset, EndOffset: b.EndOffset(), Records: 1}
			open[k] = r
			sv.Runs = append(sv.Runs, r)
		}
	}
	if n := len(sv.GetRuns()); n > maxSurveyRuns {
		return nil, fmt.Errorf("recovery: survey: the WAL holds %d runs of records, more than %d: it is not one broker's WAL", n, maxSurveyRuns)
	}
	sort.SliceStable(sv.Runs, func(i, j int) bool {
		a, b := sv.Runs[i], sv.Runs[j]
		if a.GetStreamId() != b.GetStreamId() {
			return a.GetStreamId() < b.GetStreamId()
		}
		if a.GetStreamEpoch() != b.GetStreamEpoch() {
			return a.GetStreamEpoch() < b.GetStreamEpoch()
		}
		return a.GetStartOffset() < b.GetStartOffset()
	})
	return sv, nil
}

// maxSurveyRuns is fsm.MaxSurveyRuns (the state machine refuses more).
const maxSurveyRuns = 1 << 16
