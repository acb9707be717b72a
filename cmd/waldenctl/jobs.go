package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"

	waldenv1 "walden/proto/walden/v1"
)

func init() {
	commands = append(commands, newJobsCmd, newJobCmd, newCancelCmd, newRetryCmd)
}

func jobsClient(conn grpc.ClientConnInterface) waldenv1.JobsClient {
	return waldenv1.NewJobsClient(conn)
}

func newJobsCmd(c *cli) *cobra.Command {
	var broker, state string
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List recovery jobs: state, assignee, attempt, bytes uploaded and streams closed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp *waldenv1.ListJobsResponse
			err := c.call(cmd.Context(), op{verb: "list", kind: "jobs"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = jobsClient(conn).ListJobs(ctx, &waldenv1.ListJobsRequest{BrokerId: broker, State: state}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printJobs(w, resp.GetJobs(), c.wide()) })
		},
	}
	cmd.Flags().StringVar(&broker, "broker", "", "only the jobs of this broker")
	cmd.Flags().StringVar(&state, "state", "", "only jobs in this state: pending, running, succeeded, failed or cancelled")
	cmd.AddCommand(newJobsWatchCmd(c))
	return cmd
}

func printJobs(w io.Writer, jobs []*waldenv1.Job, wide bool) {
	head := "JOB\tBROKER\tSTATE\tSTEP\tASSIGNEE\tATTEMPT\tUPLOADED\tSTREAMS CLOSED\tERROR"
	if wide {
		head += "\tTOKEN\tRECORDS\tSKIPPED\tCREATED\tFINISHED"
	}
	fmt.Fprintln(w, head)
	for _, j := range jobs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d/%d\t%s", j.GetJobId(), j.GetBrokerId(), j.GetState(), orDash(j.GetStep()),
			orDash(j.GetAssigneeId()), j.GetAttempt(), bytesOf(j.GetBytesUploaded(), j.GetBytesTotal()),
			j.GetStreamsClosed(), j.GetStreamsTotal(), orDash(oneLine(j.GetError(), 80)))
		if wide {
			fmt.Fprintf(w, "\t%d\t%d\t%s\t%s\t%s", j.GetToken(), j.GetRecordsUploaded(), size(j.GetSkippedBytes()),
				msText(j.GetCreatedUnixMs()), msText(j.GetFinishedUnixMs()))
		}
		fmt.Fprintln(w)
	}
}

// msText is a wall-clock time with milliseconds (UTC), "-" for none.
func msText(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}

// bytesOf shows "uploaded/total" in binary units with the percentage.
func bytesOf(done, total uint64) string {
	if total == 0 {
		return size(done) + "/-"
	}
	return fmt.Sprintf("%s/%s (%d%%)", size(done), size(total), done*100/total)
}

func size(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max-3] + "..."
	}
	return s
}

func newJobCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:               "job ID",
		Short:             "Show one recovery job: progress, checkpoints of every step, gaps, skipped bytes and objects",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("job", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.GetJobResponse
			err := c.call(cmd.Context(), op{verb: "show", kind: "job", id: args[0]}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = jobsClient(conn).GetJob(ctx, &waldenv1.GetJobRequest{JobId: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printJob(w, resp.GetJob()) })
		},
	}
}

