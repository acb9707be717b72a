package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	b.Run("stream", func(b *testing.B) {
		st, err := ag.RenewLeases(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer st.CloseSend()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r := reqs[i%brokers]
			if err := st.Send(&waldenv1.RenewLeasesRequest{BrokerId: r.GetBrokerId(), Epoch: r.GetEpoch(), Seq: uint64(i)}); err != nil {
				b.Fatal(err)
			}
			if a, err := st.Recv(); err != nil || a.GetGrant() == nil {
				b.Fatal(a, err)
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

// BenchmarkRenewalTransports measures the CPU a renewal costs, both sides
// together (the agents run in the benchmark's process), with many agents
// renewing at a steady pace as a fleet does: each of 200 agents has a
// connection of its own and renews every 200 ms (1,000 renewals a second
// in all), one call each (unary, the agents before streamed renewals) or
// over one stream each (stream). cpu-µs/renewal is the process's user and
// system time over the renewals; ns/op is the pace, not a cost.
//
//	go test ./server -run '^$' -bench BenchmarkRenewalTransports -benchtime 3000x
func BenchmarkRenewalTransports(b *testing.B) {
	const agents = 200
	const period = 200 * time.Millisecond
	cfg := config.DefaultServerConfig()
	cfg.ClusterName, cfg.NodeID = "det", "c1"
	cfg.DataDir = filepath.Join(b.TempDir(), "c1")
	initial, listeners := bindMembers(b, "c1")
	cfg.Listen = config.Listen{Admin: initial[0].Admin, Raft: initial[0].Raft}
	cfg.InitialCluster = initial
	cfg.Raft.TickInterval = 20 * time.Millisecond
	cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = 30*time.Second, 10*time.Second, time.Second
	startServerTB(b, cfg, WithListeners(listeners["c1"]))
	probed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer probed.Close()
	conns := make([]*grpc.ClientConn, agents)
	for i := range conns {
		conn, err := grpc.NewClient(cfg.Listen.Admin, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	waitServingTB(b, conns[0])
	ctx := context.Background()
	reqs := make([]*waldenv1.RenewLeaseRequest, agents)
	for i := range agents {
		id := fmt.Sprintf("b%04d", i)
		r, err := waldenv1.NewAgentClient(conns[i]).Register(ctx, &waldenv1.RegisterRequest{ClusterName: "det", BrokerId: id, AgentAddr: probed.Listener.Addr().String()})
		if err != nil {
			b.Fatal(err)
		}
		reqs[i] = &waldenv1.RenewLeaseRequest{BrokerId: id, Epoch: r.GetEpoch()}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := waldenv1.NewAgentClient(conns[0]).RenewLease(ctx, reqs[0]); err == nil {
			break
		} else if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// run makes every agent renew with renew(i) every period, b.N renewals
	// in all, and reports the CPU per renewal.
	run := func(b *testing.B, renew func(i int) error) {
		per := (b.N + agents - 1) / agents
		var wg sync.WaitGroup
		errs := make(chan error, agents)
		cpu0, r0, w0 := processCPU(), syscalls("syscr"), syscalls("syscw")
		b.ResetTimer()
		for i := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Spread the agents over the period, as a fleet is.
				time.Sleep(period * time.Duration(i) / agents)
				t := time.NewTicker(period)
				defer t.Stop()
				for range per {
					if err := renew(i); err != nil {
						errs <- err
						return
					}
					<-t.C
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		cpu, reads, writes := processCPU()-cpu0, syscalls("syscr")-r0, syscalls("syscw")-w0
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		b.ReportMetric(float64(cpu.Microseconds())/float64(per*agents), "cpu-µs/renewal")
		b.ReportMetric(float64(reads)/float64(per*agents), "reads/renewal")
		b.ReportMetric(float64(writes)/float64(per*agents), "writes/renewal")
	}
	b.Run("unary", func(b *testing.B) {
		run(b, func(i int) error {
			_, err := waldenv1.NewAgentClient(conns[i]).RenewLease(ctx, reqs[i])
			return err
		})
	})
	b.Run("stream", func(b *testing.B) {
		streams := make([]waldenv1.Agent_RenewLeasesClient, agents)
		for i := range streams {
			st, err := waldenv1.NewAgentClient(conns[i]).RenewLeases(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer st.CloseSend()
			streams[i] = st
		}
		run(b, func(i int) error {
			if err := streams[i].Send(&waldenv1.RenewLeasesRequest{BrokerId: reqs[i].GetBrokerId(), Epoch: reqs[i].GetEpoch(), Seq: 1}); err != nil {
				return err
			}
			a, err := streams[i].Recv()
			if err == nil && a.GetGrant() == nil {
				err = fmt.Errorf("refused: %v", a.GetRefusal())
			}
			return err
		})
	})
}

// syscalls reads a count of /proc/self/io (syscr: read system calls,
// syscw: write system calls); 0 where there is none.
func syscalls(key string) int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+": "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// processCPU is the user and system time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
