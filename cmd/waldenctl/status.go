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
		Long: `status is the answering member's view: its raft state, the leader and term,
its commit and applied indexes, and every member with its role, version,
whether its transport reaches it, and, as the leader sees them (a follower
asks the leader; "-" when no leader answered), whether each member commits
and its match index. A member may be reachable and apply entries, yet not
commit: its acknowledgements do not reach the leader, or its disk is full.`,
		Example: `$ waldenctl --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 status
CLUSTER  ANSWERED BY  STATE     LEADER  TERM  COMMIT  APPLIED
demo     c1           follower  c2      2     41      41

ID  ROLE      VERSION  RAFT ADDR       ADMIN ADDR      REACHABLE  COMMITS  MATCH INDEX
c1  follower  v0.1.0   127.0.0.1:7101  127.0.0.1:7001  true       true     41
c2  leader    v0.1.0   127.0.0.1:7102  127.0.0.1:7002  true       true     41
c3  follower  v0.1.0   127.0.0.1:7103  127.0.0.1:7003  true       false    12`,
		Args: cobra.NoArgs,
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
				if rs := resp.GetRestore(); rs != nil && rs.GetRestorePhase() != waldenv1.RestorePhase_RESTORE_PHASE_DONE {
					fmt.Fprintf(w, "\nRESTORE: %s; no broker registers and no stream opens until it is done (waldenctl restore status)\n",
						restoreLine(rs, nil))
				}
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
