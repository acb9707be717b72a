package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	waldenv1 "walden/proto/walden/v1"
)

func init() {
	commands = append(commands, newBrokersCmd, newBrokerCmd, newFailoverCmd, newAckCmd, newMaintenanceCmd)
}

func brokersClient(conn grpc.ClientConnInterface) waldenv1.BrokersClient {
	return waldenv1.NewBrokersClient(conn)
}

func newBrokersCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "brokers",
		Short: "List the registered brokers: state, epoch, lease and observations",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp *waldenv1.ListBrokersResponse
			err := c.call(cmd.Context(), op{verb: "list", kind: "brokers"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).ListBrokers(ctx, &waldenv1.ListBrokersRequest{}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printBrokers(w, resp.GetBrokers(), c.wide()) })
		},
	}
}

func printBrokers(w io.Writer, brokers []*waldenv1.Broker, wide bool) {
	head := "BROKER\tSTATE\tEPOCH\tLEASE\tOBSERVATIONS\tFAILOVERS\tLAST JOB"
	// The AutoMQ column appears once any broker's agent reports an AutoMQ
	// node: a cluster of AutoMQ brokers shows it, others are unchanged.
	automq := slices.ContainsFunc(brokers, func(b *waldenv1.Broker) bool { return b.GetAutomq() != nil })
	if automq {
		head += "\tAUTOMQ NODE"
	}
	if wide {
		head += "\tFENCED\tMAINTENANCE\tAGENT\tBROKER ADDR\tWAL"
	}
	fmt.Fprintln(w, head)
	for _, b := range brokers {
		var obs []string
		for _, o := range b.GetObservations() {
			obs = append(obs, o.GetObserverId()+"="+o.GetObservationState().Name())
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d\t%s", b.GetBrokerId(), b.GetBrokerState().Name(), b.GetEpoch(),
			leaseText(b.GetLeaseRemainingMs()), orDash(strings.Join(obs, ",")), b.GetFailovers(), orDash(b.GetLastJobId()))
		if automq {
			fmt.Fprintf(w, "\t%s", automqText(b.GetAutomq()))
		}
		if wide {
			fmt.Fprintf(w, "\t%t\t%t\t%s\t%s\t%s", b.GetFenced(), b.GetMaintenance(), orDash(b.GetAgentAddr()),
				orDash(b.GetBrokerAddr()), orDash(b.GetWal().GetPath()))
		}
		fmt.Fprintln(w)
	}
}

// automqText shows a broker's AutoMQ node: "3 (epoch 1732870000000)", "3"
// when its WAL named no epoch, "-" for a broker that is not AutoMQ's.
func automqText(a *waldenv1.AutomqNode) string {
	switch {
	case a == nil:
		return "-"
	case a.GetNodeEpoch() == 0:
		return fmt.Sprint(a.GetNodeId())
	}
	return fmt.Sprintf("%d (epoch %d)", a.GetNodeId(), a.GetNodeEpoch())
}

// leaseText shows lease_remaining_ms: "-" when the answering member cannot
// tell (-1), "expired" at 0.
func leaseText(ms int64) string {
	switch {
	case ms < 0:
		return "-"
	case ms == 0:
		return "expired"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func unixText(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	t := time.UnixMilli(ms).UTC()
	return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), time.Since(t).Truncate(time.Second))
}

func newBrokerCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:               "broker ID | broker remove ID",
		Short:             "Show one broker: state, epoch, lease remaining and each coordinator's observation since when (broker remove ID: remove a registration nobody uses)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("broker", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.GetBrokerResponse
			err := c.call(cmd.Context(), op{verb: "show", kind: "broker", id: args[0]}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) { printBroker(w, resp.GetBroker()) })
		},
	}
	cmd.AddCommand(newBrokerRemoveCmd(c))
	return cmd
}

func newBrokerRemoveCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a broker's registration that nobody uses (admin role)",
		Long: `remove deletes a broker from the registry, for a bogus or abandoned
registration. It is refused while the broker holds a lease (its agent still
renews: stop the agent first), while a recovery job of it is pending or
running, and while it owns an opened stream (fail it over, or stop it
gracefully, first). Its streams, objects and past jobs stay; the id may
register again, with a new epoch.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("broker", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.RemoveBrokerResponse
			err := c.call(cmd.Context(), op{verb: "remove", kind: "broker", id: args[0]}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).RemoveBroker(ctx, &waldenv1.RemoveBrokerRequest{BrokerId: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				fmt.Fprintf(w, "broker %s removed (it had epoch %d, state %s)\n", resp.GetBroker().GetBrokerId(), resp.GetBroker().GetEpoch(), resp.GetBroker().GetBrokerState().Name())
			})
		},
	}
}

func printBroker(w io.Writer, b *waldenv1.Broker) {
	fmt.Fprintf(w, "broker:\t%s\n", b.GetBrokerId())
	fmt.Fprintf(w, "state:\t%s\n", b.GetBrokerState().Name())
	fmt.Fprintf(w, "epoch:\t%d\n", b.GetEpoch())
	fmt.Fprintf(w, "fenced:\t%t\n", b.GetFenced())
	fmt.Fprintf(w, "maintenance:\t%t%s\n", b.GetMaintenance(), maintenanceText(b))
	fmt.Fprintf(w, "lease remaining:\t%s\n", leaseText(b.GetLeaseRemainingMs()))
	fmt.Fprintf(w, "agent:\t%s\n", orDash(b.GetAgentAddr()))
	fmt.Fprintf(w, "broker addr:\t%s\n", orDash(b.GetBrokerAddr()))
	fmt.Fprintf(w, "wal:\t%s %s\n", orDash(b.GetWal().GetVolumeId()), orDash(b.GetWal().GetPath()))
	if b.GetAutomq() != nil {
		fmt.Fprintf(w, "automq node:\t%s\n", automqText(b.GetAutomq()))
	}
	fmt.Fprintf(w, "registered:\t%s\n", unixText(b.GetRegisteredUnixMs()))
	fmt.Fprintf(w, "failed:\t%s\n", unixText(b.GetFailedUnixMs()))
	fmt.Fprintf(w, "recovered:\t%s\n", unixText(b.GetRecoveredUnixMs()))
	fmt.Fprintf(w, "failovers:\t%d\n", b.GetFailovers())
	fmt.Fprintf(w, "last job:\t%s\n", orDash(b.GetLastJobId()))
	fmt.Fprintf(w, "cooldown blocked:\t%t\n", b.GetCooldownBlocked())
	fmt.Fprintln(w)
	fmt.Fprintln(w, "OBSERVER\tSTATE\tSINCE\tREASON")
	for _, o := range b.GetObservations() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", o.GetObserverId(), o.GetObservationState().Name(), unixText(o.GetSinceUnixMs()), orDash(o.GetReason()))
	}
}

func newFailoverCmd(c *cli) *cobra.Command {
	var reason string
	var dryRun bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "failover BROKER --reason TEXT [--dry-run] | failover show ID",
		Short: "Fail a broker over now: skips the timeouts and policy gates, never the fencing nor its lease (--dry-run: what it would do, changing nothing; failover show ID: one failover's timeline)",
		Long: `Fail a broker over now. The coordinators stop renewing its lease at once; the broker is