func printJob(w io.Writer, j *waldenv1.Job) {
	fmt.Fprintf(w, "job\t%s\n", j.GetJobId())
	fmt.Fprintf(w, "broker\t%s\n", j.GetBrokerId())
	fmt.Fprintf(w, "state\t%s\n", j.GetState())
	fmt.Fprintf(w, "step\t%s\n", orDash(j.GetStep()))
	fmt.Fprintf(w, "assignee\t%s (attempt %d, token %d)\n", orDash(j.GetAssigneeId()), j.GetAttempt(), j.GetToken())
	fmt.Fprintf(w, "lease renewed\t%s\n", unixText(j.GetLeaseRenewedUnixMs()))
	fmt.Fprintf(w, "uploaded\t%s\n", bytesOf(j.GetBytesUploaded(), j.GetBytesTotal()))
	fmt.Fprintf(w, "streams closed\t%d/%d\n", j.GetStreamsClosed(), j.GetStreamsTotal())
	fmt.Fprintf(w, "records uploaded\t%d\n", j.GetRecordsUploaded())
	fmt.Fprintf(w, "skipped bytes\t%d\n", j.GetSkippedBytes())
	fmt.Fprintf(w, "wal\t%s %s\n", orDash(j.GetWal().GetPath()), j.GetWal().GetVolumeId())
	fmt.Fprintf(w, "recovered wal offset\t%d\n", j.GetRecoveredWalOffset())
	fmt.Fprintf(w, "created\t%s\n", msText(j.GetCreatedUnixMs()))
	fmt.Fprintf(w, "finished\t%s\n", msText(j.GetFinishedUnixMs()))
	fmt.Fprintf(w, "error\t%s\n", orDash(j.GetError()))
	for _, g := range j.GetGaps() {
		fmt.Fprintf(w, "gap\t%s\n", g)
	}
	fmt.Fprintf(w, "objects\t%d\n", len(j.GetObjects()))
	if j.GetLeaseWaitMs() > 0 {
		fmt.Fprintf(w, "lease wait\t%s before the WAL was read\n", durationText(j.GetLeaseWaitMs()))
	}
	if len(j.GetCheckpoints()) > 0 {
		fmt.Fprintln(w, "\nSTEP\tATTEMPT\tINDEX\tDONE AT\tTOOK\tDETAIL")
		prev := j.GetCreatedUnixMs()
		for _, cp := range j.GetCheckpoints() {
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\n", cp.GetStep(), cp.GetAttempt(), cp.GetIndex(),
				msText(cp.GetUnixMs()), durationText(cp.GetUnixMs()-prev), cp.GetDetail())
			prev = cp.GetUnixMs()
		}
	}
}

// durationText shows a duration in milliseconds for people: "840ms",
// "2.315s", "1m4.2s"; "-" when negative (clocks of two members).
func durationText(ms int64) string {
	switch {
	case ms < 0:
		return "-"
	case ms < 1000:
		return fmt.Sprintf("%dms", ms)
	case ms < 60_000:
		return fmt.Sprintf("%.3fs", float64(ms)/1000)
	}
	return (time.Duration(ms) * time.Millisecond).Round(100 * time.Millisecond).String()
}

func finished(j *waldenv1.Job) bool {
	return j.GetState() != "pending" && j.GetState() != "running"
}

func newJobsWatchCmd(c *cli) *cobra.Command {
	var broker string
	return &cobra.Command{
		Use:               "watch [ID]",
		Short:             "Follow recovery jobs live: step, assignee, bytes uploaded of total, streams closed of total; ends when they finish or on Ctrl-C",
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: c.completeIDs("job", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			req := &waldenv1.WatchJobsRequest{BrokerId: broker}
			if len(args) == 1 {
				req.JobId = args[0]
			}
			return c.watchJobs(ctx, req)
		},
	}
}

