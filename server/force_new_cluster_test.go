package server_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"walden/config"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
	"walden/server"
)

// statusOnly is a member that answers Status with a fixed applied index.
type statusOnly struct {
	waldenv1.UnimplementedClusterServer
	id      string
	applied uint64
}

func (s *statusOnly) Status(context.Context, *waldenv1.StatusRequest) (*waldenv1.StatusResponse, error) {
	return &waldenv1.StatusResponse{NodeId: s.id, AppliedIndex: s.applied, CommitIndex: s.applied}, nil
}

func serveStatus(t *testing.T, id string, applied uint64) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	waldenv1.RegisterClusterServer(s, &statusOnly{id: id, applied: applied})
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestForceNewClusterRefusals (issue 21, bad input): --force-new-cluster
// asks the other members first. A majority answering means the quorum is
// not lost; a member answering with a longer log means this data dir is not
// the newest. Both are refused and the data dir is left as it was.
func TestForceNewClusterRefusals(t *testing.T) {
	cfgWith := func(c2, c3 string) *config.Server {
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "fnc", "c1"
		cfg.DataDir = t.TempDir()
		cfg.Listen = config.Listen{Admin: "127.0.0.1:0", Raft: "127.0.0.1:0"}
		cfg.InitialCluster = []config.Member{{ID: "c1", Raft: "127.0.0.1:1", Admin: "127.0.0.1:2"},
			{ID: "c2", Raft: "127.0.0.1:3", Admin: c2}, {ID: "c3", Raft: "127.0.0.1:5", Admin: c3}}
		st, err := raftlog.Open(cfg.DataDir, cfg.ClusterName, cfg.NodeID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	unchanged := func(cfg *config.Server) {
		t.Helper()
		st, err := raftlog.Open(cfg.DataDir, cfg.ClusterName, cfg.NodeID, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if last, _ := st.LastIndex(); last != 0 {
			t.Fatalf("a refused --force-new-cluster wrote up to index %d", last)
		}
	}

	cfg := cfgWith(serveStatus(t, "c2", 0), serveStatus(t, "c3", 0))
	if err := server.ForceNewCluster(cfg, nil); !errors.Is(err, server.ErrQuorumNotLost) {
		t.Fatalf("two members answer: %v, want ErrQuorumNotLost", err)
	}
	unchanged(cfg)

	cfg = cfgWith(serveStatus(t, "c2", 57), closedAddr(t))
	err := server.ForceNewCluster(cfg, nil)
	if !errors.Is(err, server.ErrNotNewestDataDir) {
		t.Fatalf("c2 answers with index 57: %v, want ErrNotNewestDataDir", err)
	}
	for _, want := range []string{"member c2", "57", "force the new cluster on c2 instead"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("refusal %q does not say %q", err, want)
		}
	}
	unchanged(cfg)

	// Nobody answers: the check lets it through (here the empty log then
	// has no configuration to force).
	cfg = cfgWith(closedAddr(t), closedAddr(t))
	if err := server.ForceNewCluster(cfg, nil); err == nil || errors.Is(err, server.ErrQuorumNotLost) || errors.Is(err, server.ErrNotNewestDataDir) {
		t.Fatalf("nobody answers: %v", err)
	}
	_ = os.RemoveAll(cfg.DataDir)
}
