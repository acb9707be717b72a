package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

func init() { commands = append(commands, newLeaderCmd) }

func newLeaderCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "leader",
		Short: "Leadership commands",
	}
	cmd.AddCommand(&cobra.Command{
		Use:               "transfer ID",
		Short:             "Hand leadership to the named voter",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("member", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.LeaderTransferResponse
			err := c.call(cmd.Context(), op{verb: "transfer leadership to", kind: "member", id: args[0], check: "waldenctl status"}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = waldenv1.NewClusterClient(conn).LeaderTransfer(ctx, &waldenv1.LeaderTransferRequest{Id: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				fmt.Fprintln(w, "LEADER\tTERM")
				fmt.Fprintf(w, "%s\t%d\n", resp.GetLeaderId(), resp.GetTerm())
			})
		},
	})
	return cmd
}
