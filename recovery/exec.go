package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

// execTarget delegates the whole recovery to the exec command (op
// "recover"), turning its progress lines into checkpoints; after exit 0 it
// closes the streams the command left opened in walden's catalog and
// finishes the job.
type execTarget struct{}

func (execTarget) Recover(ctx context.Context, r *Run) (waldenv1.JobStep, error) {
	return r.a.execAction(ctx)
}

// execAction runs the exec target.
func (a *attempt) execAction(ctx context.Context) (waldenv1.JobStep, error) {
	j, err := a.job()
	if err != nil {
		return waldenv1.JobStep_JOB_STEP_ATTACH, err
	}
	if err := a.e.cluster.LinearizableRead(ctx); err != nil {
		return waldenv1.JobStep_JOB_STEP_ATTACH, fmt.Errorf("recovery: read barrier: %w", err)
	}
	in := jobJSON("recover", j)
	open := a.e.state.OpeningStreams(j.GetBrokerId())
	for _, st := range open {
		in.Streams = append(in.Streams, StreamJSON{StreamID: st.GetStreamId(), Epoch: st.GetEpoch(), StartOffset: st.GetStartOffset(), EndOffset: st.GetEndOffset()})
	}
	in.S3 = a.e.s3
	step := waldenv1.JobStep_JOB_STEP_ATTACH
	recovered := int64(-1)
	var last time.Time
	var stale error
	err = runExec(ctx, a.e.cfg.Exec, in, a.log, func(pl ProgressLine) {
		if pl.RecoveredWALOffset != nil {
			recovered = *pl.RecoveredWALOffset
		}
		if pl.Step != "" && pl.Step != step.Name() {
			next, ok := waldenv1.Parse[waldenv1.JobStep](pl.Step)
			if !ok {
				a.log.Warn("exec action printed an unknown step", "step", pl.Step)
				return
			}
			a.stepEnded(step, false)
			step = next
			last = time.Time{}
		}
		if time.Since(last) < a.e.progressEvery {
			return
		}
		last = time.Now()
		cerr := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: step, Detail: pl.Detail, BytesUploaded: pl.BytesUploaded, BytesTotal: pl.BytesTotal,
			StreamsClosed: pl.StreamsClosed, StreamsTotal: pl.StreamsTotal})
		if errors.Is(cerr, ErrStale) {
			stale = cerr
		}
	})
	if stale != nil {
		return step, stale
	}
	if err != nil {
		return step, err
	}
	if err := a.closeStreams(ctx, j, len(open)); err != nil {
		return waldenv1.JobStep_JOB_STEP_CLOSE, err
	}
	return waldenv1.JobStep_JOB_STEP_DONE, a.finish(ctx, recovered)
}
