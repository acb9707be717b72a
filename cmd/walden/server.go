package main

import (
	"errors"
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
	cmd := &cobra.Command{
		Use:   "server --config FILE",
		Short: "Run one coordinator member",
		Long: `server runs one member of a walden coordinator cluster: the raft node with its
bbolt log in data_dir, the gRPC admin API and the HTTP /metrics /healthz
/readyz endpoints, as described by the YAML file given with --config.

The configuration is checked strictly before anything else happens: an
unknown key, a wrong type, a missing required key or an invalid value stops
the process with FILE:LINE: KEY: reason, and data_dir is not touched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return errors.New("server: --config FILE is required")
			}
			cfg, err := config.LoadServer(configPath)
			if err != nil {
				return err
			}
			logger := server.NewLogger(cfg.Log, os.Stderr)
			s, err := server.New(cfg, logger)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return s.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "YAML configuration file (required)")
	return cmd
}
