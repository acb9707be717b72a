package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

func init() { commands = append(commands, newPolicyCmd) }

func newPolicyCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Show or change the failover policy",
	}
	cmd.AddCommand(newPolicyGetCmd(c), newPolicySetCmd(c))
	return cmd
}

func newPolicyGetCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "get",
		Short: "Show the cluster's policy: each key's value and where it came from (default, seed, runtime)",
		Long: `Show the cluster's policy. It is replicated: every member answers the same. The config
files' policy: sections seed it once, when the cluster is founded (source "seed"); afterwards
only "waldenctl policy set" changes it (source "runtime"). When the answering member's config
file differs from the policy, the keys are listed: editing a config file changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp *waldenv1.GetPolicyResponse
			err := c.call(cmd.Context(), op{verb: "show", kind: "policy"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).GetPolicy(ctx, &waldenv1.GetPolicyRequest{}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				printPolicy(w, resp.GetEntries())
				if resp.GetSeededBy() != "" {
					fmt.Fprintf(w, "\nseeded from the config file of %s; answered by %s\n", resp.GetSeededBy(), resp.GetAnsweredBy())
				}
				if d := resp.GetConfigDrift(); len(d) > 0 {
					fmt.Fprintf(w, "%s's config file differs on %s: the file does not change the policy; use waldenctl policy set\n",
						resp.GetAnsweredBy(), strings.Join(d, ", "))
				}
			})
		},
	}
}

func printPolicy(w io.Writer, entries []*waldenv1.PolicyEntry) {
	fmt.Fprintln(w, "KEY\tVALUE\tSOURCE")
	for _, e := range entries {
		src := e.GetSource()
		if e.GetSetIndex() > 0 {
			src = fmt.Sprintf("%s (index %d)", src, e.GetSetIndex())
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", e.GetKey(), e.GetValue(), src)
	}
}

func newPolicySetCmd(c *cli) *cobra.Command {
	var unset []string
	cmd := &cobra.Command{
		Use:   "set KEY=VALUE ... [--unset KEY]",
		Short: "Change policy keys at runtime through raft (validated before anything changes)",
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &waldenv1.SetPolicyRequest{Set: map[string]string{}, Unset: unset}
			for _, a := range args {
				k, v, ok := strings.Cut(a, "=")
				if !ok || k == "" {
					return usagef("policy set: %q is not KEY=VALUE", a)
				}
				req.Set[k] = v
			}
			if len(req.Set) == 0 && len(req.Unset) == 0 {
				return usagef("policy set: give at least one KEY=VALUE or --unset KEY")
			}
			var resp *waldenv1.SetPolicyResponse
			err := c.call(cmd.Context(), op{verb: "change", kind: "policy"}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).SetPolicy(ctx, req, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printPolicy(w, resp.GetEntries()) })
		},
	}
	cmd.Flags().StringSliceVar(&unset, "unset", nil, "remove the runtime override of KEY (back to config or default)")
	return cmd
}
