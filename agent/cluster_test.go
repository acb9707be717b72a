package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/agent"
	"walden/config"
	"walden/gossip"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/server"
)

// TestAgentWithRealCluster runs the agent against three in-process
// coordinators: it registers through a follower (forwarded to the leader),
// renews, appears in the leader's broker table with its endpoint, and after a
// manual failover reports fenced:true and waits while the recovery job runs.
func TestAgentWithRealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-member cluster")
	}
	cl := startTestCluster(t, func(p *config.Policy) {
		p.LeaseTTL, p.DriftMargin, p.FailureTimeout = time.Second, 200*time.Millisecond, 3*time.Second
	})
	members, conns, gossipAddrs, leaderID := cl.members, cl.conns, cl.gossip, cl.leader
	// The agent knows only one follower.
	var follower string
	for _, m := range members {
		if m.id != leaderID {
			follower = m.admin
			break
		}
	}

	cfg := config.DefaultAgentConfig()
	cfg.BrokerID, cfg.ClusterName = "b1", "demo"
	cfg.Coordinators = []string{follower}
	cfg.Listen = "127.0.0.1:0"
	cfg.WAL = config.WALLocation{VolumeID: "vol-b1", Path: "/var/lib/broker/b1.wal"}
	cfg.LeaseSafetyMargin = 100 * time.Millisecond
	cfg.Gossip.BindAddr = "127.0.0.1:0"
	cfg.Gossip.Join = gossipAddrs
	cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	cfg.Gossip.GossipInterval = 50 * time.Millisecond
	logs := &lockedBuffer{}
	// The renewals go over connections of their own (the default), not
	// over gRPC streams: count both.
	var framesDialed, streams atomic.Int64
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		framesDialed.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	countStreams := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		streams.Add(1)
		return streamer(ctx, desc, cc, method, opts...)
	}
	a, err := agent.New(cfg, agent.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), RegisterBackoffMax: 200 * time.Millisecond,
		Dial: dial, DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(countStreams)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(false) })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	l, err := a.WaitRegistered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Epoch == 0 || !l.Valid || l.Fenced {
		t.Fatalf("lease after registration %+v", l)
	}
	if n, s := framesDialed.Load(), streams.Load(); n == 0 || s != 0 {
		t.Fatalf("a valid lease after %d connections of frames and %d gRPC streams: want frames only", n, s)
	}

	brokers := waldenv1.NewBrokersClient(conns[leaderID])
	testutil.Eventually(t, 10*time.Second, "broker in the leader's table with a lease", func() error {
		resp, err := brokers.GetBroker(context.Background(), &waldenv1.GetBrokerRequest{BrokerId: "b1"})
		if err != nil {
			return err
		}
		b := resp.GetBroker()
		if b.GetEpoch() != l.Epoch || b.GetAgentAddr() != a.Addr() || b.GetLeaseRemainingMs() <= 0 || b.GetFenced() {
			return errors.New("broker " + b.String())
		}
		return nil
	})

	fctx, fcancel := context.WithTimeout(context.Background(), testutil.Deadline(30*time.Second))
	defer fcancel()
	fo, err := brokers.Failover(fctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "agent test"})
	if err != nil {
		t.Fatal(err)
	}
	if fo.GetNewEpoch() <= l.Epoch {
		t.Fatalf("failover epoch %d, lease epoch %d", fo.GetNewEpoch(), l.Epoch)
	}
	testutil.Eventually(t, 10*time.Second, "fenced", func() error {
		if got := a.Lease(); !got.Fenced || got.Valid || got.Epoch != l.Epoch {
			return errors.New("lease not fenced yet")
		}
		return nil
	})
	if err := a.Check(); !errors.Is(err, agent.ErrFenced) {
		t.Fatalf("Check = %v, want ErrFenced", err)
	}
	if s := streams.Load(); s != 0 || strings.Contains(logs.String(), "does not serve renewals over their own connection") {
		t.Fatalf("the agent fell back from frames (%d gRPC streams): %s", s, logs.String())
	}
	resp, err := http.Get("http://" + a.Addr() + "/v1/lease")
	if err != nil {
		t.Fatal(err)
	}
	var body agent.LeaseJSON
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || body != (agent.LeaseJSON{BrokerID: "b1", Epoch: l.Epoch, Fenced: true}) {
		t.Fatalf("/v1/lease = %+v, %v", body, err)
	}
	// No executor finishes the recovery job here: the cluster refuses the
	// registration with RECOVERY_RUNNING, and the broker stays fenced on its
	// old epoch.
	testutil.Eventually(t, 10*time.Second, "registration refused while the recovery job runs", func() error {
		if !strings.Contains(logs.String(), "registration waits while a recovery job for it is running") {
			return errors.New("no RECOVERY_RUNNING answer yet")
		}
		return nil
	})
	if got := a.Lease(); !got.Fenced || got.Valid || got.Epoch != l.Epoch {
		t.Fatalf("lease while the recovery job runs %+v", got)
	}
}

