package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"walden/backup"
	"walden/config"
	"walden/server"
)

func init() { rootCmd.AddCommand(newSnapshotCmd()) }

func newSnapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Check a snapshot file (status) and restore a new cluster from it (restore)",
		Long: `snapshot works offline on a snapshot file saved with 'waldenctl snapshot save'.
Nothing here contacts a running member.`,
	}
	var output string
	status := &cobra.Command{
		Use:   "status FILE",
		Short: "Check a snapshot file and show what it holds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := backup.ReadFile(args[0])
			if err != nil {
				return err
			}
			h := s.Header
			if output == "json" {
				return printJSON(cmd, map[string]any{"file": args[0], "cluster_name": h.GetClusterName(), "index": h.GetIndex(),
					"term": h.GetTerm(), "node_id": h.GetNodeId(), "created_unix_ms": h.GetCreatedUnixMs(), "size": h.GetSize(),
					"sha256": hex.EncodeToString(s.SHA256[:]), "walden_version": h.GetWaldenVersion(), "brokers": h.GetBrokers(),
					"streams": h.GetStreams(), "objects": h.GetObjects(), "jobs": h.GetJobs()})
			}
			if output != "table" {
				return fmt.Errorf("--output: must be table or json, got %q", output)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "FILE\tCLUSTER\tINDEX\tTERM\tTAKEN ON\tTAKEN AT\tBYTES\tBROKERS\tSTREAMS\tOBJECTS\tJOBS")
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", args[0], h.GetClusterName(), h.GetIndex(), h.GetTerm(), h.GetNodeId(),
				time.UnixMilli(h.GetCreatedUnixMs()).UTC().Format(time.RFC3339), h.GetSize(), h.GetBrokers(), h.GetStreams(), h.GetObjects(), h.GetJobs())
			fmt.Fprintf(w, "\nSHA-256 %s\n", hex.EncodeToString(s.SHA256[:]))
			return w.Flush()
		},
	}
	status.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")

	var (
		configPath      string
		bump            uint64
		keepClusterName bool
	)
	restore := &cobra.Command{
		Use:   "restore FILE --config NEW.yaml",
		Short: "Write the data_dir of one member of a new cluster from a snapshot file",
		Long: `restore writes the data_dir named by NEW.yaml for its node_id: a new cluster
whose members are NEW.yaml's initial_cluster and whose state is the
snapshot's (brokers, catalog, jobs, policy overrides, events). Run it on every
member of the new cluster with that member's configuration and the same FILE,
then start the members as usual ('walden server --config NEW.yaml').

The new cluster gets an identity of its own: its cluster_name must differ
from the snapshot's (the name every raft peer and gossip member checks), so
that no member of the old cluster can ever talk to it; --keep-cluster-name
allows the old name once every old member is gone for good (then point the
agents at the new members, or keep their addresses). Every broker's epoch is
revoked (each registers again and uploads what its WAL holds beyond the
restored catalog) and the next fencing token is moved --bump-epoch past the
snapshot's, so that no token the old cluster issued after the snapshot is
issued again.

Before any broker registers or any stream opens, the restored cluster
reconciles its catalog with what the old cluster did after the snapshot:
the objects under the s3 prefix and the records in the brokers' WALs
(waldenctl restore status). So the configuration needs the old cluster's
s3 section (bucket and prefix) and the recovery section that reaches the
brokers' WALs. After losing a quorum with one member's data intact, prefer
'walden server --force-new-cluster', which keeps everything that member's
log holds.

The file is verified first; the data_dir must be empty or absent. Nothing is
written when anything is refused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if configPath == "" {
				return errors.New("snapshot restore: --config NEW.yaml is required")
			}
			s, err := backup.ReadFile(args[0])
			if errors.Is(err, backup.ErrCorrupt) || errors.Is(err, backup.ErrNotSnapshot) {
				return fmt.Errorf("snapshot restore refused, nothing was written: %w: restore from another backup "+
					"(walden snapshot status FILE checks one)", err)
			}
			if err != nil {
				return err
			}
			cfg, err := config.LoadServer(configPath)
			if err != nil {
				return err
			}
			res, err := backup.Restore(s, cfg, backup.RestoreOptions{EpochBump: bump, KeepClusterName: keepClusterName,
				Logger: server.NewLogger(config.Log{Level: "warn"}, os.Stderr)})
			if err != nil {
				return fmt.Errorf("snapshot restore refused, nothing was written: %s", strings.TrimPrefix(err.Error(), "backup: restore: "))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s (cluster %q, index %d) into %s for member %s of cluster %q (members %v); "+
				"%d broker epochs revoked, %d recovery jobs of backup time cancelled, next epoch %d. Start it with: walden server --config %s\n",
				args[0], s.Header.GetClusterName(), res.Index, res.DataDir, res.NodeID, res.ClusterName, res.Members,
				res.BrokersFenced, res.JobsCancelled, res.NextEpoch, configPath)
			return nil
		},
	}
	restore.Flags().StringVar(&configPath, "config", "", "the new member's configuration file (required)")
	restore.Flags().Uint64Var(&bump, "bump-epoch", backup.DefaultEpochBump, "how far past the snapshot's next fencing token the new cluster starts issuing")
	restore.Flags().BoolVar(&keepClusterName, "keep-cluster-name", false, "allow the snapshot's cluster_name (only once every member of the old cluster is gone for good)")
	cmd.AddCommand(status, restore)
	return cmd
}
