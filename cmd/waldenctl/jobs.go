package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"walden/coordclient"
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
			var js waldenv1.JobState
			if state != "" {
				var ok bool
				if js, ok = waldenv1.Parse[waldenv1.JobState](state); !ok {
					return badWord("--state", state, "a job state", waldenv1.Names[waldenv1.JobState]())
				}
			}
			var resp *waldenv1.ListJobsResponse
			err := c.call(cmd.Context(), op{verb: "list", kind: "jobs"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = jobsClient(conn).ListJobs(ctx, &waldenv1.ListJobsRequest{BrokerId: broker, JobState: js}, opts...)
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
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions(waldenv1.Names[waldenv1.JobState](), cobra.ShellCompDirectiveNoFileComp))
	cmd.AddCommand(newJobsWatchCmd(c), newJobsResolveCmd(c))
	return cmd
}

func printJobs(w io.Writer, jobs []*waldenv1.Job, wide bool) {
	head := "JOB\tBROKER\tSTATE\tSTEP\tASSIGNEE\tATTEMPT\tUPLOADED\tSTREAMS CLOSED\tERROR"
	if wide {
		head += "\tTOKEN\tRECORDS\tSKIPPED\tCREATED\tFINISHED"
	}
	fmt.Fprintln(w, head)
	for _, j := range jobs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d/%d\t%s", j.GetJobId(), j.GetBrokerId(), j.GetJobState().Name(), orDash(j.GetJobStep().Name()),
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
	fmt.Fprintf(w, "state\t%s\n", j.GetJobState().Name())
	fmt.Fprintf(w, "step\t%s\n", orDash(j.GetJobStep().Name()))
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
	printTargetReport(w, j)
	if len(j.GetCheckpoints()) > 0 {
		fmt.Fprintln(w, "\nSTEP\tATTEMPT\tINDEX\tDONE AT\tTOOK\tDETAIL")
		prev := j.GetCreatedUnixMs()
		for _, cp := range j.GetCheckpoints() {
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\n", cp.GetJobStep().Name(), cp.GetAttempt(), cp.GetIndex(),
				msText(cp.GetUnixMs()), durationText(cp.GetUnixMs()-prev), cp.GetDetail())
			prev = cp.GetUnixMs()
		}
	}
}

