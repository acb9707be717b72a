package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/coordclient"
	waldenv1 "walden/proto/walden/v1"
)

func init() { commands = append(commands, newEventsCmd) }

// eventKinds are the kinds of the event log (EventKind, types.proto).
var eventKinds = waldenv1.Names[waldenv1.EventKind]()

// eventFilter selects events on the client: the API filters by broker and
// the newest N only.
type eventFilter struct {
	kinds   []string
	sinceMs int64
}

func (f eventFilter) keep(e *waldenv1.Event) bool {
	return (len(f.kinds) == 0 || slices.Contains(f.kinds, e.GetEventKind().Name())) && e.GetUnixMs() >= f.sinceMs
}

// parseSince reads --since: a duration before now (10m, 1h30m) or a time
// (RFC 3339, or 15:04:05 today in local time).
func parseSince(s string, now time.Time) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return 0, fmt.Errorf("--since: %s is negative", s)
		}
		return now.Add(-d).UnixMilli(), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UnixMilli(), nil
	}
	if t, err := time.ParseInLocation("15:04:05", s, now.Location()); err == nil {
		y, m, d := now.Date()
		return time.Date(y, m, d, t.Hour(), t.Minute(), t.Second(), 0, now.Location()).UnixMilli(), nil
	}
	return 0, fmt.Errorf("--since: %q is neither a duration (10m) nor a time (2026-01-02T15:04:05Z, 15:04:05)", s)
}

