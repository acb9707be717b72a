package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"google.golang.org/grpc"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
	"walden/raftnode"
)

// benchClusterName is the cluster name of both benchmark clusters' data.
const benchClusterName = "raftcompare"

// waldenMember is one member of the walden cluster and what it runs on.
type waldenMember struct {
	id      string
	node    *raftnode.Node
	server  *grpc.Server
	storage *raftlog.DiskStorage
}

// waldenCluster is a 3-member walden cluster in this process: the raft
// storage of raftlog.Open (one fdatasync per Ready), the fsm state machine and the gRPC peer transport
// on 127.0.0.1, with raftnode's default timing (100 ms tick, 1 s election
// timeout, as etcd's).
type waldenCluster struct {
	members []*waldenMember
	leader  *raftnode.Node
}

// startWalden starts size members with data directories under dir and
// waits for a leader.
func startWalden(ctx context.Context, dir string, size int) (*waldenCluster, error) {
	quiet := slog.New(slog.DiscardHandler)
	ids := make([]string, size)
	listeners := make([]net.Listener, size)
	initial := make([]*waldenv1.MemberContext, size)
	closeListeners := func() {
		for _, l := range listeners {
			if l != nil {
				_ = l.Close()
			}
		}
	}
	for i := range size {
		ids[i] = fmt.Sprintf("w%d", i)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			closeListeners()
			return nil, fmt.Errorf("raftcompare: walden listener: %w", err)
		}
		listeners[i] = l
		initial[i] = &waldenv1.MemberContext{Id: ids[i], RaftAddr: l.Addr().String()}
	}

	c := &waldenCluster{}
	for i, id := range ids {
		st, err := raftlog.Open(filepath.Join(dir, id), benchClusterName, id, quiet)
		if err != nil {
			closeListeners()
			_ = c.Close()
			return nil, fmt.Errorf("raftcompare: walden member %s: %w", id, err)
		}
		tr := raftnode.NewGRPCTransport(raftnode.GRPCTransportConfig{ClusterName: benchClusterName, NodeID: id, Logger: quiet})
		srv := grpc.NewServer(raftnode.ServerOptions()...)
		tr.Register(srv)
		cfg := raftnode.DefaultConfig()
		cfg.ClusterName = benchClusterName
		cfg.NodeID = id
		cfg.InitialCluster = initial
		cfg.Logger = quiet
		n, err := raftnode.NewNode(cfg, fsm.New(benchClusterName), st, tr)
		if err != nil {
			_ = tr.Close()
			_ = st.Close()
			closeListeners()
			_ = c.Close()
			return nil, fmt.Errorf("raftcompare: walden member %s: %w", id, err)
		}
		go func(l net.Listener) { _ = srv.Serve(l) }(listeners[i])
		listeners[i] = nil // owned by srv from here on
		c.members = append(c.members, &waldenMember{id: id, node: n, server: srv, storage: st})
	}
	if err := c.FindLeader(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func (c *waldenCluster) Name() string { return "walden" }

// FindLeader waits until one member is the leader and all agree on it.
func (c *waldenCluster) FindLeader(ctx context.Context) error {
	err := waitFor(ctx, 30*time.Second, func() bool {
		var leader *waldenMember
		for _, m := range c.members {
			if m.node.IsLeader() {
				leader = m
			}
		}
		if leader == nil {
			return false
		}
		for _, m := range c.members {
			if m.node.LeaderID() != leader.id {
				return false
			}
		}
		c.leader = leader.node
		return true
	})
	if err != nil {
		return fmt.Errorf("%w: walden: %w", errNoLeader, err)
	}
	return nil
}

// Propose replicates a Noop carrying payload through the leader and returns
// once it is applied there.
func (c *waldenCluster) Propose(ctx context.Context, _ int, payload []byte) error {
	_, err := c.leader.Propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_Noop{Noop: &waldenv1.Noop{Payload: payload}}})
	return err
}

// Close stops every member (node and transport), its gRPC server and its
// storage.
func (c *waldenCluster) Close() error {
	var errs []error
	for _, m := range c.members {
		m.node.Stop()
	}
	for _, m := range c.members {
		m.server.Stop()
		if err := m.storage.Close(); err != nil {
			errs = append(errs, fmt.Errorf("raftcompare: close walden member %s: %w", m.id, err))
		}
	}
	return errors.Join(errs...)
}
