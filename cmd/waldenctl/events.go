package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

func init() { commands = append(commands, newEventsCmd) }

func newEventsCmd(c *cli) *cobra.Command {
	var broker string
	var limit uint32
	cmd := &cobra.Command{
		Use:   "events [--broker ID] [--limit N]",
		Short: "Show the replicated event log: observations, decisions with evidence, freezes, policy changes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp *waldenv1.ListEventsResponse
			err := c.call(cmd.Context(), op{verb: "list", kind: "events"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).ListEvents(ctx, &waldenv1.ListEventsRequest{BrokerId: broker, Limit: limit}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printEvents(w, resp.GetEvents()) })
		},
	}
	cmd.Flags().StringVar(&broker, "broker", "", "only the events of this broker")
	cmd.Flags().Uint32Var(&limit, "limit", 50, "the newest N events (0: all kept)")
	return cmd
}

func printEvents(w io.Writer, events []*waldenv1.Event) {
	fmt.Fprintln(w, "INDEX\tTIME\tKIND\tBROKER\tACTOR\tMESSAGE")
	for _, e := range events {
		ts := "-"
		if e.GetUnixMs() > 0 {
			ts = time.UnixMilli(e.GetUnixMs()).UTC().Format("2006-01-02T15:04:05.000Z")
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", e.GetIndex(), ts, e.GetKind(), orDash(e.GetBrokerId()), orDash(e.GetActor()), e.GetMessage())
	}
}
