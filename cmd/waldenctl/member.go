package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

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
	cmd.AddCommand(newMemberListCmd(c), newMemberAddCmd(c), newMemberRemoveCmd(c), newMemberReplaceCmd(c))
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
		Use:   "remove ID",
		Short: "Remove a member (voter or learner)",
		Long: `remove takes a member out of the configuration. A voter's removal less than the
cluster's longest lease_ttl + drift_margin after the previous voter change is refused
(VOTER_CHANGE_TOO_SOON, exit 4) with the time to wait. -o json prints {"members": [...]}
(the configuration after the removal).`,
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

func newMemberReplaceCmd(c *cli) *cobra.Command {
	var name, raftAddr, adminAddr string
	cmd := &cobra.Command{
		Use:   "replace OLD [--name NEW] [--raft ADDR --admin ADDR]",
		Short: "Replace a member whose host or disk is lost: remove it, add its replacement as a learner",
		Long: `Replace a member whose host or disk is lost: OLD is removed and its replacement (NEW, or
OLD again) is added as a learner, with OLD's addresses unless --raft and --admin say others.
Start the replacement with an empty data_dir and initial_cluster_state: existing. The leader
promotes it to voter once it has caught up, and not before the cluster's longest
lease_ttl + drift_margin has passed since the removal (voter changes are spaced so that no
broker lease granted before them still runs); the replacement grants and attests nothing for
that long after it starts either (docs/safety.md).

Refused, with nothing changed: a member that does not exist, the leader (transfer leadership
first: waldenctl leader transfer), and a second voter change inside the spacing (the answer
says how long to wait).`,
		Example: `$ waldenctl member replace c3
removed member c3; added c3 as a learner (raft 127.0.0.1:7103, admin 127.0.0.1:7003)
start c3 with an empty data_dir and initial_cluster_state: existing; the leader promotes it to voter once it has caught up, and not before the cluster's longest lease_ttl + drift_margin has passed since the removal
$ waldenctl member replace c9
waldenctl: member replace: no member c9 (members: c1, c2, c3); to add a member, use waldenctl member add
$ waldenctl member replace c2        # c2 leads
waldenctl: member replace: c2 is the leader; move leadership first (waldenctl leader transfer ID, to another voter), then replace c2`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("member", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			old := args[0]
			if name == "" {
				name = old
			}
			var st *waldenv1.StatusResponse
			err := c.call(cmd.Context(), op{verb: "replace", kind: "member", id: old}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				st, err = waldenv1.NewClusterClient(conn).Status(ctx, &waldenv1.StatusRequest{}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			var current *waldenv1.Member
			var names []string
			for _, m := range st.GetMembers() {
				names = append(names, m.GetId())
				if m.GetId() == old {
					current = m
				}
			}
			switch {
			case current == nil:
				return &callError{Message: fmt.Sprintf("member replace: no member %s (members: %s); to add a member, use waldenctl member add",
					old, strings.Join(names, ", ")), Exit: exitNotFound}
			case st.GetLeaderId() == "":
				return &callError{Message: "member replace: the cluster has no leader now; wait for one (waldenctl status), then replace " + old, Exit: exitUnavailable}
			case st.GetLeaderId() == old:
				return &callError{Message: fmt.Sprintf("member replace: %s is the leader; move leadership first (waldenctl leader transfer ID, "+
					"to another voter), then replace %s", old, old), Exit: exitRefused}
			case name != old && slices.Contains(names, name):
				return &callError{Message: fmt.Sprintf("member replace: %s is already a member; name the replacement otherwise, or replace under the old name", name), Exit: exitRefused}
			}
			if raftAddr == "" && adminAddr == "" && name == old {
				raftAddr, adminAddr = current.GetRaftAddr(), current.GetAdminAddr()
			}
			if raftAddr == "" || adminAddr == "" {
				return &callError{Message: "member replace: a replacement under a new name needs its addresses: --raft ADDR --admin ADDR", Exit: exitUsage}
			}
			err = c.call(cmd.Context(), op{verb: "remove", kind: "member", id: old}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				_, err := waldenv1.NewClusterClient(conn).MemberRemove(ctx, &waldenv1.MemberRemoveRequest{Id: old}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			req := &waldenv1.MemberAddRequest{Id: name, RaftAddr: raftAddr, AdminAddr: adminAddr}
			var added *waldenv1.MemberAddResponse
			err = c.call(cmd.Context(), op{verb: "add", kind: "member", id: name}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				added, err = waldenv1.NewClusterClient(conn).MemberAdd(ctx, req, opts...)
				return err
			})
			if err != nil {
				return fmt.Errorf("member replace: %s was removed, but adding %s failed; add it with waldenctl member add %s --raft %s --admin %s: %w",
					old, name, name, raftAddr, adminAddr, err)
			}
			return c.print(added, func(w io.Writer) {
				fmt.Fprintf(w, "removed member %s; added %s as a learner (raft %s, admin %s)\n", old, name, raftAddr, adminAddr)
				fmt.Fprintf(w, "start %s with an empty data_dir and initial_cluster_state: existing; the leader promotes it to voter once it has caught up, "+
					"and not before the cluster's longest lease_ttl + drift_margin has passed since the removal\n\n", name)
				printMembers(w, added.GetMembers(), "")
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the replacement's member id (default: the old one's)")
	cmd.Flags().StringVar(&raftAddr, "raft", "", "the replacement's raft peer address (default: the old member's, under the same name)")
	cmd.Flags().StringVar(&adminAddr, "admin", "", "the replacement's admin API address (default: the old member's, under the same name)")
	return cmd
}
