package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

// listIDs returns the ids of every object of kind ("broker", "job",
// "member", "stream") the cluster knows: for shell completion and for the
// suggestion after an unknown id.
func (c *cli) listIDs(ctx context.Context, kind string) ([]string, error) {
	var ids []string
	err := c.call(ctx, op{verb: "list", kind: kind + "s"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		ids = nil
		switch kind {
		case "broker":
			resp, err := brokersClient(conn).ListBrokers(ctx, &waldenv1.ListBrokersRequest{}, opts...)
			for _, b := range resp.GetBrokers() {
				ids = append(ids, b.GetBrokerId())
			}
			return err
		case "job":
			resp, err := jobsClient(conn).ListJobs(ctx, &waldenv1.ListJobsRequest{}, opts...)
			for _, j := range resp.GetJobs() {
				ids = append(ids, j.GetJobId())
			}
			return err
		case "member":
			resp, err := waldenv1.NewClusterClient(conn).MemberList(ctx, &waldenv1.MemberListRequest{}, opts...)
			for _, m := range resp.GetMembers() {
				ids = append(ids, m.GetId())
			}
			return err
		case "stream":
			resp, err := waldenv1.NewCatalogClient(conn).ListStreams(ctx, &waldenv1.ListStreamsRequest{}, opts...)
			for _, s := range resp.GetStreams() {
				ids = append(ids, fmt.Sprint(s.GetStreamId()))
			}
			return err
		}
		return nil
	})
	return ids, err
}

// suggestID sets e.Hint to the known id nearest to o.id when the call
// failed because o.id does not exist.
func (c *cli) suggestID(ctx context.Context, o op, e *callError) {
	if o.id == "" || e.Code != "NotFound" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ids, err := c.listIDs(ctx, o.kind)
	if err != nil {
		return
	}
	if s := closest(o.id, ids); s != "" {
		e.Hint = fmt.Sprintf("did you mean %s?", s)
	}
}

// completeIDs is a cobra ValidArgsFunction completing the position-th
// argument (0-based; -1 for a flag's value) with the ids of kind, asked of the cluster with the
// global flags (and their environment variables) as given so far.
func (c *cli) completeIDs(kind string, position int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if position >= 0 && len(args) != position {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		if err := c.complete(cmd); err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), min(c.timeout, 3*time.Second))
		defer cancel()
		ids, err := c.listIDs(ctx, kind)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		return ids, cobra.ShellCompDirectiveNoFileComp
	}
}