func newEventsCmd(c *cli) *cobra.Command {
	var broker, since string
	var kinds []string
	var limit uint32
	var follow bool
	cmd := &cobra.Command{
		Use:   "events [--broker ID] [--kind KIND,...] [--since 10m] [--limit N] [--follow]",
		Short: "Show the replicated event log: observations, decisions with evidence, recovery jobs, freezes, policy changes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := eventFilter{kinds: kinds}
			for _, k := range kinds {
				if !slices.Contains(eventKinds, k) {
					return badWord("--kind", k, "a kind of event", eventKinds)
				}
			}
			var err error
			if f.sinceMs, err = parseSince(since, time.Now()); err != nil {
				return usageErr(err)
			}
			if follow {
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return c.followEvents(ctx, broker, f, int(limit))
			}
			evs, err := c.events(cmd.Context(), broker, f, int(limit))
			if err != nil {
				return err
			}
			resp := &waldenv1.ListEventsResponse{Events: evs}
			return c.print(resp, func(w io.Writer) { printEvents(w, resp.GetEvents(), c.wide()) })
		},
	}
	cmd.Flags().StringVar(&broker, "broker", "", "only the events of this broker")
	cmd.Flags().StringSliceVar(&kinds, "kind", nil, "only events of these kinds, comma separated: "+strings.Join(eventKinds, ", "))
	cmd.Flags().StringVar(&since, "since", "", "only events since a duration ago (10m) or a time (RFC 3339, or 15:04:05 today)")
	cmd.Flags().Uint32Var(&limit, "limit", 50, "the newest N events that match (0: all kept)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "after the newest events, print new ones as they are committed until Ctrl-C (-o json: one object per line)")
	_ = cmd.RegisterFlagCompletionFunc("broker", c.completeIDs("broker", -1))
	_ = cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions(eventKinds, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// events returns the newest limit (0: all) events that f keeps.
func (c *cli) events(ctx context.Context, broker string, f eventFilter, limit int) ([]*waldenv1.Event, error) {
	var resp *waldenv1.ListEventsResponse
	err := c.call(ctx, op{verb: "list the events of", kind: "broker", id: broker}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		var err error
		resp, err = brokersClient(conn).ListEvents(ctx, &waldenv1.ListEventsRequest{BrokerId: broker}, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []*waldenv1.Event
	for _, e := range resp.GetEvents() {
		if f.keep(e) {
			out = append(out, e)
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

// followEvents prints the newest limit events, then every new one as the
// cluster commits it, until ctx ends: through the coordinators' Watch
// (coordclient.Client.Watch resumes on another member when one stops
// answering), or, with members that do not serve Watch, by polling every
// 500ms. The event index says where to go on: no event is printed twice.
func (c *cli) followEvents(ctx context.Context, broker string, f eventFilter, limit int) error {
	if !c.structured() {
		fmt.Fprintln(c.stdout, eventRow("INDEX", "TIME", "KIND", "BROKER", "ACTOR", "MESSAGE"))
	}
	var last uint64
	first := true
	show := func(evs []*waldenv1.Event) error {
		if first && limit > 0 && len(evs) > limit {
			evs = evs[len(evs)-limit:]
		}
		first = false
		for _, e := range evs {
			if e.GetIndex() <= last {
				continue
			}
			last = e.GetIndex()
			if err := c.printEventLine(e); err != nil {
				return err
			}
		}
		return nil
	}
	coords := coordclient.New(c.endpoints, nil, grpc.WithTransportCredentials(c.creds))
	defer coords.Close()
	// Each endpoint has --timeout for its first answer; nothing answered at
	// the start is said at once, later an outage of three rounds.
	opts := coordclient.WatchOptions{FirstAnswer: c.timeout, GiveUp: 3}
	err := coords.Watch(ctx, &waldenv1.WatchRequest{Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_EVENT}, BrokerId: broker}, opts,
		func(r *waldenv1.WatchResponse) error {
			var evs []*waldenv1.Event
			for _, ch := range r.GetChanges() {
				if e := ch.GetEvent(); e != nil && f.keep(e) {
					evs = append(evs, e)
				}
			}
			return show(evs)
		})
	var none *coordclient.NoAnswerError
	switch {
	case ctx.Err() != nil:
		return nil
	case errors.As(err, &none):
		return explainNoAnswer(none, c.timeout, c.noClientCert())
	case status.Code(err) == codes.Unimplemented:
		return c.pollEvents(ctx, broker, f, show)
	case err != nil:
		return explain(op{verb: "follow the events of", kind: "broker", id: broker}, status.Convert(err), c.timeout)
	}
	return nil
}

// pollEvents is followEvents for members without Watch: it lists the
// events every 500ms.
func (c *cli) pollEvents(ctx context.Context, broker string, f eventFilter, show func([]*waldenv1.Event) error) error {
	failures := 0
	first := true
	for {
		evs, err := c.events(ctx, broker, f, 0)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			// Nothing answered at the start: say so now (every endpoint had
			// --timeout). Later, ride out a leader change, not an outage.
			if failures++; first || failures >= 3 {
				return err
			}
		default:
			failures, first = 0, false
			if err := show(evs); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (c *cli) printEventLine(e *waldenv1.Event) error {
	if c.structured() {
		b, err := waldenv1.MarshalJSON(e)
		if err != nil {
			return err
		}
		out, err := formatDoc(b, false)
		if err != nil {
			return err
		}
		line := strings.Join(strings.Fields(string(out)), " ")
		_, err = fmt.Fprintln(c.stdout, line)
		return err
	}
	_, err := fmt.Fprintln(c.stdout, eventRow(fmt.Sprint(e.GetIndex()), eventTime(e), e.GetEventKind().Name(), orDash(e.GetBrokerId()), orDash(e.GetActor()), e.GetMessage()))
	return err
}

// eventRow pads the cells of a followed event to fixed widths (the lines
// are printed one by one, so the columns cannot be measured).
func eventRow(cells ...string) string {
	widths := []int{6, 24, 12, 8, 9}
	var b strings.Builder
	for i, cell := range cells {
		b.WriteString(cell)
		if i < len(widths) {
			b.WriteString(strings.Repeat(" ", max(widths[i]-len(cell), 0)+2))
		}
	}
	return b.String()
}

func eventTime(e *waldenv1.Event) string {
	if e.GetUnixMs() <= 0 {
		return "-"
	}
	return time.UnixMilli(e.GetUnixMs()).UTC().Format("2006-01-02T15:04:05.000Z")
}

func printEvents(w io.Writer, events []*waldenv1.Event, wide bool) {
	head := "INDEX\tTIME\tKIND\tBROKER\tACTOR\tMESSAGE"
	if wide {
		head += "\tJOB\tEPOCH\tSTATE"
	}
	fmt.Fprintln(w, head)
	for _, e := range events {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s", e.GetIndex(), eventTime(e), e.GetEventKind().Name(), orDash(e.GetBrokerId()), orDash(e.GetActor()), e.GetMessage())
		if wide {
			fmt.Fprintf(w, "\t%s\t%s\t%s", orDash(e.GetJobId()), eventEpoch(e.GetDetail()), eventState(e.GetDetail()))
		}
		fmt.Fprintln(w)
	}
}

// eventEpoch is the broker epoch an event is about, from its typed fields
// ("3→7" for a decision's fenced and new epoch); "-" for an event without
// one (an older walden's, a policy change).
func eventEpoch(d *waldenv1.EventDetail) string {
	switch {
	case d.GetNewEpoch() != 0:
		return fmt.Sprintf("%d→%d", d.GetEpoch(), d.GetNewEpoch())
	case d.GetEpoch() != 0:
		return fmt.Sprint(d.GetEpoch())
	}
	return "-"
}

// eventState is the broker's state change an event made, from its typed
// fields: "suspect→failed", the state alone when it did not change, "-"
// for an event without one.
func eventState(d *waldenv1.EventDetail) string {
	from, to := d.GetFromState(), d.GetToState()
	switch {
	case to == waldenv1.BrokerState_BROKER_STATE_UNSPECIFIED:
		return "-"
	case from == to || from == waldenv1.BrokerState_BROKER_STATE_UNSPECIFIED:
		return to.Name()
	}
	return from.Name() + "→" + to.Name()
}
