package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/config"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/version"
)

// TestFollowerStatusShowsTheLeadersProgress: every member's status and
// member list, a follower's too, carry the leader's view of the members'
// replication (match index, whether each commits, progress_by naming the
// leader) and each member's version (announced on the raft transport);
// with the leader stopped, a follower's answer says the progress is
// unknown instead of showing zeros.
func TestFollowerStatusShowsTheLeadersProgress(t *testing.T) {
	initial, listeners := bindMembers(t, "c1", "c2", "c3")
	stop := map[string]context.CancelFunc{}
	for _, m := range initial {
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "progress", m.ID
		cfg.DataDir = filepath.Join(t.TempDir(), m.ID)
		cfg.Listen = config.Listen{Admin: m.Admin, Raft: m.Raft}
		cfg.InitialCluster = initial
		cfg.Raft.TickInterval = 20 * time.Millisecond
		s, err := New(cfg, slog.New(slog.DiscardHandler), WithListeners(listeners[m.ID]))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		var once sync.Once
		stop[m.ID] = func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stop[m.ID])
	}
	clients := map[string]waldenv1.ClusterClient{}
	for _, m := range initial {
		conn, err := grpc.NewClient(m.Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		waitServing(t, conn)
		clients[m.ID] = waldenv1.NewClusterClient(conn)
	}
	want := version.Get().Version
	var leader, follower string
	testutil.Eventually(t, 30*time.Second, "a follower's status with the leader's progress of every member", func() error {
		st, err := clients["c1"].Status(context.Background(), &waldenv1.StatusRequest{})
		if err != nil {
			return err
		}
		leader = st.GetLeaderId()
		follower = "c1"
		if leader == "c1" {
			follower = "c2"
			if st, err = clients[follower].Status(context.Background(), &waldenv1.StatusRequest{}); err != nil {
				return err
			}
		}
		if st.GetProgressBy() != leader || leader == "" {
			return fmt.Errorf("progress_by %q, leader %q", st.GetProgressBy(), leader)
		}
		for _, m := range st.GetMembers() {
			if m.GetMatchIndex() == 0 || !m.GetCommits() || m.GetVersion() != want {
				return fmt.Errorf("member %s as %s answers it: match %d, commits %v, version %q (want %q)", m.GetId(), follower,
					m.GetMatchIndex(), m.GetCommits(), m.GetVersion(), want)
			}
		}
		ml, err := clients[follower].MemberList(context.Background(), &waldenv1.MemberListRequest{})
		if err != nil || ml.GetProgressBy() != leader || ml.GetMembers()[0].GetMatchIndex() == 0 {
			return fmt.Errorf("member list of %s: %v %v", follower, ml, err)
		}
		return nil
	})
	// The leader gone, the follower cannot know the progress: it says so.
	stop[leader]()
	testutil.Eventually(t, 30*time.Second, "the follower's status without the old leader's progress", func() error {
		st, err := clients[follower].Status(context.Background(), &waldenv1.StatusRequest{})
		if err != nil {
			return err
		}
		if st.GetProgressBy() == leader {
			return fmt.Errorf("progress_by still %q", leader)
		}
		return nil
	})
}
