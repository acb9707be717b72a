package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/config"
	"walden/internal/testutil"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
)

// singleMember returns the config of a one-member cluster on free loopback
// ports.
func singleMember(t *testing.T) *config.Server {
	cfg := config.DefaultServerConfig()
	cfg.ClusterName, cfg.NodeID = "solo", "c1"
	cfg.DataDir = filepath.Join(t.TempDir(), "c1")
	cfg.Listen = config.Listen{Admin: "127.0.0.1:0", Raft: "127.0.0.1:0", HTTP: "127.0.0.1:0"}
	// The only member is never dialed: its own address is a placeholder.
	cfg.InitialCluster = []config.Member{{ID: "c1", Raft: "127.0.0.1:1", Admin: "127.0.0.1:2"}}
	cfg.Raft.TickInterval = 10 * time.Millisecond
	return cfg
}

// bindMembers binds the admin and raft listeners of the members ids on
// loopback: their addresses for initial_cluster, their listeners for New
// (WithListeners), so that no port is guessed.
func bindMembers(t testing.TB, ids ...string) ([]config.Member, map[string]Listeners) {
	t.Helper()
	var initial []config.Member
	listeners := map[string]Listeners{}
	for _, id := range ids {
		l := Listeners{Admin: testutil.Listen(t, "127.0.0.1"), Raft: testutil.Listen(t, "127.0.0.1")}
		listeners[id] = l
		initial = append(initial, config.Member{ID: id, Raft: l.Raft.Addr().String(), Admin: l.Admin.Addr().String()})
	}
	return initial, listeners
}

func startServer(t *testing.T, cfg *config.Server, opts ...Option) *Server {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return s
}