fenced, and its recovery starts, once a majority of them attest that the lease they granted
ran out (at most lease_ttl + drift_margin after its last renewal), so that a broker failed
over while alive stops acknowledging writes before its WAL is read. The command waits for
that (--wait); if the wait ends first, the request stands and the failover completes anyway.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("broker", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" && !dryRun {
				return usagef("failover: --reason is required: say why the broker is failed over (kept in the event log)")
			}
			req := &waldenv1.FailoverRequest{BrokerId: args[0], Reason: reason, Preview: dryRun}
			var resp *waldenv1.FailoverResponse
			err := c.callFor(cmd.Context(), op{verb: "fail over", kind: "broker", id: args[0], check: "waldenctl failover show " + args[0]}, false, max(wait, c.timeout), func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).Failover(ctx, req, opts...)
				return err
			})
			if err != nil {
				return err
			}
			if resp.GetPreview() && c.structured() {
				return c.printPreview(resp)
			}
			return c.print(resp, func(w io.Writer) {
				switch {
				case resp.GetPreview():
					printFailoverPreview(w, resp)
				case resp.GetDryRun():
					fmt.Fprintf(w, "dry run: broker %s would be fenced (recorded in the event log)\n", resp.GetBrokerId())
				default:
					fmt.Fprintf(w, "broker %s fenced after its lease ran out (%s): new epoch %d, recovery job %s\n", resp.GetBrokerId(),
						durationText(resp.GetLeaseWaitMs()), resp.GetNewEpoch(), resp.GetJobId())
				}
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the broker is failed over (kept in the event log; required unless --dry-run)")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the fencing (the broker's lease must run out first)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show the decision a failover would make now and the conditions of an automatic one that do not hold; change nothing")
	cmd.AddCommand(newFailoverShowCmd(c))
	return cmd
}

// printPreview prints a --dry-run's answer as JSON or YAML: dry_run says
// that nothing was changed (true), and policy_dry_run whether the policy's
// dry_run would only have recorded the decision (the response's dry_run,
// which read "dry_run: false" in a dry run's output).
func (c *cli) printPreview(r *waldenv1.FailoverResponse) error {
	b, err := waldenv1.MarshalJSON(r)
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	doc["policy_dry_run"], doc["dry_run"] = r.GetDryRun(), true
	out, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	return c.printJSONBytes(out)
}

func printFailoverPreview(w io.Writer, r *waldenv1.FailoverResponse) {
	fmt.Fprintf(w, "dry run: nothing changed. A failover of broker %s now would:\n", r.GetBrokerId())
	fmt.Fprintf(w, "  fence\tepoch %d (the broker must register again; the catalog refuses the old epoch)\n", r.GetEpoch())
	fmt.Fprintf(w, "  issue\tepoch %d and recovery job %s\n", r.GetNewEpoch(), r.GetJobId())
	fmt.Fprintf(w, "  recover on\t%s\n", orDash(r.GetAssigneeId()))
	if r.GetLeaseWaitMs() > 0 {
		fmt.Fprintf(w, "  wait\tat most %s for the broker's lease to run out on a majority of the coordinators before fencing it\n", durationText(r.GetLeaseWaitMs()))
	} else {
		fmt.Fprintf(w, "  wait\tnothing: a majority of the coordinators already attest its lease expired\n")
	}
	if r.GetDryRun() {
		fmt.Fprintf(w, "  but\tthe policy is dry_run: the decision would only be recorded\n")
	}
	var obs []string
	for _, o := range r.GetEvidence().GetObservations() {
		obs = append(obs, o.GetObserverId()+"="+o.GetObservationState().Name())
	}
	fmt.Fprintf(w, "  evidence\tobservations %s\n", orDash(strings.Join(obs, ", ")))
	fmt.Fprintln(w, "An automatic failover would wait, because:")
	for _, h := range r.GetHolds() {
		fmt.Fprintf(w, "  -\t%s\n", h)
	}
}

func newAckCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:               "ack ID",
		Short:             "Acknowledge a broker: clears its cooldown block so automatic failover applies again",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeIDs("broker", 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var resp *waldenv1.AckResponse
			err := c.call(cmd.Context(), op{verb: "acknowledge", kind: "broker", id: args[0]}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).Ack(ctx, &waldenv1.AckRequest{BrokerId: args[0]}, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				fmt.Fprintf(w, "broker %s acknowledged (state %s, epoch %d)\n", resp.GetBroker().GetBrokerId(), resp.GetBroker().GetBrokerState().Name(), resp.GetBroker().GetEpoch())
			})
		},
	}
}

