package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/config"
	waldenv1 "walden/proto/walden/v1"
)

// BenchmarkRenewLease measures what one lease renewal costs a coordinator:
// the handler alone (the grant: the state read and the grantor) and the
// whole call through gRPC on a persistent connection (interceptors,
// framing, and the client's side, in the same process), with allocations
// per renewal. The grant's cost does not depend on the number of brokers
// (map lookups); a few brokers keep the probes and decisions running
// meanwhile from counting much in the figures.
//
//	go test ./server -run '^$' -bench BenchmarkRenewLease -benchmem
func BenchmarkRenewLease(b *testing.B) {
	const brokers = 10
	cfg := config.DefaultServerConfig()
	cfg.ClusterName, cfg.NodeID = "det", "c1"
	cfg.DataDir = filepath.Join(b.TempDir(), "c1")
	initial, listeners := bindMembers(b, "c1")
	cfg.Listen = config.Listen{Admin: initial[0].Admin, Raft: initial[0].Raft}
	cfg.InitialCluster = initial
	cfg.Raft.TickInterval = 20 * time.Millisecond
	// Long leases: the brokers renew only while the benchmark runs.
	cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = 30*time.Second, 10*time.Second, time.Second
	s := startServerTB(b, cfg, WithListeners(listeners["c1"]))
	// Every agent address answers the probes.
	probed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer probed.Close()
	conn, err := grpc.NewClient(cfg.Listen.Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	waitServingTB(b, conn)
	ag := waldenv1.NewAgentClient(conn)
	ctx := context.Background()
	epochs := make([]uint64, brokers)
	for i := range brokers {
		r, err := ag.Register(ctx, &waldenv1.RegisterRequest{ClusterName: "det", BrokerId: fmt.Sprintf("b%04d", i), AgentAddr: probed.Listener.Addr().String()})
		if err != nil {
			b.Fatal(err)
		}
		epochs[i] = r.GetEpoch()
	}
	req := func(i int) *waldenv1.RenewLeaseRequest {
		return &waldenv1.RenewLeaseRequest{BrokerId: fmt.Sprintf("b%04d", i%brokers), Epoch: epochs[i%brokers]}
	}
	reqs := make([]*waldenv1.RenewLeaseRequest, brokers)
	for i := range reqs {
		reqs[i] = req(i)
	}
	// Wait out the quiet period after the start, then renew every broker.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := ag.RenewLease(ctx, req(0)); err == nil {
			break
		} else if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, r := range reqs {
		if _, err := ag.RenewLease(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("handler", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := s.detector.agent.RenewLease(ctx, reqs[i%brokers]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("grpc", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := ag.RenewLease(ctx, reqs[i%brokers]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
