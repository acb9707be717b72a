package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

func init() { commands = append(commands, newMemberCmd) }

func newMemberCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List, add and remove cluster members",
	}
	cmd.AddCommand(newMemberListCmd(c), newMemberAddCmd(c), newMemberRemoveCmd(c))
	return cmd
}

func newMemberListCmd(c *cli) *cobra.Command {
	var linearizable bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the members of the committed configuration",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp *waldenv1.MemberListResponse
			err := c.call(cmd.Context(), op{verb: "list", kind: "members"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = waldenv1.NewClusterClient(conn).MemberList(ctx, &waldenv1.MemberListRequest{Linearizable: linearizable}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printMembers(w, resp.GetMembers(), resp.GetProgressBy()) })
		},
	}
	cmd.Flags().BoolVar(&linearizable, "linearizable", false, "answer only after confirming with the leader that the list is current (needs a leader)")
	return cmd
}

func newMemberAddCmd(c *cli) *cobra.Command {
	var raftAddr, adminAddr string
	cmd := &cobra.Command{
		Use:   "add ID --raft ADDR --admin ADDR",
		Short: "Add a member as a learner; the leader promotes it once it has caught up",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &waldenv1.MemberAddRequest{Id: args[0], RaftAddr: raftAddr, AdminAddr: adminAddr}
			var resp *waldenv1.MemberAddResponse
			err := c.call(cmd.Context(), op{verb: "add", kind: "member", id: args[0]}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = waldenv1.NewClusterClient(conn).MemberAdd(ctx, req, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				fmt.Fprintf(w, "added member %s as %s\n\n", resp.GetMember().GetId(), orDash(resp.GetMember().GetMemberRole().Name()))
				printMembers(w, resp.GetMembers(), "")
			})
		},
	}
	cmd.Flags().StringVar(&raftAddr, "raft", "", "raft peer address (host:port) of the new member")
	cmd.Flags().StringVar(&adminAddr, "admin", "", "admin API address (host:port) of the new member")
	_ = cmd.MarkFlagRequired("raft")
	_ = cmd.MarkFlagRequired("admin")
	return cmd
}

func newMemberRemoveCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:               "remove ID",
		Short:             "Remove a member (voter or learner)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("member", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.MemberRemoveResponse
			err := c.call(cmd.Context(), op{verb: "remove", kind: "member", id: args[0]}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = waldenv1.NewClusterClient(conn).MemberRemove(ctx, &waldenv1.MemberRemoveRequest{Id: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				fmt.Fprintf(w, "removed member %s\n\n", args[0])
				printMembers(w, resp.GetMembers(), "")
			})
		},
	}
}
