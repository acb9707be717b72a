package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

func init() { commands = append(commands, newStatusCmd) }

func newStatusCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the cluster as the first answering member sees it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp *waldenv1.StatusResponse
			err := c.call(cmd.Context(), op{verb: "show", kind: "status"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = waldenv1.NewClusterClient(conn).Status(ctx, &waldenv1.StatusRequest{}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				fmt.Fprintln(w, "CLUSTER\tANSWERED BY\tSTATE\tLEADER\tTERM\tCOMMIT\tAPPLIED")
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\n", resp.GetClusterName(), resp.GetNodeId(), orDash(resp.GetRaftState()),
					orDash(resp.GetLeaderId()), resp.GetTerm(), resp.GetCommitIndex(), resp.GetAppliedIndex())
				fmt.Fprintln(w)
				printMembers(w, resp.GetMembers(), resp.GetProgressBy())
			})
		},
	}
}

// printMembers writes the members table. progressBy names the leader
// whose view the match indexes and COMMITS are; without it they are
// unknown ("-").
func printMembers(w io.Writer, members []*waldenv1.Member, progressBy string) {
	fmt.Fprintln(w, "ID\tROLE\tVERSION\tRAFT ADDR\tADMIN ADDR\tREACHABLE\tCOMMITS\tMATCH INDEX")
	for _, m := range members {
		commits, match := "-", "-"
		if progressBy != "" {
			commits, match = fmt.Sprint(m.GetCommits()), fmt.Sprint(m.GetMatchIndex())
			if m.GetMemberRole() == waldenv1.MemberRole_MEMBER_ROLE_LEARNER {
				commits = "learner"
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%t\t%s\t%s\n", m.GetId(), orDash(m.GetMemberRole().Name()), orDash(m.GetVersion()),
			m.GetRaftAddr(), m.GetAdminAddr(), m.GetReachable(), commits, match)
	}
}