// testCluster is three in-process coordinators on loopback.
type testCluster struct {
	members []clusterMember
	conns   map[string]*grpc.ClientConn // by member id, plaintext
	gossip  []string                    // the members' gossip addresses
	leader  string                      // the first leader seen
}

type clusterMember struct{ id, admin, raft, gossip string }

// startTestCluster starts three coordinators with short timings (policy
// edits the policy they are founded with) and waits for a leader; they
// stop when the test ends.
func startTestCluster(t *testing.T, policy func(*config.Policy)) *testCluster {
	t.Helper()
	return startTestClusterWith(t, policy, nil)
}

// startTestClusterWith is startTestCluster with each member's admin
// listener wrapped by wrapAdmin (nil: as bound).
func startTestClusterWith(t *testing.T, policy func(*config.Policy), wrapAdmin func(net.Listener) net.Listener) *testCluster {
	t.Helper()
	cl := &testCluster{conns: map[string]*grpc.ClientConn{}}
	var initial []config.Member
	listeners := map[string]server.Listeners{}
	// Each member's gossip sockets are bound here too and handed over in
	// its gossip section.
	gossipSockets := map[string]*gossip.Listener{}
	for _, id := range []string{"c1", "c2", "c3"} {
		l := server.Listeners{Admin: testutil.Listen(t, "127.0.0.1"), Raft: testutil.Listen(t, "127.0.0.1")}
		if wrapAdmin != nil {
			l.Admin = wrapAdmin(l.Admin)
		}
		listeners[id] = l
		g, err := gossip.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		gossipSockets[id] = g
		m := clusterMember{id: id, admin: l.Admin.Addr().String(), raft: l.Raft.Addr().String(), gossip: g.Addr()}
		cl.members = append(cl.members, m)
		initial = append(initial, config.Member{ID: id, Raft: m.raft, Admin: m.admin})
		cl.gossip = append(cl.gossip, m.gossip)
	}
	for i, m := range cl.members {
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "demo", m.id
		cfg.DataDir = filepath.Join(t.TempDir(), m.id)
		cfg.Listen = config.Listen{Admin: m.admin, Raft: m.raft}
		cfg.InitialCluster = initial
		cfg.Raft.TickInterval = 20 * time.Millisecond
		cfg.Gossip.BindAddr, cfg.Gossip.Listener = m.gossip, gossipSockets[m.id]
		// Each joins the members started before it (and itself): a
		// member's start waits for its join, and one not started yet
		// would answer only at gossip's TCP timeout (10 s).
		cfg.Gossip.Join = cl.gossip[:i+1]
		cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
		cfg.Gossip.GossipInterval = 50 * time.Millisecond
		policy(&cfg.Policy)
		s, err := server.New(cfg, slog.New(slog.DiscardHandler), server.WithListeners(listeners[m.id]))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("server did not stop")
			}
		})
	}
	for _, m := range cl.members {
		c, err := grpc.NewClient(m.admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cl.conns[m.id] = c
	}
	testutil.Eventually(t, 15*time.Second, "a leader", func() error {
		st, err := waldenv1.NewClusterClient(cl.conns["c1"]).Status(context.Background(), &waldenv1.StatusRequest{})
		if err != nil {
			return err
		}
		if st.GetLeaderId() == "" {
			return errors.New("no leader yet")
		}
		cl.leader = st.GetLeaderId()
		return nil
	})
	return cl
}

// broker asks any member that answers for broker id (following nothing:
// every member serves the replicated record).
func (cl *testCluster) broker(id string) (*waldenv1.Broker, error) {
	var errs []error
	for _, m := range cl.members {
		resp, err := waldenv1.NewBrokersClient(cl.conns[m.id]).GetBroker(context.Background(), &waldenv1.GetBrokerRequest{BrokerId: id})
		if err == nil {
			return resp.GetBroker(), nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
