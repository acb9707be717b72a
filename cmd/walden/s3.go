package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"walden/objstore"
)

func init() { rootCmd.AddCommand(newS3Cmd()) }

// newS3Cmd builds `walden s3`, the embedded S3-compatible server.
func newS3Cmd() *cobra.Command {
	var (
		listen  string
		dir     string
		buckets []string
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "s3",
		Short: "Run an embedded S3-compatible server on a directory (development and tests)",
		Long: `Run an S3-compatible server (gofakes3 with its file-system backend) that keeps
buckets and objects under --dir, with the --bucket buckets created. It accepts
any credentials, does not verify request checksums and is meant for
development and tests, never production. Clients must use path-style
addressing (s3.path_style: true).

It listens on 127.0.0.1:9000 unless --listen says otherwise (port 0 picks a
free port); the endpoint is logged once listening. SIGTERM or SIGINT stops it,
letting requests in flight finish for up to 5 seconds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("s3: --dir DIR is required")
			}
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			if host, _, err := net.SplitHostPort(listen); err == nil {
				if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
					logger.Warn("listening beyond loopback: the embedded S3 server accepts any credentials", "listen", listen)
				}
			}
			srv, err := objstore.ServeFake(listen, dir, logger, buckets...)
			if err != nil {
				return fmt.Errorf("s3: %w", err)
			}
			logger.Info("embedded S3 server listening", "endpoint", srv.Endpoint, "dir", dir, "buckets", buckets)
			fmt.Fprintf(cmd.OutOrStdout(), "endpoint %s\n", srv.Endpoint)

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			logger.Info("stopping embedded S3 server")
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Close(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("s3: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:9000", "address to listen on (host:port; port 0 picks a free one)")
	cmd.Flags().StringVar(&dir, "dir", "", "directory holding the buckets and objects (required; created if missing)")
	cmd.Flags().StringSliceVar(&buckets, "bucket", []string{"walden"}, "bucket to create at start (repeat or comma-separate for several)")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "log every request the server handles at debug level")
	return cmd
}
