package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

func init() {
	commands = append(commands, newStreamsCmd, newStreamCmd)
}

func newStreamsCmd(c *cli) *cobra.Command {
	var owner, state string
	cmd := &cobra.Command{
		Use:   "streams",
		Short: "List the streams of the catalog: state, epoch, owner and offsets",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp *waldenv1.ListStreamsResponse
			err := c.call(cmd.Context(), op{verb: "list", kind: "streams"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = waldenv1.NewCatalogClient(conn).ListStreams(ctx, &waldenv1.ListStreamsRequest{OwnerBrokerId: owner, State: state}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printStreams(w, resp.GetStreams()) })
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "only the streams of this broker")
	cmd.Flags().StringVar(&state, "state", "", "only streams in this state: opened or closed")
	return cmd
}

func printStreams(w io.Writer, streams []*waldenv1.Stream) {
	fmt.Fprintln(w, "STREAM\tSTATE\tEPOCH\tOWNER\tOWNER EPOCH\tSTART\tEND\tOBJECTS")
	for _, s := range streams {
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%d\t%d\t%d\t%d\n", s.GetStreamId(), s.GetState(), s.GetEpoch(), orDash(s.GetOwnerBrokerId()),
			s.GetOwnerEpoch(), s.GetStartOffset(), s.GetEndOffset(), s.GetObjects())
	}
}

func newStreamCmd(c *cli) *cobra.Command {
	var max uint32
	cmd := &cobra.Command{
		Use:               "stream ID",
		Short:             "Show one stream and its committed objects (offset ranges, keys, failover job)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("stream", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil {
				return usagef("stream ID: %q is not a number", args[0])
			}
			var resp *waldenv1.DescribeStreamResponse
			err = c.call(cmd.Context(), op{verb: "show", kind: "stream", id: args[0]}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = waldenv1.NewCatalogClient(conn).DescribeStream(ctx, &waldenv1.DescribeStreamRequest{StreamId: id, MaxObjects: max}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				s := resp.GetStream()
				fmt.Fprintf(w, "stream\t%d\n", s.GetStreamId())
				fmt.Fprintf(w, "state\t%s\n", s.GetState())
				fmt.Fprintf(w, "epoch\t%d\n", s.GetEpoch())
				fmt.Fprintf(w, "owner\t%s (epoch %d)\n", orDash(s.GetOwnerBrokerId()), s.GetOwnerEpoch())
				fmt.Fprintf(w, "offsets\t%d .. %d\n", s.GetStartOffset(), s.GetEndOffset())
				fmt.Fprintf(w, "updated\t%s\n", unixText(s.GetUpdatedUnixMs()))
				fmt.Fprintf(w, "objects\t%d\n", s.GetObjects())
				if len(resp.GetObjects()) == 0 {
					return
				}
				fmt.Fprintln(w, "\nOBJECT\tRANGE\tSIZE\tBROKER\tJOB\tKEY")
				for _, o := range resp.GetObjects() {
					for _, r := range o.GetRanges() {
						if r.GetStreamId() == s.GetStreamId() {
							fmt.Fprintf(w, "%s\t%d..%d\t%d\t%s@%d\t%s\t%s\n", o.GetObjectId(), r.GetStartOffset(), r.GetEndOffset(), o.GetSize(),
								o.GetBrokerId(), o.GetBrokerEpoch(), orDash(o.GetJobId()), o.GetKey())
						}
					}
				}
			})
		},
	}
	cmd.Flags().Uint32Var(&max, "max-objects", 50, "show at most this many objects (0: all)")
	return cmd
}
