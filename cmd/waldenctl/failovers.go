package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
	"walden/timeline"
)

func init() { commands = append(commands, newFailoversCmd) }

func failoversClient(conn grpc.ClientConnInterface) waldenv1.FailoversClient {
	return waldenv1.NewFailoversClient(conn)
}

func newFailoversCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:               "failovers [BROKER]",
		Short:             "List the failovers (of one broker): who decided, who recovered, how long each part took",
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: c.completeIDs("broker", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &waldenv1.ListFailoversRequest{}
			o := op{verb: "list", kind: "failovers"}
			if len(args) == 1 {
				req.BrokerId = args[0]
				o = op{verb: "list the failovers of", kind: "broker", id: args[0]}
			}
			var resp *waldenv1.ListFailoversResponse
			err := c.call(cmd.Context(), o, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = failoversClient(conn).ListFailovers(ctx, req, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printFailovers(w, resp.GetFailovers(), c.wide(), time.Now().UnixMilli()) })
		},
	}
}

// failoverTimes are the three parts of a failover, in milliseconds (-1
// when not reached): detection (first suspicion to decision), recovery
// (decision to the job's end) and reopen (the job's end to the last stream
// open again).
func failoverTimes(f *waldenv1.Failover) (detect, recover, reopen, total int64) {
	detect, recover, reopen, total = -1, -1, -1, -1
	start := f.GetFirstSuspectUnixMs()
	if start > 0 {
		detect = f.GetDecidedUnixMs() - start
	} else {
		start = f.GetDecidedUnixMs()
	}
	if f.GetFinishedUnixMs() > 0 {
		recover = f.GetFinishedUnixMs() - f.GetDecidedUnixMs()
		total = f.GetFinishedUnixMs() - start
	}
	if f.GetReopenedUnixMs() > 0 && f.GetFinishedUnixMs() > 0 {
		reopen = max(f.GetReopenedUnixMs()-f.GetFinishedUnixMs(), 0)
		total = max(f.GetReopenedUnixMs(), f.GetFinishedUnixMs()) - start
	}
	return
}

func msOrDash(ms int64) string {
	if ms < 0 {
		return "-"
	}
	return durationText(ms)
}

func printFailovers(w io.Writer, fs []*waldenv1.Failover, wide bool, now int64) {
	head := "FAILOVER\tBROKER\tSTATE\tEPOCH\tDECIDED BY\tRECOVERED BY\tDETECTION\tRECOVERY\tREOPEN\tTOTAL\tUPLOADED\tSTREAMS"
	if wide {
		head += "\tDECIDED AT\tMANUAL\tATTEMPTS\tOBJECTS\tRECORDS"
	}
	fmt.Fprintln(w, head)
	for _, f := range fs {
		d, r, o, total := failoverTimes(f)
		if f.GetFinishedUnixMs() == 0 && (f.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING || f.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING) {
			r = now - f.GetDecidedUnixMs()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d→%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d reopened",
			f.GetId(), f.GetBrokerId(), f.GetJobState().Name(), f.GetOldEpoch(), f.GetNewEpoch(), orDash(f.GetDecidedBy()),
			orDash(strings.Join(f.GetAssignees(), "→")), msOrDash(d), msOrDash(r), msOrDash(o), msOrDash(total),
			size(f.GetBytesUploaded()), f.GetStreamsReopened(), f.GetStreamsTotal())
		if wide {
			fmt.Fprintf(w, "\t%s\t%t\t%d\t%d\t%d", msText(f.GetDecidedUnixMs()), f.GetManual(), f.GetAttempts(), f.GetObjects(), f.GetRecordsUploaded())
		}
		fmt.Fprintln(w)
	}
}

func newFailoverShowCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:               "show ID",
		Short:             "Show one failover as a timeline: phases and durations, evidence, who decided, who recovered, bytes, streams (ID: its job id, or a broker id for its last failover)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("job", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.GetFailoverResponse
			err := c.call(cmd.Context(), op{verb: "show", kind: "failover", id: args[0]}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = failoversClient(conn).GetFailover(ctx, &waldenv1.GetFailoverRequest{Id: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printFailover(w, resp.GetFailover(), time.Now().UnixMilli()) })
		},
	}
}

