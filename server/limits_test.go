package server

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"walden/authz"
	"walden/config"
	"walden/connlimit"
	"walden/internal/testutil"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
)

// TestListenersHoldAFlood is finding 2 of the hardening table: 2 × 10,500
// idle TCP connections to a coordinator's admin port, without any
// certificate, filled its file descriptors: waldenctl status and /readyz
// stopped answering and it logged "accept4: too many open files" (the raft
// and the brokers' data ports use the same kind of gRPC server). Each
// listener of a coordinator of a 3-member mutual-TLS cluster (admin and
// raft gRPC, http and metrics HTTP) now takes 20,000 idle connections from
// one source address, one listener after the other, while status (a new
// connection each time), /readyz, lease renewals with every member and
// raft entries keep working: beyond max_conns_per_source the source's
// connections are closed at once (counted), the ones it holds are cut after
// handshake_timeout (counted on the gRPC listeners), and the member never
// holds more than the bound.
func TestListenersHoldAFlood(t *testing.T) {
	const flood = 20_000
	testutil.SkipFloodUnderRace(t)
	p := newTestPKI(t)
	initial, listeners := bindMembers(t, "c1", "c2", "c3")
	const perSource = 64
	handshake := 2 * time.Second
	servers := map[string]*Server{}
	for _, m := range initial {
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "flood", m.ID
		cfg.DataDir = filepath.Join(t.TempDir(), m.ID)
		cfg.Listen = config.Listen{Admin: m.Admin, Raft: m.Raft}
		if m.ID == "c1" {
			cfg.Listen.HTTP, cfg.Listen.Metrics = "127.0.0.1:0", "127.0.0.1:0"
		}
		cfg.InitialCluster = initial
		cfg.TLS = p.Member(t, m.ID)
		cfg.Raft.TickInterval = 20 * time.Millisecond
		for _, g := range []*connlimit.GRPC{&cfg.Limits.Admin, &cfg.Limits.Raft} {
			g.MaxConnsPerSource, g.HandshakeTimeout = perSource, handshake
		}
		for _, h := range []*struct{ per *int }{{&cfg.Limits.HTTP.MaxConnsPerSource}, {&cfg.Limits.Metrics.MaxConnsPerSource}} {
			*h.per = perSource
		}
		cfg.Limits.HTTP.ReadHeaderTimeout, cfg.Limits.Metrics.ReadHeaderTimeout = handshake, handshake
		servers[m.ID] = startServer(t, cfg, WithListeners(listeners[m.ID]))
	}
	c1 := servers["c1"]
	dial := func(id authz.Identity, addr string) *grpc.ClientConn {
		creds, err := mtls.ClientCreds(p.TLS(t, id))
		if err != nil {
			t.Fatal(err)
		}
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	alice := authz.Identity{Name: "alice", Role: authz.RoleOperator}
	agent := authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"}
	waitServing(t, dial(alice, c1.Addrs().Admin))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var epoch uint64
	testutil.Eventually(t, 30*time.Second, "b1 registered", func() error {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		r, err := waldenv1.NewAgentClient(dial(agent, c1.Addrs().Admin)).Register(cctx, &waldenv1.RegisterRequest{ClusterName: "flood", BrokerId: "b1",
			AgentAddr: "127.0.0.1:1", Wal: &waldenv1.WalLocation{Path: "/wal/b1"}})
		if err == nil {
			epoch = r.GetEpoch()
		}
		return err
	})
	renewers := map[string]waldenv1.AgentClient{}
	for _, m := range initial {
		renewers[m.ID] = waldenv1.NewAgentClient(dial(agent, m.Admin))
	}
	// A member grants nothing for a lease after it starts.
	for id, r := range renewers {
		testutil.Eventually(t, 30*time.Second, "a renewal granted by "+id, func() error {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			defer ccancel()
			_, err := r.RenewLease(cctx, &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: epoch})
			return err
		})
	}
	operator := waldenv1.NewBrokersClient(dial(alice, c1.Addrs().Admin))
	readerTLS, err := mtls.Load(p.TLS(t, authz.Identity{Name: "grafana", Role: authz.RoleReader}))
	if err != nil {
		t.Fatal(err)
	}
	aliceCreds, err := mtls.ClientCreds(p.TLS(t, alice))
	if err != nil {
		t.Fatal(err)
	}

	// The cluster's work, every 200 ms, on connections made before the
	// flood (renewals, raft entries through the operator's) and on new
	// ones (status, /readyz over TLS and plain).
	var mu sync.Mutex
	failures := map[string][]string{}
	var rounds atomic.Int64
	fail := func(what string, err error) {
		mu.Lock()
		failures[what] = append(failures[what], err.Error())
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		on := false
		https := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: readerTLS.Client, DisableKeepAlives: true}}
		plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			if conn, err := grpc.NewClient(c1.Addrs().Admin, grpc.WithTransportCredentials(aliceCreds)); err != nil {
				fail("status", err)
			} else {
				if _, err := waldenv1.NewClusterClient(conn).Status(cctx, &waldenv1.StatusRequest{}); err != nil {
					fail("status", err)
				}
				conn.Close()
			}
			for id, r := range renewers {
				if _, err := r.RenewLease(cctx, &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: epoch}); err != nil {
					fail("renewal with "+id, err)
				}
			}
			on = !on
			if _, err := operator.SetMaintenance(cctx, &waldenv1.SetMaintenanceRequest{BrokerId: "b1", On: on, Reason: "flood test"}); err != nil {
				fail("raft entry", err)
			}
			ccancel()
			for name, get := range map[string]func() (*http.Response, error){
				"/readyz (https)": func() (*http.Response, error) { return https.Get("https://" + c1.Addrs().HTTP + "/readyz") },
				"/readyz (plain)": func() (*http.Response, error) { return plain.Get("http://" + c1.Addrs().Metrics + "/readyz") },
			} {
				resp, err := get()
				if err != nil {
					fail(name, err)
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					fail(name, fmt.Errorf("status %d", resp.StatusCode))
				}
			}
			rounds.Add(1)
		}
	}()

	lm := c1.listeners
	type flooded struct {
		name, addr, src string
		tls             bool // a gRPC listener counts its handshakes
		f               *testutil.Flood
	}
	targets := []*flooded{
		{name: connlimit.Admin, addr: c1.Addrs().Admin, tls: true},
		{name: connlimit.Raft, addr: c1.Addrs().Raft, tls: true},
		{name: "http", addr: c1.Addrs().HTTP},
		{name: "metrics", addr: c1.Addrs().Metrics},
	}
	timeoutsBefore := map[string]float64{}
	for i, l := range targets {
		l.src = fmt.Sprintf("127.0.0.%d", 2+i)
		timeoutsBefore[l.name] = lm.HandshakeFailures(l.name, "timeout")
	}
	// One flood after the other, each from its own source address.
	roundsBefore := rounds.Load()
	for _, l := range targets {
		var err error
		l.f, err = testutil.StartFlood(l.addr, l.src, flood, time.Minute)
		t.Cleanup(l.f.Close)
		if err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
		if l.f.Held < flood*9/10 {
			t.Fatalf("%s: only %d of %d connections opened (%d failed)", l.name, l.f.Held, flood, l.f.Failed)
		}
		// Every connection of the source beyond the bound is refused at
		// once (the ones it holds are cut after the handshake timeout,
		// and then as many more are accepted); the member holds at most
		// perSource of them.
		testutil.Eventually(t, 30*time.Second, l.name+": the flood refused", func() error {
			refused, accepted := lm.Refused(l.name, "max_conns_per_source"), lm.Accepted(l.name)
			if refused+accepted < float64(l.f.Held) || accepted > refused/4 {
				return fmt.Errorf("%v refused and %v accepted of %d", refused, accepted, l.f.Held)
			}
			return nil
		})
		if open := lm.Open(l.name); open > perSource+16 {
			t.Fatalf("%s: %v connections open under the flood, bound %d (+ the test's own)", l.name, open, perSource)
		}
		// The ones held are cut after the handshake timeout.
		if l.tls {
			testutil.Eventually(t, 30*time.Second, l.name+": idle handshakes cut", func() error {
				if got := lm.HandshakeFailures(l.name, "timeout") - timeoutsBefore[l.name]; got < perSource {
					return fmt.Errorf("%v handshake timeouts", got)
				}
				return nil
			})
		}
		t.Logf("%s: %d idle connections from %s opened in %s: %v refused at once, %v accepted, %v open, %v idle handshakes cut",
			l.name, l.f.Held, l.src, l.f.Took.Round(time.Millisecond), lm.Refused(l.name, "max_conns_per_source"), lm.Accepted(l.name),
			lm.Open(l.name), lm.HandshakeFailures(l.name, "timeout")-timeoutsBefore[l.name])
		l.f.Close()
	}
	// The cluster worked meanwhile.
	testutil.Eventually(t, 30*time.Second, "work done under the floods", func() error {
		if rounds.Load() < roundsBefore+10 {
			return fmt.Errorf("%d rounds", rounds.Load()-roundsBefore)
		}
		return nil
	})
	t.Logf("%d rounds of work (status, /readyz twice, a renewal with each member, a raft entry) under the floods", rounds.Load()-roundsBefore)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for what, errs := range failures {
		t.Errorf("%s failed %d times under the floods, first: %s", what, len(errs), errs[0])
	}
}