// waitServing waits until the member is ready (walden.v1.Cluster SERVING:
// it knows a leader and has caught up).
// startServing starts a member with cfg and returns it with a client
// connection to its admin listener, closed when the test ends, once the
// member serves.
func startServing(t *testing.T, cfg *config.Server) (*Server, *grpc.ClientConn) {
	t.Helper()
	s := startServer(t, cfg)
	conn, err := grpc.NewClient(s.Addrs().Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	waitServing(t, conn)
	return s, conn
}

func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: waldenv1.Cluster_ServiceDesc.ServiceName})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health: %v %v", r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// grantLease renews broker's lease at epoch with each of conns until every
// one grants it, as the broker's agent does before the broker acknowledges
// anything: an epoch no majority ever granted acknowledged nothing, and its
// failover reads no WAL.
func grantLease(t *testing.T, ctx context.Context, broker string, epoch uint64, conns ...*grpc.ClientConn) {
	t.Helper()
	for _, conn := range conns {
		deadline := time.Now().Add(testutil.Deadline(10 * time.Second))
		for {
			_, err := waldenv1.NewAgentClient(conn).RenewLease(ctx, &waldenv1.RenewLeaseRequest{BrokerId: broker, Epoch: epoch})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("renew %s epoch %d: %v", broker, epoch, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func TestServerSingleMember(t *testing.T) {
	cfg := singleMember(t)
	s := startServer(t, cfg)
	a := s.Addrs()
	conn, err := grpc.NewClient(a.Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	st, err := waldenv1.NewClusterClient(conn).Status(context.Background(), &waldenv1.StatusRequest{})
	if err != nil || st.GetLeaderId() != "c1" || st.GetClusterName() != "solo" || len(st.GetMembers()) != 1 {
		t.Fatalf("status %v %v", st, err)
	}
	resp, err := http.Get("http://" + a.HTTP + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get("http://" + a.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `walden_build_info{commit="`) {
		t.Fatalf("/metrics has no walden_build_info")
	}
}

func TestServerRefusesBadConfigBeforeDataDir(t *testing.T) {
	cfg := singleMember(t)
	cfg.Log.Level = "loud"
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "log.level") {
		t.Fatalf("got %v", err)
	}
	cfg = singleMember(t)
	cfg.TLS = config.TLS{CertFile: "/nonexistent/c.pem", KeyFile: "/nonexistent/k.pem", CAFile: "/nonexistent/ca.pem"}
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
		t.Fatalf("data_dir touched: %v", err)
	}
}

func TestServerMutualTLS(t *testing.T) {
	p := newTestPKI(t)
	cfg := singleMember(t)
	cfg.TLS = p.Member(t, "c1")
	s := startServer(t, cfg)
	a := s.Addrs()

	ts, err := loadTLS(p.Admin(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(a.Admin, grpc.WithTransportCredentials(ts.ClientCreds()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)

	// Clients without a certificate of the cluster's CA are refused on
	// every listener.
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(p.CA)
	pool.AppendCertsFromPEM(caPEM)
	other, err := tls.LoadX509KeyPair(p.OtherCert, p.OtherKey)
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]credentials.TransportCredentials{
		"plaintext":       insecure.NewCredentials(),
		"no client cert":  credentials.NewTLS(&tls.Config{RootCAs: pool}),
		"foreign CA cert": credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{other}}),
	}
	for name, creds := range refused {
		for _, addr := range []string{a.Admin, a.Raft} {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			c.Close()
			if status.Code(err) != codes.Unavailable {
				t.Errorf("%s to %s: got %v, want Unavailable (handshake refused)", name, addr, err)
			}
		}
	}

	// HTTP serves TLS and requires the client certificate too.
	good := &http.Client{Transport: &http.Transport{TLSClientConfig: ts.Current().Client}, Timeout: 2 * time.Second}
	resp, err := good.Get("https://" + a.HTTP + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("https with client cert: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 2 * time.Second}
	if resp, err := anon.Get("https://" + a.HTTP + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("https without client cert accepted")
	}
	if resp, err := http.Get("http://" + a.HTTP + "/healthz"); err == nil && resp.StatusCode == 200 {
		resp.Body.Close()
		t.Fatal("plain http accepted")
	}
}

// TestServerThreeMembersMutualTLS runs three members in one process with
// TLS on: raft traffic and the forwarding of LeaderTransfer go over mTLS.
func TestServerThreeMembersMutualTLS(t *testing.T) {
	p := newTestPKI(t)
	var cfgs []*config.Server
	initial, listeners := bindMembers(t, "c1", "c2", "c3")
	for _, m := range initial {
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "tls", m.ID
		cfg.DataDir = filepath.Join(t.TempDir(), m.ID)
		cfg.Listen = config.Listen{Admin: m.Admin, Raft: m.Raft}
		cfg.InitialCluster = initial
		cfg.TLS = p.Member(t, m.ID)
		cfg.Raft.TickInterval = 20 * time.Millisecond
		cfgs = append(cfgs, cfg)
	}
	for _, cfg := range cfgs {
		startServer(t, cfg, WithListeners(listeners[cfg.NodeID]))
	}
	ts, err := loadTLS(p.TLS(t, authz.Identity{Name: "alice", Role: authz.RoleOperator}))
	if err != nil {
		t.Fatal(err)
	}
	var clients []waldenv1.ClusterClient
	for _, m := range initial {
		conn, err := grpc.NewClient(m.Admin, grpc.WithTransportCredentials(ts.ClientCreds()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		waitServing(t, conn)
		clients = append(clients, waldenv1.NewClusterClient(conn))
	}
	st, err := clients[0].Status(context.Background(), &waldenv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Ask a follower to hand leadership to the other follower.
	var follower waldenv1.ClusterClient
	target := ""
	for i, m := range initial {
		if m.ID == st.GetLeaderId() {
			continue
		}
		if follower == nil {
			follower = clients[i]
		} else {
			target = m.ID
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := follower.LeaderTransfer(ctx, &waldenv1.LeaderTransferRequest{Id: target})
	if err != nil || resp.GetLeaderId() != target {
		t.Fatalf("transfer to %s via a follower: %v %v", target, resp, err)
	}
}

// TestServerJoinExistingCluster adds a fourth member through the admin API
// and starts it with initial_cluster_state: existing; it joins as a learner
// and is promoted to voter once caught up.
func TestServerJoinExistingCluster(t *testing.T) {
	initial, listeners := bindMembers(t, "c1", "c2", "c3")
	newCfg := func(m config.Member) *config.Server {
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "grow", m.ID
		cfg.DataDir = filepath.Join(t.TempDir(), m.ID)
		cfg.Listen = config.Listen{Admin: m.Admin, Raft: m.Raft}
		cfg.InitialCluster = initial
		cfg.Raft.TickInterval = 20 * time.Millisecond
		return cfg
	}
	for _, m := range initial {
		startServer(t, newCfg(m), WithListeners(listeners[m.ID]))
	}
	conn, err := grpc.NewClient(initial[0].Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	c := waldenv1.NewClusterClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	more, moreListeners := bindMembers(t, "c4")
	c4 := more[0]
	added, err := c.MemberAdd(ctx, &waldenv1.MemberAddRequest{Id: c4.ID, RaftAddr: c4.Raft, AdminAddr: c4.Admin})
	if err != nil || added.GetMember().GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER || len(added.GetMembers()) != 4 {
		t.Fatalf("member add: %v %v", added, err)
	}
	cfg := newCfg(c4)
	cfg.InitialClusterState = config.ClusterStateExisting
	cfg.InitialCluster = append(cfg.InitialCluster, c4) // its own entry is ignored when joining
	startServer(t, cfg, WithListeners(moreListeners["c4"]))

	deadline := time.Now().Add(10 * time.Second)
	for {
		ml, err := c.MemberList(ctx, &waldenv1.MemberListRequest{Linearizable: true})
		promoted := false
		for _, m := range ml.GetMembers() {
			if m.GetId() == "c4" && m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER {
				promoted = true
			}
		}
		if err == nil && promoted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("c4 not promoted: %v %v", ml, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn4, err := grpc.NewClient(c4.Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn4.Close()
	waitServing(t, conn4)
	st, err := waldenv1.NewClusterClient(conn4).Status(ctx, &waldenv1.StatusRequest{})
	if err != nil || len(st.GetMembers()) != 4 || st.GetLeaderId() == "" {
		t.Fatalf("c4 status %v %v", st, err)
	}
}

// TestServerReloadRotatesCertificates: after the files are replaced by
// those of a new CA, Reload makes new connections use them; a client of the
// old CA is refused from then on, and restartKeys names what else changed.
func TestServerReloadRotatesCertificates(t *testing.T) {
	first, second := newTestPKI(t), newTestPKI(t)
	// The member's files start as those of the first CA.
	dir := t.TempDir()
	files := config.TLS{CertFile: filepath.Join(dir, "c1.pem"), KeyFile: filepath.Join(dir, "c1-key.pem"), CAFile: filepath.Join(dir, "ca.pem")}
	install := func(p testPKI) {
		t.Helper()
		src := p.Member(t, "c1")
		for from, to := range map[string]string{src.CertFile: files.CertFile, src.KeyFile: files.KeyFile, src.CAFile: files.CAFile} {
			b, err := os.ReadFile(from)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(to, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(first)
	cfg := singleMember(t)
	cfg.TLS = files
	s := startServer(t, cfg)
	a := s.Addrs()
	oldCreds, err := loadTLS(first.Admin(t))
	if err != nil {
		t.Fatal(err)
	}
	newCreds, err := loadTLS(second.Admin(t))
	if err != nil {
		t.Fatal(err)
	}
	call := func(ts *tlsSetup) error {
		conn, err := grpc.NewClient(a.Admin, grpc.WithTransportCredentials(ts.ClientCreds()))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := call(oldCreds); err != nil {
		t.Fatal(err)
	}
	install(second)
	next := *cfg
	next.Raft.ElectionTicks++
	res, err := s.Reload(&next)
	if err != nil || !res.TLSReloaded || len(res.NeedRestart) != 1 || res.NeedRestart[0] != "raft" {
		t.Fatalf("Reload = %+v, %v", res, err)
	}
	if err := call(newCreds); err != nil {
		t.Fatalf("client of the new CA after the reload: %v", err)
	}
	if err := call(oldCreds); status.Code(err) != codes.Unavailable {
		t.Fatalf("client of the old CA after the reload: %v, want refused", err)
	}
	// Unusable files: refused, the new files stay in use.
	bad := next
	bad.TLS.CertFile = filepath.Join(dir, "missing.pem")
	if _, err := s.Reload(&bad); err == nil || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Fatalf("Reload(missing cert) = %v", err)
	}
	if err := call(newCreds); err != nil {
		t.Fatalf("after a refused reload: %v", err)
	}
	// Another member's certificate of the same CA: refused (the peers would
	// refuse this member's raft frames), the files in use stay.
	other := next
	other.TLS = second.Member(t, "c2")
	if _, err := s.Reload(&other); !errors.Is(err, mtls.ErrWrongIdentity) {
		t.Fatalf("Reload(c2's certificate) on c1 = %v, want ErrWrongIdentity", err)
	}
	if err := call(newCreds); err != nil {
		t.Fatalf("after a reload refused for its identity: %v", err)
	}
}
