package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"walden/backup"
	waldenv1 "walden/proto/walden/v1"
)

func init() { commands = append(commands, newSnapshotCmd) }

// snapshotInfo is what save and status print.
type snapshotInfo struct {
	File          string `json:"file"`
	ClusterName   string `json:"cluster_name"`
	Index         uint64 `json:"index"`
	Term          uint64 `json:"term"`
	NodeID        string `json:"node_id"`
	CreatedUnixMs int64  `json:"created_unix_ms"`
	Size          uint64 `json:"size"`
	SHA256        string `json:"sha256"`
	WaldenVersion string `json:"walden_version"`
	Members       int    `json:"members"`
	Brokers       uint32 `json:"brokers"`
	Streams       uint32 `json:"streams"`
	Objects       uint32 `json:"objects"`
	Jobs          uint32 `json:"jobs"`
}

func infoOf(file string, s *backup.Snapshot) snapshotInfo {
	h := s.Header
	return snapshotInfo{File: file, ClusterName: h.GetClusterName(), Index: h.GetIndex(), Term: h.GetTerm(), NodeID: h.GetNodeId(),
		CreatedUnixMs: h.GetCreatedUnixMs(), Size: h.GetSize(), SHA256: hex.EncodeToString(s.SHA256[:]),
		WaldenVersion: h.GetWaldenVersion(), Members: len(h.GetMembers()), Brokers: h.GetBrokers(), Streams: h.GetStreams(),
		Objects: h.GetObjects(), Jobs: h.GetJobs()}
}

func (c *cli) printSnapshot(i snapshotInfo) error {
	return c.printValue(i, func(w io.Writer) {
		fmt.Fprintln(w, "FILE\tCLUSTER\tINDEX\tTERM\tTAKEN ON\tTAKEN AT\tBYTES\tBROKERS\tSTREAMS\tOBJECTS\tJOBS")
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", i.File, i.ClusterName, i.Index, i.Term, i.NodeID,
			time.UnixMilli(i.CreatedUnixMs).UTC().Format(time.RFC3339), i.Size, i.Brokers, i.Streams, i.Objects, i.Jobs)
		fmt.Fprintf(w, "\nSHA-256 %s\n", i.SHA256)
	})
}

func newSnapshotCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Back up the replicated state (save) and check a backup (status)",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "save FILE",
		Short: "Save a consistent snapshot of the replicated state from the leader",
		Long: `save asks the leader for a snapshot of the replicated state (brokers and their
epochs, the stream catalog, recovery jobs, the policy overrides and the event
log) as of a linearizable read, checks its SHA-256, and writes FILE with the
snapshot's index and a checksum of the whole file. FILE is written to
FILE.part and renamed once complete; an existing FILE is never overwritten.

It needs an admin identity. Restore a cluster from FILE with
'walden snapshot restore FILE --config NEW.yaml' on every new member
(docs/runbook.md).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				h    *waldenv1.SnapshotHeader
				data bytes.Buffer
				sum  []byte
			)
			err := c.call(cmd.Context(), op{verb: "save", kind: "snapshot"}, true, func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error {
				h, sum = nil, nil
				data.Reset()
				stream, err := waldenv1.NewMaintenanceClient(conn).Snapshot(ctx, &waldenv1.SnapshotRequest{}, opts...)
				if err != nil {
					return err
				}
				for {
					chunk, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						return nil
					}
					if err != nil {
						return err
					}
					switch p := chunk.GetPart().(type) {
					case *waldenv1.SnapshotChunk_Header:
						h = p.Header
					case *waldenv1.SnapshotChunk_Data:
						data.Write(p.Data)
					case *waldenv1.SnapshotChunk_Sha256:
						sum = p.Sha256
					}
				}
			})
			if err != nil {
				return err
			}
			got := sha256.Sum256(data.Bytes())
			switch {
			case h == nil || sum == nil:
				return errors.New("the leader's answer was incomplete (no header or no checksum); nothing was written")
			case !bytes.Equal(got[:], sum):
				return errors.New("the snapshot received does not match the leader's SHA-256; nothing was written")
			case h.GetSize() != uint64(data.Len()):
				return fmt.Errorf("received %d bytes, the leader announced %d; nothing was written", data.Len(), h.GetSize())
			}
			if _, err := backup.WriteFile(args[0], h, data.Bytes()); err != nil {
				return err
			}
			s, err := backup.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("the file written does not read back: %w", err)
			}
			return c.printSnapshot(infoOf(args[0], s))
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "status FILE",
		Short: "Check a snapshot file and show what it holds",
		Long: `status reads FILE, checks its checksum and format, and shows the cluster,
index, term, size and contents it holds. It contacts no member; it fails on a
damaged or foreign file.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := backup.ReadFile(args[0])
			if err != nil {
				return err
			}
			return c.printSnapshot(infoOf(args[0], s))
		},
	})
	return cmd
}
