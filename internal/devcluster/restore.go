package devcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	"walden/authz"
	"walden/backup"
	waldenv1 "walden/proto/walden/v1"
)

// SaveSnapshot saves the leader's snapshot of the replicated state to file,
// as waldenctl snapshot save does, and returns it read back.
func (c *Cluster) SaveSnapshot(ctx context.Context, file string) (*backup.Snapshot, error) {
	var (
		h    *waldenv1.SnapshotHeader
		data bytes.Buffer
		sum  []byte
	)
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		h, sum = nil, nil
		data.Reset()
		stream, err := waldenv1.NewMaintenanceClient(cc).Snapshot(ctx, &waldenv1.SnapshotRequest{})
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
		return nil, fmt.Errorf("devcluster: snapshot: %w", err)
	}
	if got := sha256.Sum256(data.Bytes()); h == nil || !bytes.Equal(got[:], sum) {
		return nil, fmt.Errorf("devcluster: snapshot: incomplete or damaged answer")
	}
	if _, err := backup.WriteFile(file, h, data.Bytes()); err != nil {
		return nil, err
	}
	return backup.ReadFile(file)
}

// RestoreInto makes the cluster a new one named name, restored from the
// backup file, as docs/runbook.md says: every coordinator's data directory
// is moved aside (to DATA.lost-N), every config file written again under
// the new name, and `walden snapshot restore FILE --config CFG` run for
// each coordinator. The processes must be stopped; start them afterwards
// (coordinators, then brokers). It returns each restore's output.
func (c *Cluster) RestoreInto(ctx context.Context, file, name string) ([]string, error) {
	for _, p := range append(append([]*Proc{}, c.Coords...), c.Brokers...) {
		if p.Alive() {
			return nil, fmt.Errorf("devcluster: restore: %s still runs", p.Name)
		}
	}
	c.Opts.ClusterName = name
	for _, m := range c.Coords {
		dir := filepath.Join(c.Opts.Dir, m.Name)
		if _, err := os.Stat(dir); err == nil {
			if err := os.Rename(dir, fmt.Sprintf("%s.lost-%d", dir, time.Now().UnixNano())); err != nil {
				return nil, fmt.Errorf("devcluster: restore: %w", err)
			}
		}
	}
	if err := c.writeConfigs(); err != nil {
		return nil, err
	}
	var outs []string
	for _, m := range c.Coords {
		cmd := exec.CommandContext(ctx, c.Opts.Bin, "snapshot", "restore", file, "--config", m.Config)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return outs, fmt.Errorf("devcluster: walden snapshot restore for %s: %w: %s", m.Name, err, strings.TrimSpace(string(out)))
		}
		outs = append(outs, strings.TrimSpace(string(out)))
	}
	return outs, nil
}

// RestoreState is the reconciliation of a restored cluster as the first
// answering coordinator applied it (nil when not restored).
func (c *Cluster) RestoreState(ctx context.Context) (*waldenv1.RestoreState, error) {
	var st *waldenv1.StatusResponse
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		var err error
		st, err = waldenv1.NewClusterClient(cc).Status(ctx, &waldenv1.StatusRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	return st.GetRestore(), nil
}

// WaitReconciled waits until a restored cluster's reconciliation is done,
// calling say at every change of its phase.
func (c *Cluster) WaitReconciled(ctx context.Context, timeout time.Duration, say func(string)) (*waldenv1.RestoreState, error) {
	var rs *waldenv1.RestoreState
	last := ""
	err := Poll(ctx, timeout, "the restored cluster reconciled", func() error {
		var err error
		if rs, err = c.RestoreState(ctx); err != nil {
			return err
		}
		if rs == nil {
			return Permanent(errors.New("the cluster was not restored"))
		}
		if p := rs.GetRestorePhase().Name(); p != last && say != nil {
			last = p
			say("restore: phase " + p)
		}
		if rs.GetRestorePhase() != waldenv1.RestorePhase_RESTORE_PHASE_DONE {
			return fmt.Errorf("phase %s", rs.GetRestorePhase().Name())
		}
		return nil
	})
	return rs, err
}

// ReplaceCoordinator lays out coordinator name in place of old, on old's
// addresses (and network namespace), as `waldenctl member replace old
// --name name --raft ... --admin ...` expects the operator to: a
// certificate of its own, an empty data directory and a config with
// initial_cluster_state: existing. Every config file is written again with
// the new membership. old must be stopped; remove old and add name to the
// cluster, then start the returned Proc.
func (c *Cluster) ReplaceCoordinator(old, name string) (*Proc, error) {
	i := -1
	for k, m := range c.Coords {
		switch m.Name {
		case old:
			i = k
		case name:
			return nil, fmt.Errorf("%w: a coordinator %s exists", ErrInvalid, name)
		}
	}
	if i < 0 {
		return nil, fmt.Errorf("%w: no coordinator %s", ErrInvalid, old)
	}
	o := c.Coords[i]
	if o.Alive() {
		return nil, fmt.Errorf("devcluster: replace %s: it still runs", old)
	}
	host := o.host
	if host == "" {
		host = o.Name
	}
	p := &Proc{Name: name, host: host, bin: o.bin, command: o.command, Admin: o.Admin, Raft: o.Raft, Gossip: o.Gossip, HTTP: o.HTTP, Metrics: o.Metrics}
	if c.PKI != "" {
		id := authz.Identity{Name: name, Role: authz.RoleCoordinator}
		if _, err := c.issue(id, hostOf(p.Admin), hostOf(p.Raft), hostOf(p.HTTP)); err != nil {
			return nil, err
		}
	}
	c.Coords[i] = p
	if err := c.writeConfigs(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p.Config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, werr := f.WriteString("initial_cluster_state: existing\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return p, werr
}