func newMaintenanceCmd(c *cli) *cobra.Command {
	var reason string
	var ttl time.Duration
	var noTTL bool
	cmd := withMaintenanceFlags(&cobra.Command{
		Use:   "maintenance on|off BROKER [--reason TEXT] [--ttl 2h | --no-ttl]",
		Short: "Turn a broker's maintenance on (no automatic failover; --ttl ends it by itself) or off",
		Long: `maintenance on keeps automatic failover away from a broker (a manual failover still
works, with its fencing); maintenance off ends it. With --ttl (at most 168h) the leader
turns it off by itself once it has seen it on for that long, counted on its own clock:
a leader change restarts the count, so a maintenance may last longer than asked, never
shorter. Turning maintenance on again without --ttl keeps what is left of the ttl it had
(and says so); --ttl 0 or --no-ttl drops it.`,
		Args: cobra.ExactArgs(2),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) == 0 {
				return []cobra.Completion{"on", "off"}, cobra.ShellCompDirectiveNoFileComp
			}
			return c.completeIDs("broker", 1)(cmd, args, toComplete)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var on bool
			switch args[0] {
			case "on":
				on = true
			case "off":
				if ttl != 0 {
					return usagef("maintenance off: --ttl goes with maintenance on")
				}
			default:
				e := &callError{Message: fmt.Sprintf("maintenance: the first argument must be on or off, not %q", args[0]), Exit: exitUsage}
				if s := closest(args[0], []string{"on", "off"}); s != "" {
					e.Hint = "did you mean " + s + "?"
				}
				return e
			}
			if ttl < 0 {
				return usagef("--ttl: must not be negative, got %s", ttl)
			}
			ttlSet := cmd.Flags().Changed("ttl") || noTTL
			if noTTL && ttl != 0 {
				return usagef("maintenance on: --no-ttl and --ttl %s contradict each other", ttl)
			}
			if !on && noTTL {
				return usagef("maintenance off: --no-ttl goes with maintenance on")
			}
			req := &waldenv1.SetMaintenanceRequest{BrokerId: args[1], On: on, Reason: reason, TtlMs: ttl.Milliseconds(), TtlSet: ttlSet}
			var resp *waldenv1.SetMaintenanceResponse
			err := c.call(cmd.Context(), op{verb: "set maintenance of", kind: "broker", id: args[1]}, false, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				var err error
				resp, err = brokersClient(conn).SetMaintenance(ctx, req, opts...)
				return err
			})
			if err != nil {
				return err
			}
			return c.print(resp, func(w io.Writer) {
				b := resp.GetBroker()
				fmt.Fprintf(w, "broker %s maintenance %s (state %s)%s\n", b.GetBrokerId(), args[0], b.GetBrokerState().Name(), maintenanceText(b))
				if on && !ttlSet && b.GetMaintenanceUntilUnixMs() > 0 {
					fmt.Fprintln(w, "it keeps the ttl it had (--ttl 0 or --no-ttl drops it)")
				}
			})
		},
	}, &reason, &ttl)
	cmd.Flags().BoolVar(&noTTL, "no-ttl", false, "keep the maintenance until maintenance off, dropping a ttl it had (as --ttl 0)")
	return cmd
}

func withMaintenanceFlags(cmd *cobra.Command, reason *string, ttl *time.Duration) *cobra.Command {
	cmd.Flags().StringVar(reason, "reason", "", "why (kept in the event log, shown with the broker)")
	cmd.Flags().DurationVar(ttl, "ttl", 0, "end maintenance by itself after this long (at most 168h; the leader counts it, a leader change may lengthen it)")
	return cmd
}

// maintenanceText describes a broker's maintenance: ", until ... : reason".
func maintenanceText(b *waldenv1.Broker) string {
	if !b.GetMaintenance() {
		return ""
	}
	s := ""
	if b.GetMaintenanceUntilUnixMs() > 0 {
		s += ", until about " + msText(b.GetMaintenanceUntilUnixMs())
	}
	if b.GetMaintenanceReason() != "" {
		s += ": " + b.GetMaintenanceReason()
	}
	return s
}
