package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"walden/agent"
	"walden/authz"
	"walden/config"
	"walden/connlimit"
	"walden/metrics"
	"walden/mtls"
	"walden/server"
)

func init() { rootCmd.AddCommand(newAgentCmd()) }

// newAgentWatchdogCmd is the watchdog process the agent starts beside a
// broker that does not check its lease: it reads the agent's deadlines on
// stdin, kills the broker when one passes, and gives the broker it starts
// fds 3 and 4 as stdout and stderr. Not for people: the agent runs it.
func newAgentWatchdogCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "watchdog",
		Short:  "The agent's watchdog process (started by the agent, not by people)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return agent.RunWatchdog(os.Stdin, os.Stdout, os.NewFile(3, "broker-stdout"), os.NewFile(4, "broker-stderr"))
		},
	}
}

func newAgentCmd() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "agent --config FILE",
		Short: "Run the lease agent beside one broker",
		Long: `agent runs beside one storage broker (any language). It registers the broker
with the coordinators (the answer is the broker's epoch, its fencing token),
renews the broker's lease every lease_ttl/3, joins the gossip pool so that the
coordinators see it, and answers the broker on the local HTTP endpoint:

  GET /v1/lease         {"broker_id","epoch","valid","remaining_ms","fenced"}
  GET /v1/registration  {"broker_id","registered","epoch","recovered_wal_offset"}
  GET /v1/broker        {"state","pid","reason","watchdog_armed","kill_in_ms",...}
  GET /healthz          200 ok while the agent runs, 503 when its watched
                        broker is down (the coordinators probe it)
  GET /metrics          Prometheus series: the lease as the agent sees it

The broker acknowledges a write only while valid is true, with the epoch the
endpoint returned. valid turns false before the cluster could declare the
broker failed (self-fencing on the monotonic clock). After fenced:true the
agent registers again and the epoch changes: re-read it before writing.

With a broker section the agent watches the broker (starting it as its child
with broker.command, or finding it by broker.pid_file; broker.kafka_addr and
broker.health_command check it) and stops renewing its lease when it dies.
With watchdog.enabled — for a broker that never asks for its lease, such as
AutoMQ — a separate watchdog process kills the broker's process group
watchdog.kill_margin before the lease runs out (docs/agent.md).

The configuration is checked strictly first: an unknown key, a wrong type, a
missing required key or an invalid value stops the process with
FILE:LINE: KEY: reason. SIGTERM or SIGINT leaves the gossip pool and exits.
SIGHUP reads FILE again and applies log.level and the tls files (certificate
rotation) to new connections, without registering again; other changed keys
take effect at the next start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return errors.New("agent: --config FILE is required")
			}
			cfg, err := config.LoadAgent(configPath)
			if err != nil {
				return err
			}
			level := new(slog.LevelVar)
			logger := server.NewLevelLogger(cfg.Log, os.Stderr, level)
			// The certificates are read again at SIGHUP: the agent's
			// connections to the coordinators use the files of the last
			// successful load (these credentials replace the agent's own).
			files, err := mtls.LoadFiles(cfg.TLS)
			if err != nil {
				return fmt.Errorf("%w: %w", agent.ErrInvalidConfig, err)
			}
			reg := processRegistry()
			var a *agent.Agent
			reg.MustRegister(metrics.NewAgentCollector(cfg.BrokerID, agentLease(func() *agent.Agent { return a })))
			renewals := metrics.NewAgentRenewals(cfg.BrokerID)
			reg.MustRegister(renewals.Collectors()...)
			listeners := connlimit.NewMetrics()
			reg.MustRegister(listeners.Collectors()...)
			opts := agent.Options{Logger: logger, Metrics: handler(reg), ObserveRenewal: renewals.Renewal, ListenerMetrics: listeners,
				DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(files.ClientCreds())},
				TLS:         func() *tls.Config { return files.Current().Client }}
			if cfg.Broker.Watched() || cfg.Watchdog.Enabled {
				opts.BrokerObserver = newAgentBrokerMetrics(reg, cfg.BrokerID)
			}
			a, err = agent.New(cfg, opts)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-hup:
					}
					next, err := config.LoadAgent(configPath)
					if err != nil {
						logger.Error("reload refused: the configuration file has a mistake; the running settings stay", "file", configPath, "err", err)
						continue
					}
					if err := reloadAgentTLS(files, cfg.BrokerID, next.TLS); err != nil {
						logger.Error("reload refused: the running settings stay", "file", configPath, "err", err)
						continue
					}
					level.Set(server.ParseLevel(next.Log.Level))
					logger.Info("configuration reloaded", "file", configPath, "log_level", level.Level().String(), "tls_reloaded", files.Enabled())
				}
			}()
			return a.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "YAML configuration file (required)")
	cmd.AddCommand(newAgentWatchdogCmd())
	return cmd
}

// reloadAgentTLS reads the tls files of a reloaded configuration for the
// agent of broker brokerID. The certificate must stay that agent's own (the
// coordinators would refuse anyone else's renewals); on any error the files
// in use stay.
func reloadAgentTLS(files *mtls.Files, brokerID string, next config.TLS) error {
	if err := mtls.CheckIdentity(next, authz.Identity{Role: authz.RoleAgent, BrokerID: brokerID}); err != nil {
		return err
	}
	return files.ReloadFiles(next)
}
