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
coordinators' recovery or the next start.`,
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
			var b *broker.Broker
			metricsHandler, serverOpts, observeRenewal := brokerMetrics(cfg.BrokerID, func() *broker.Broker { return b })
			b, err = broker.New(cfg, broker.Options{Logger: logger, ServerOptions: serverOpts,
				Agent: agent.Options{Metrics: metricsHandler, ObserveRenewal: observeRenewal}})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return b.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "YAML configuration file (required)")
	return cmd
}