// barWidth is the width of the timeline's bars in the terminal.
const barWidth = 40

func printFailover(w io.Writer, f *waldenv1.Failover, now int64) {
	d, r, o, total := failoverTimes(f)
	fmt.Fprintf(w, "failover\t%s\n", f.GetId())
	fmt.Fprintf(w, "broker\t%s: epoch %d fenced, new epoch %d\n", f.GetBrokerId(), f.GetOldEpoch(), f.GetNewEpoch())
	fmt.Fprintf(w, "state\t%s", f.GetJobState().Name())
	if f.GetJobStep() != waldenv1.JobStep_JOB_STEP_UNSPECIFIED && f.GetJobStep() != waldenv1.JobStep_JOB_STEP_DONE {
		fmt.Fprintf(w, " (step %s)", f.GetJobStep().Name())
	}
	fmt.Fprintln(w)
	how := "automatic"
	if f.GetManual() {
		how = "manual"
	}
	fmt.Fprintf(w, "decided\t%s by %s (%s)%s\n", msText(f.GetDecidedUnixMs()), orDash(f.GetDecidedBy()), how, reasonText(f.GetReason()))
	if ev := f.GetEvidence(); ev != nil && !ev.GetManual() {
		fmt.Fprintf(w, "evidence\tsuspected by %s for %s (failure_timeout %s); lease expired %s before\n",
			plural(int64(len(ev.GetObservations())), "coordinator", "coordinators"), durationText(ev.GetSuspectForMs()),
			durationText(ev.GetFailureTimeoutMs()), durationText(ev.GetLeaseExpiredForMs()))
	}
	fmt.Fprintf(w, "recovered by\t%s (%s)\n", orDash(strings.Join(f.GetAssignees(), " → ")), plural(int64(f.GetAttempts()), "attempt", "attempts"))
	fmt.Fprintf(w, "uploaded\t%s in %s (%s)\n", bytesOf(f.GetBytesUploaded(), f.GetBytesTotal()),
		plural(int64(f.GetObjects()), "object", "objects"), plural(int64(f.GetRecordsUploaded()), "record batch", "record batches"))
	fmt.Fprintf(w, "streams\t%d/%d closed, %d/%d open again on other brokers\n", f.GetStreamsClosed(), f.GetStreamsTotal(),
		f.GetStreamsReopened(), f.GetStreamsTotal())
	fmt.Fprintf(w, "took\tdetection %s, recovery %s, reopen %s, total %s\n", msOrDash(d), msOrDash(r), msOrDash(o), msOrDash(total))
	if f.GetError() != "" {
		fmt.Fprintf(w, "error\t%s\n", oneLine(f.GetError(), 200))
	}
	start, end := timeline.Span(f, now)
	span := max(end-start, 1)
	fmt.Fprintln(w, "\nPHASE\tBY\tSTART\tTOOK\tTIMELINE\tDETAIL")
	for _, p := range f.GetPhases() {
		dur := timeline.Duration(p, now)
		took := durationText(dur)
		if p.GetEndUnixMs() == 0 {
			took += " so far"
		}
		name := timeline.Label(p.GetKind())
		fmt.Fprintf(w, "%s\t%s\t+%s\t%s\t%s\t%s\n", name, orDash(p.GetActor()), durationText(p.GetStartUnixMs()-start), took,
			bar(p.GetStartUnixMs()-start, dur, span, p.GetEndUnixMs() == 0), oneLine(p.GetDetail(), 100))
	}
}

func reasonText(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

// bar draws a phase as a bar of barWidth columns: spaces before its start,
// then blocks for its length (at least one), "›" at the end while it goes
// on.
func bar(offset, dur, span int64, running bool) string {
	from := int(offset * barWidth / span)
	n := max(int((offset+dur)*barWidth/span)-from, 1)
	from = min(from, barWidth-1)
	n = min(n, barWidth-from)
	fill := "█"
	if dur == 0 {
		fill = "◆"
	}
	s := strings.Repeat(" ", from) + strings.Repeat(fill, n)
	if running {
		s = s[:len(s)-len(fill)] + "›"
	}
	return "|" + s + strings.Repeat(" ", barWidth-from-n) + "|"
}
