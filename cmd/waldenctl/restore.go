package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

func init() { commands = append(commands, newRestoreCmd) }

// errNotRestored: restore status of a cluster that was not restored.
var errNotRestored = errors.New("this cluster was not restored from a backup")

func newRestoreCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "restore",
		Short: "Follow the reconciliation of a cluster restored from a backup (status)",
	}
	var wait bool
	status := &cobra.Command{
		Use:   "status",
		Short: "Show where the reconciliation of a restored cluster is: its phase, the restore jobs, what it found",
		Long: `status shows the reconciliation of a cluster restored from a backup
('walden snapshot restore'): until it is done no broker registers and no
stream opens (RESTORE_RECONCILING). Its phases: scan (the leader lists the
cluster's prefix in S3), survey (each broker's restore job reads its WAL),
plan (the leader checks the objects written after the backup and commits
them again), recover (the restore jobs commit the streams' tails from the
WALs), done.

With --wait it prints a line at every change until the reconciliation is
done.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if wait {
				return c.waitRestore(cmd.Context())
			}
			rs, jobs, err := c.restoreStatus(cmd.Context())
			if err != nil {
				return err
			}
			return c.printValue(restoreJSON(rs, &waldenv1.ListJobsResponse{Jobs: jobs}), func(w io.Writer) { printRestore(w, rs, jobs) })
		},
	}
	status.Flags().BoolVar(&wait, "wait", false, "print a line at every change until the reconciliation is done")
	cmd.AddCommand(status)
	return cmd
}

// restoreJSON is restore status -o json: the restore state and its jobs.
func restoreJSON(rs *waldenv1.RestoreState, jobs *waldenv1.ListJobsResponse) map[string]any {
	r, _ := waldenv1.MarshalJSON(rs)
	j, _ := waldenv1.MarshalJSON(jobs)
	return map[string]any{"restore": json.RawMessage(r), "phase": rs.GetRestorePhase().Name(), "jobs": json.RawMessage(j)}
}

// restoreStatus asks for the cluster's restore state and its restore jobs.
func (c *cli) restoreStatus(ctx context.Context) (*waldenv1.RestoreState, []*waldenv1.Job, error) {
	var st *waldenv1.StatusResponse
	err := c.call(ctx, op{verb: "show", kind: "restore"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		var err error
		st, err = waldenv1.NewClusterClient(conn).Status(ctx, &waldenv1.StatusRequest{}, opts...)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	rs := st.GetRestore()
	if rs == nil {
		return nil, nil, errNotRestored
	}
	var lj *waldenv1.ListJobsResponse
	err = c.call(ctx, op{verb: "list", kind: "jobs"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		var err error
		lj, err = jobsClient(conn).ListJobs(ctx, &waldenv1.ListJobsRequest{}, opts...)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	var jobs []*waldenv1.Job
	for _, j := range lj.GetJobs() {
		if j.GetRestore() && contains(rs.GetJobIds(), j.GetJobId()) {
			jobs = append(jobs, j)
		}
	}
	return rs, jobs, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// restoreLine says in one line where the reconciliation is.
func restoreLine(rs *waldenv1.RestoreState, jobs []*waldenv1.Job) string {
	phase := rs.GetRestorePhase()
	line := fmt.Sprintf("restored from %q at index %d: %s", rs.GetFromCluster(), rs.GetFromIndex(), phase.Name())
	surveyed, done := 0, 0
	for _, j := range jobs {
		if j.GetSurvey() != nil {
			surveyed++
		}
		if j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED {
			done++
		}
	}
	switch phase {
	case waldenv1.RestorePhase_RESTORE_PHASE_SCAN:
		line += " (the leader lists the cluster's prefix in S3)"
	case waldenv1.RestorePhase_RESTORE_PHASE_SURVEY:
		if jobs != nil {
			line += fmt.Sprintf(" (%d of %d WALs read)", surveyed, len(rs.GetJobIds()))
		}
	case waldenv1.RestorePhase_RESTORE_PHASE_PLAN:
		p := rs.GetProgress()
		line += fmt.Sprintf(" (%d of %d objects checked, %s read)", p.GetObjectsChecked(), p.GetObjectsTotal(), size(p.GetBytesRead()))
	case waldenv1.RestorePhase_RESTORE_PHASE_RECOVER:
		if jobs != nil {
			line += fmt.Sprintf(" (%d of %d restore jobs done)", done, len(rs.GetJobIds()))
		}
	case waldenv1.RestorePhase_RESTORE_PHASE_DONE:
		line += fmt.Sprintf(" at %s: brokers register and streams open again", msText(rs.GetDoneUnixMs()))
	}
	return line
}

func printRestore(w io.Writer, rs *waldenv1.RestoreState, jobs []*waldenv1.Job) {
	fmt.Fprintln(w, restoreLine(rs, jobs))
	if rep := rs.GetReport(); rep != nil && rs.GetRestorePhase() >= waldenv1.RestorePhase_RESTORE_PHASE_RECOVER {
		fmt.Fprintf(w, "objects: %d listed, %d committed again (%d ranges, %d streams extended), %d in the backup, %d older, %d redundant, %d superseded, %d damaged, %d not walden's\n",
			rep.GetObjectsListed(), rep.GetObjectsCommitted(), rep.GetRangesCommitted(), rep.GetStreamsExtended(), rep.GetObjectsKnown(),
			rep.GetObjectsOlder(), rep.GetObjectsRedundant(), rep.GetObjectsSuperseded(), len(rep.GetDamaged()), rep.GetObjectsNotWalden())
		for _, d := range rep.GetDamaged() {
			fmt.Fprintf(w, "damaged, not committed: %s: %s\n", d.GetKey(), d.GetError())
		}
		for _, g := range rep.GetGaps() {
			fmt.Fprintf(w, "gap: %s\n", g)
		}
	}
	if len(jobs) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "JOB\tBROKER\tSTATE\tSTEP\tASSIGNEE\tWAL SURVEY\tTAILS\tRECORDS\tERROR")
	for _, j := range jobs {
		sv := "-"
		if s := j.GetSurvey(); s != nil {
			sv = fmt.Sprintf("%d records, %d runs", s.GetRecords(), len(s.GetRuns()))
			if s.GetWalLost() {
				sv = "WAL lost"
			}
		}
		var tails []string
		for _, t := range j.GetTails() {
			tails = append(tails, fmt.Sprintf("%d from %d", t.GetStreamId(), t.GetFromOffset()))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", j.GetJobId(), j.GetBrokerId(), j.GetJobState().Name(), orDash(j.GetJobStep().Name()),
			orDash(j.GetAssigneeId()), sv, orDash(strings.Join(tails, ", ")), j.GetRecordsUploaded(), orDash(oneLine(j.GetError(), 80)))
	}
}

// waitRestore prints restoreLine at every change until done.
func (c *cli) waitRestore(ctx context.Context) error {
	last := ""
	for {
		rs, jobs, err := c.restoreStatus(ctx)
		if err != nil {
			return err
		}
		if line := restoreLine(rs, jobs); line != last {
			fmt.Fprintf(c.stdout, "%s  %s\n", time.Now().UTC().Format("15:04:05"), line)
			last = line
		}
		if rs.GetRestorePhase() == waldenv1.RestorePhase_RESTORE_PHASE_DONE {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
