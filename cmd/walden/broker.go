package main

import (
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"walden/agent"
	"walden/broker"
	"walden/config"
	"walden/server"
)

func init() { rootCmd.AddCommand(newBrokerCmd()) }

func newBrokerCmd() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "broker --config FILE",
		Short: "Run the reference broker (WAL, S3 uploads, stream catalog, embedded agent)",
		Long: `broker runs walden's reference log broker. It embeds the lease agent
(registration, lease, gossip, GET /v1/lease on agent_listen), writes every
append to its WAL (AutoMQ's block WAL format) and acknowledges it only once
durable and while the lease is valid, uploads the WAL to S3 every
upload_interval or upload_bytes, commits the objects to the stream catalog and
trims the WAL.

Data API (gRPC walden.v1.BrokerAPI on listen):
  Append(stream_id, records) -> base_offset, count
  Read(stream_id, from_offset, max_records) -> records with offsets
  BrokerStatus() -> epoch, lease, streams
Refusals are FailedPrecondition/Unavailable with an ErrorInfo reason:
NOT_OWNER (metadata owner_addr), LEASE_INVALID, NODE_FENCED, NOT_READY,
SHUTTING_DOWN, WAL_FULL.

At start it uploads what its old WAL holds beyond the catalog's end offsets
of the streams it still owns, then opens its configured streams (and, with
takeover: true, CLOSED streams). SIGTERM or SIGINT uploads, commits, closes
its streams and leaves gossip; SIGKILL leaves the tail in the WAL for the
coordinators' recovery or the next start.

With mode: automq it is an AutoMQ 1.x broker instead (docs/broker.md): no
agent and no coordinators; its WAL header names its node id and node epoch
(its start time in ms); it registers the epoch, opens and commits through
AutoMQ's controller (automq.controller), uploads AutoMQ's objects under
AutoMQ's keys, and acknowledges an append once it is durable in its WAL,
without any lease, so that "walden agent" beside it, as a watchdog, is what
protects it. It leads the streams of the nodes in automq.takeover once they
stop answering, retrying STREAM_NOT_CLOSED until their failover closes them.
SIGUSR1 makes it upload what its WAL holds at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return errors.New("broker: --config FILE is required")
			}
			cfg, err := config.LoadBroker(configPath)
			if err != nil {
				return err
			}
			logger := server.NewLogger(cfg.Log, os.Stderr)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if cfg.IsAutomq() {
				b, err := broker.NewAutomq(cfg, broker.Options{Logger: logger})
				if err != nil {
					return err
				}
				// SIGUSR1 uploads what the WAL holds now, as the upload
				// timer would.
				usr1 := make(chan os.Signal, 1)
				signal.Notify(usr1, syscall.SIGUSR1)
				defer signal.Stop(usr1)
				go func() {
					for range usr1 {
						b.Upload()
					}
				}()
				return b.Run(ctx)
			}
			var b *broker.Broker
			metricsHandler, serverOpts, observeRenewal, listeners := brokerMetrics(cfg.BrokerID, func() *broker.Broker { return b })
			b, err = broker.New(cfg, broker.Options{Logger: logger, ServerOptions: serverOpts, ListenerMetrics: listeners,
				Agent: agent.Options{Metrics: metricsHandler, ObserveRenewal: observeRenewal, ListenerMetrics: listeners}})
			if err != nil {
				return err
			}
			return b.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "YAML configuration file (required)")
	return cmd
}