// watchJobs prints one line per change of a watched job (table) or one
// JSON document per update (json). With no job active at the start it
// follows until the first job appears and finishes.
func (c *cli) watchJobs(ctx context.Context, req *waldenv1.WatchJobsRequest) error {
	if c.output == "table" {
		fmt.Fprintln(c.stdout, watchRow("TIME", "JOB", "STATE", "STEP", "ASSIGNEE", "ATTEMPT", "UPLOADED", "STREAMS CLOSED", "ERROR"))
	}
	shown := map[string]string{}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		done, err := c.watchOnce(ctx, req, shown)
		if done || ctx.Err() != nil {
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("watch: %w", lastErr)
}

// watchOnce follows one WatchJobs stream, trying the endpoints in turn. It
// reports done when every watched job has finished.
func (c *cli) watchOnce(ctx context.Context, req *waldenv1.WatchJobsRequest, shown map[string]string) (bool, error) {
	var done bool
	err := c.stream(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		st, err := jobsClient(conn).WatchJobs(ctx, req)
		if err != nil {
			return err
		}
		sawActive := false
		for {
			resp, err := st.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			all := len(resp.GetJobs()) > 0
			for _, j := range resp.GetJobs() {
				if !finished(j) {
					sawActive = true
					all = false
				}
			}
			if c.output == "json" {
				b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(resp)
				if err != nil {
					return err
				}
				var line bytes.Buffer
				if err := json.Compact(&line, b); err != nil {
					return err
				}
				line.WriteByte('\n')
				if _, err := c.stdout.Write(line.Bytes()); err != nil {
					return err
				}
			} else {
				for _, j := range resp.GetJobs() {
					cells := []string{j.GetJobId(), j.GetState(), orDash(j.GetStep()), orDash(j.GetAssigneeId()),
						strconv.FormatUint(uint64(j.GetAttempt()), 10), bytesOf(j.GetBytesUploaded(), j.GetBytesTotal()),
						fmt.Sprintf("%d/%d", j.GetStreamsClosed(), j.GetStreamsTotal()), orDash(oneLine(j.GetError(), 60))}
					line := strings.Join(cells, "\t")
					if shown[j.GetJobId()] == line {
						continue
					}
					shown[j.GetJobId()] = line
					fmt.Fprintln(c.stdout, watchRow(append([]string{time.Now().Format("15:04:05.000")}, cells...)...))
				}
			}
			// Done once the watched jobs are all finished: a named job at
			// once, otherwise after at least one was seen active.
			if all && (req.GetJobId() != "" || sawActive) {
				done = true
				return nil
			}
		}
	})
	return done, err
}

// stream runs a streaming call against the endpoints in turn until one
// accepts it.
func (c *cli) stream(ctx context.Context, call func(ctx context.Context, conn grpc.ClientConnInterface) error) error {
	var errs []string
	for _, addr := range c.endpoints {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds))
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
			continue
		}
		err = call(metadata.NewOutgoingContext(ctx, nil), conn)
		_ = conn.Close()
		if err == nil || ctx.Err() != nil {
			return nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
	}
	return errors.New(strings.Join(errs, "; "))
}

func newCancelCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:               "cancel ID",
		Short:             "Cancel a pending or running recovery job (its broker stays fenced; retry starts it again)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("job", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.CancelJobResponse
			err := c.call(cmd.Context(), op{verb: "cancel", kind: "job", id: args[0]}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = jobsClient(conn).CancelJob(ctx, &waldenv1.CancelJobRequest{JobId: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printJobs(w, []*waldenv1.Job{resp.GetJob()}, c.wide()) })
		},
	}
}

func newRetryCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:               "retry ID",
		Short:             "Start a failed or cancelled recovery job again (attempt+1, assigned to a live member)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("job", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.RetryJobResponse
			err := c.call(cmd.Context(), op{verb: "retry", kind: "job", id: args[0]}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = jobsClient(conn).RetryJob(ctx, &waldenv1.RetryJobRequest{JobId: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printJobs(w, []*waldenv1.Job{resp.GetJob()}, c.wide()) })
		},
	}
}

// watchWidths are the column widths of the live jobs table: its lines are
// printed one by one as changes arrive, so the columns cannot be measured
// over the whole table; a longer value pushes its line's next columns right.
var watchWidths = []int{12, 8, 9, 6, 8, 7, 22, 14}

// watchRow pads cells to watchWidths, two spaces apart; the last is unpadded.
func watchRow(cells ...string) string {
	var b strings.Builder
	for i, cell := range cells {
		b.WriteString(cell)
		if i == len(cells)-1 {
			break
		}
		w := 0
		if i < len(watchWidths) {
			w = watchWidths[i]
		}
		b.WriteString(strings.Repeat(" ", max(w-len(cell), 0)+2))
	}
	return b.String()
}
