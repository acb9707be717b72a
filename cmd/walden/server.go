package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"walden/config"
	"walden/server"
)

func init() { rootCmd.AddCommand(newServerCmd()) }

func newServerCmd() *cobra.Command {
	var configPath string
	var forceNewCluster bool
	cmd := &cobra.Command{
		Use:   "server --config FILE",
		Short: "Run one coordinator member",
		Long: `server runs one member of a walden coordinator cluster: the raft node with its
log in data_dir, the gRPC admin API and the HTTP /metrics /healthz
/readyz endpoints, as described by the YAML file given with --config.

The configuration is checked strictly before anything else happens: an
unknown key, a wrong type, a missing required key or an invalid value stops
the process with FILE:LINE: KEY: reason, and data_dir is not touched.

Signals:
  SIGTERM, SIGINT  stop: a leader first hands leadership to the most
                   caught-up reachable voter, then the member stops serving.
  SIGHUP           read FILE again and apply log.level and the tls files
                   (certificate rotation) to the running member; other
                   changed keys are logged and take effect at the next
                   start. A file with a mistake changes nothing.

--force-new-cluster is the way out of a lost quorum when the other members
are gone for good: before it starts, this member's raft log is rewritten so
that it is the only voter, keeping everything it holds. What the lost
members committed beyond its log is lost: it says where its log ended, and
revokes every broker's epoch and moves the fencing token and every stream's
epoch past what its log issued, so that nothing they issued is issued again.
Choose the survivor with the highest applied index. Start the other members
again only with an empty data_dir, after 'waldenctl member add'
(docs/runbook.md). Running it on a member that is already alone changes
nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return errors.New("server: --config FILE is required")
			}
			cfg, err := config.LoadServer(configPath)
			if err != nil {
				return err
			}
			level := new(slog.LevelVar)
			logger := server.NewLevelLogger(cfg.Log, os.Stderr, level)
			if forceNewCluster {
				if err := server.ForceNewCluster(cfg, logger); err != nil {
					return err
				}
			}
			s, err := server.New(cfg, logger)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			go reloadOnHUP(ctx, hup, configPath, s, level, logger)
			return s.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "YAML configuration file (required)")
	cmd.Flags().BoolVar(&forceNewCluster, "force-new-cluster", false, "make this member the only voter before it starts (quorum lost for good; see docs/runbook.md)")
	return cmd
}

// reloadOnHUP applies the configuration file to the running member at every
// SIGHUP until ctx is done.
func reloadOnHUP(ctx context.Context, hup <-chan os.Signal, path string, s *server.Server, level *slog.LevelVar, logger *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		cfg, err := config.LoadServer(path)
		if err != nil {
			logger.Error("reload refused: the configuration file has a mistake; the running settings stay", "file", path, "err", err)
			continue
		}
		res, err := s.Reload(cfg)
		if err != nil {
			logger.Error("reload refused: the running settings stay", "file", path, "err", err)
			continue
		}
		level.Set(server.ParseLevel(cfg.Log.Level))
		// Confirmed at the level now in force (at least info), so that a
		// member running at warn or error says so too.
		logger.Log(ctx, max(slog.LevelInfo, level.Level()), "configuration reloaded", "file", path, "log_level", level.Level().String(), "tls_reloaded", res.TLSReloaded)
		if len(res.NeedRestart) > 0 {
			logger.Warn("changed settings take effect at the next start", "keys", res.NeedRestart)
		}
		if res.PolicyChanged {
			logger.Warn("the policy section changed: the file's policy only seeds a new cluster and never takes effect in this one; change the cluster's policy with waldenctl policy set (waldenctl policy get shows it and where this file differs)", "file", path)
		}
	}
}