// printTargetReport shows what the job's recovery target reports in its
// own terms: for AutoMQ, the node and epoch failed over, each opening
// stream's end offsets before and after, and the objects with their ids.
func printTargetReport(w io.Writer, j *waldenv1.Job) {
	r := j.GetTargetReport()
	if r == nil {
		if n := j.GetAutomq(); n != nil {
			fmt.Fprintf(w, "automq node\t%d (epoch %d in its WAL at registration)\n", n.GetNodeId(), n.GetNodeEpoch())
		}
		return
	}
	yes := map[bool]string{true: "yes", false: "no"}
	fmt.Fprintf(w, "%s node\t%d, epoch %d; fenced at the controller: %s; WAL reset: %s; %s uploaded\n", r.GetTarget(), r.GetNodeId(), r.GetNodeEpoch(),
		yes[r.GetFenced()], yes[r.GetWalReset()], size(r.GetBytesUploaded()))
	if len(r.GetStreams()) > 0 {
		fmt.Fprintln(w, "\nSTREAM\tEPOCH\tEND BEFORE\tEND AFTER\tRECORDS\tCLOSED\tPROBLEM")
		for _, s := range r.GetStreams() {
			fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%s\t%s\n", s.GetStreamId(), s.GetStreamEpoch(), s.GetEndOffsetBefore(), s.GetEndOffsetAfter(),
				s.GetRecords(), yes[s.GetClosed()], orDash(s.GetProblem()))
		}
	}
	if len(r.GetObjects()) > 0 {
		fmt.Fprintln(w, "\nOBJECT\tKIND\tSIZE\tSTATE\tKEY")
		for _, o := range r.GetObjects() {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", o.GetObjectId(), o.GetKind(), size(o.GetSize()), o.GetState(), o.GetKey())
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
	return j.GetJobState() != waldenv1.JobState_JOB_STATE_PENDING && j.GetJobState() != waldenv1.JobState_JOB_STATE_RUNNING
}

func newJobsWatchCmd(c *cli) *cobra.Command {
	var broker string
	cmd := &cobra.Command{
		Use:               "watch [ID] [--broker ID]",
		Short:             "Follow recovery jobs live: a line per change with step, assignee, a progress bar, rate and ETA (-o json: one object per change); ends when they finish or on Ctrl-C",
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
	cmd.Flags().StringVar(&broker, "broker", "", "only the jobs of this broker")
	_ = cmd.RegisterFlagCompletionFunc("broker", c.completeIDs("broker", -1))
	return cmd
}

// jobChange is one change of a watched job, as -o json prints it: the job,
// when the change was seen, and the upload rate and ETA measured from the
// changes seen so far.
type jobChange struct {
	Time string          `json:"time"`
	Job  json.RawMessage `json:"job"`
	// RateBytesPerSec is the upload rate over the last five seconds; 0
	// before two samples.
	RateBytesPerSec float64 `json:"rate_bytes_per_sec"`
	// EtaMs is the time left to upload bytes_total at that rate; -1 when
	// unknown, 0 when uploaded.
	EtaMs int64 `json:"eta_ms"`
}

// progress measures a job's upload rate from the byte counts seen.
type progress struct {
	samples []sample
}

type sample struct {
	at    time.Time
	bytes uint64
}

// add records the job's byte count at now and returns the rate (bytes per
// second over the last five seconds) and the ETA (-1 unknown).
func (p *progress) add(j *waldenv1.Job, now time.Time) (float64, time.Duration) {
	b := j.GetBytesUploaded()
	if n := len(p.samples); n == 0 || p.samples[n-1].bytes != b {
		p.samples = append(p.samples, sample{now, b})
	}
	for len(p.samples) > 2 && now.Sub(p.samples[0].at) > 5*time.Second {
		p.samples = p.samples[1:]
	}
	if j.GetBytesTotal() > 0 && b >= j.GetBytesTotal() {
		return p.rate(now), 0
	}
	r := p.rate(now)
	if r <= 0 || j.GetBytesTotal() == 0 {
		return r, -1
	}
	return r, time.Duration(float64(j.GetBytesTotal()-b) / r * float64(time.Second))
}

func (p *progress) rate(now time.Time) float64 {
	if len(p.samples) < 2 {
		return 0
	}
	first, last := p.samples[0], p.samples[len(p.samples)-1]
	dt := now.Sub(first.at).Seconds()
	if dt <= 0 || last.bytes < first.bytes {
		return 0
	}
	return float64(last.bytes-first.bytes) / dt
}

// progressBar is a bar of 20 columns with the percentage.
func progressBar(done, total uint64) string {
	const width = 20
	if total == 0 {
		return "[" + strings.Repeat("·", width) + "]    ?"
	}
	n := int(min(done, total) * width / total)
	return fmt.Sprintf("[%s%s] %3d%%", strings.Repeat("█", n), strings.Repeat("·", width-n), min(done, total)*100/total)
}

func rateText(r float64) string {
	if r <= 0 {
		return "-"
	}
	return size(uint64(r)) + "/s"
}

func etaText(d time.Duration, j *waldenv1.Job) string {
	switch {
	case finished(j):
		return "done"
	case d < 0:
		return "-"
	case d == 0:
		return "uploaded"
	}
	return durationText(d.Milliseconds())
}

// watchJobs prints one line per change of a watched job (table) or one
// JSON object per change (json, yaml). With no job active at the start it
// follows until the first job appears and finishes.
func (c *cli) watchJobs(ctx context.Context, req *waldenv1.WatchJobsRequest) error {
	if !c.structured() {
		fmt.Fprintln(c.stdout, watchRow("TIME", "JOB", "STATE", "STEP", "ON", "PROGRESS", "UPLOADED", "RATE", "ETA", "STREAMS", "ERROR"))
	}
	shown := map[string]string{}
	rates := map[string]*progress{}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		done, err := c.watchOnce(ctx, req, shown, rates)
		if done || ctx.Err() != nil {
			return nil
		}
		if len(shown) == 0 && err != nil {
			// No member ever answered (or one refused): each endpoint had
			// --timeout; trying them all again would only multiply it.
			return err
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	return lastErr
}

// watchOnce follows one WatchJobs stream, trying the endpoints in turn. It
// reports done when every watched job has finished.
func (c *cli) watchOnce(ctx context.Context, req *waldenv1.WatchJobsRequest, shown map[string]string, rates map[string]*progress) (bool, error) {
	var done bool
	o := op{verb: "watch", kind: "job", id: req.GetJobId()}
	err := c.stream(ctx, o, func(ctx context.Context, conn grpc.ClientConnInterface, answered func()) error {
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
			answered()
			now := time.Now()
			all := len(resp.GetJobs()) > 0
			for _, j := range resp.GetJobs() {
				if !finished(j) {
					sawActive = true
					all = false
				}
				p := rates[j.GetJobId()]
				if p == nil {
					p = &progress{}
					rates[j.GetJobId()] = p
				}
				rate, eta := p.add(j, now)
				key, _ := protojson.Marshal(j)
				if shown[j.GetJobId()] == string(key) {
					continue
				}
				shown[j.GetJobId()] = string(key)
				if err := c.printJobChange(j, now, rate, eta); err != nil {
					return err
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

func (c *cli) printJobChange(j *waldenv1.Job, now time.Time, rate float64, eta time.Duration) error {
	if c.structured() {
		b, err := waldenv1.MarshalJSON(j)
		if err != nil {
			return err
		}
		ch := jobChange{Time: now.UTC().Format("2006-01-02T15:04:05.000Z"), Job: b, RateBytesPerSec: rate, EtaMs: -1}
		if eta >= 0 {
			ch.EtaMs = eta.Milliseconds()
		}
		line, err := json.Marshal(ch)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.stdout, "%s\n", line)
		return err
	}
	on := orDash(j.GetAssigneeId())
	if j.GetAttempt() > 1 {
		on += fmt.Sprintf("#%d", j.GetAttempt())
	}
	uploaded := size(j.GetBytesUploaded()) + "/" + size(j.GetBytesTotal())
	_, err := fmt.Fprintln(c.stdout, watchRow(now.Format("15:04:05.000"), j.GetJobId(), j.GetJobState().Name(), orDash(j.GetJobStep().Name()), on,
		progressBar(j.GetBytesUploaded(), j.GetBytesTotal()), uploaded, rateText(rate), etaText(eta, j),
		fmt.Sprintf("%d/%d", j.GetStreamsClosed(), j.GetStreamsTotal()), orDash(oneLine(j.GetError(), 60))))
	return err
}

// stream runs a streaming call against the endpoints in turn until one
// accepts it; a failure reads as a sentence about o. Each endpoint has
// --timeout to send its first answer (call reports it with answered);
// after that the stream lasts as long as it needs.
func (c *cli) stream(ctx context.Context, o op, call func(ctx context.Context, conn grpc.ClientConnInterface, answered func()) error) error {
	var failures []coordclient.Failure
	for _, addr := range c.endpoints {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds))
		if err != nil {
			failures = append(failures, coordclient.Failure{Addr: addr, Err: err})
			continue
		}
		sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, nil))
		silent := time.AfterFunc(c.timeout, cancel)
		err = call(sctx, conn, func() { silent.Stop() })
		timedOut := !silent.Stop() && ctx.Err() == nil && sctx.Err() != nil
		cancel()
		_ = conn.Close()
		if timedOut {
			err = status.Errorf(codes.DeadlineExceeded, "no answer within %s", c.timeout)
		}
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if s, ok := status.FromError(err); ok && s.Code() != codes.Unavailable && s.Code() != codes.DeadlineExceeded {
			return explain(o, s, c.timeout) // a refusal: another member would say the same
		}
		failures = append(failures, coordclient.Failure{Addr: addr, Err: err})
	}
	return explainNoAnswer(&coordclient.NoAnswerError{Failures: failures}, c.timeout, c.noClientCert())
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
var watchWidths = []int{12, 10, 9, 6, 5, 27, 17, 10, 8, 7}

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
		b.WriteString(strings.Repeat(" ", max(w-utf8.RuneCountInString(cell), 0)+2))
	}
	return b.String()
}

func newJobsResolveCmd(c *cli) *cobra.Command {
	var reason string
	var walLost bool
	cmd := &cobra.Command{
		Use:   "resolve ID --reason TEXT [--wal-lost]",
		Short: "Resolve a blocked or failed recovery job: a new attempt, recorded with your reason as an event",
		Long: `Resolve a blocked or failed recovery job: it starts again as a new attempt, and the
resolution is recorded in the job and in the event log with your identity and reason.

--wal-lost declares the broker's WAL lost for good: the next attempts read nothing from
it, close the broker's streams at the catalog's ends and succeed. The records the WAL held
beyond the catalog are lost. Without it, resolve is a retry with a recorded reason (the
cause is fixed).`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("job", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return &callError{Message: "jobs resolve: --reason is required: say why the job is resolved (it is recorded in the event log)", Exit: exitUsage}
			}
			req := &waldenv1.ResolveJobRequest{JobId: args[0], Reason: reason, WalLost: walLost}
			var resp *waldenv1.ResolveJobResponse
			err := c.call(cmd.Context(), op{verb: "resolve", kind: "job", id: args[0]}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = jobsClient(conn).ResolveJob(ctx, req, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printJobs(w, []*waldenv1.Job{resp.GetJob()}, c.wide()) })
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the job is resolved (required; recorded in the event log)")
	cmd.Flags().BoolVar(&walLost, "wal-lost", false, "the broker's WAL is lost for good: recover nothing from it and close its streams")
	return cmd
}
