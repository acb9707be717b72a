package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/authz"
	"walden/internal/devcluster"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// TestE2EShortSecurity runs the cluster as `walden dev` does — real
// processes, mutual TLS with roles, certificates from its own CA — and
// attacks it: a reader asks every coordinator for a failover, the agent of
// b1 renews (and registers) b2, a coordinator's certificate sends raft
// frames claiming another member at term 1000, and a client without a
// certificate calls. Each is refused with the right code naming the method
// and the identity, and nothing changes: b2 keeps its epoch and lease,
// no term jumps, the leader stays, and every agent still renews with every
// coordinator over a connection of its own (frames), none over the gRPC
// stream.
func TestE2EShortSecurity(t *testing.T) {
	c := startCluster(t, func(o *devcluster.Options) { o.Brokers = 2 })
	if c.PKI == "" {
		t.Fatal("the cluster runs without TLS")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := func(id authz.Identity, addr string) *grpc.ClientConn {
		t.Helper()
		opts, err := c.DialOptionsAs(id)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	refused := func(what string, err error, code codes.Code, parts ...string) {
		t.Helper()
		s := status.Convert(err)
		if s.Code() != code {
			t.Fatalf("%s: %v, want %v", what, err, code)
		}
		for _, p := range parts {
			if !strings.Contains(s.Message(), p) {
				t.Fatalf("%s: %q does not name %q", what, s.Message(), p)
			}
		}
		t.Logf("%s: refused: %s", what, s.Message())
	}

	reader := authz.Identity{Name: "grafana", Role: authz.RoleReader}
	before, err := c.ListBrokers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b2 := brokerOf(t, before, "b2")
	terms := coordinatorTerms(ctx, t, c, reader, conn)

	// 1. A reader is refused a failover, at every coordinator (followers
	// refuse it themselves; the leader would refuse it forwarded too).
	for _, m := range c.Coords {
		_, err := waldenv1.NewBrokersClient(conn(reader, m.Admin)).Failover(ctx, &waldenv1.FailoverRequest{BrokerId: "b2", Reason: "attack"})
		refused("reader failover at "+m.Name, err, codes.PermissionDenied, `"grafana" (reader)`, waldenv1.Brokers_Failover_FullMethodName)
	}

	// 2. The agent of b1 is refused b2's lease, with b2's real epoch (it is
	// public), and b2's registration.
	agentB1 := authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"}
	for _, m := range c.Coords {
		ag := waldenv1.NewAgentClient(conn(agentB1, m.Admin))
		_, err := ag.RenewLease(ctx, &waldenv1.RenewLeaseRequest{BrokerId: "b2", Epoch: b2.GetEpoch()})
		refused("agent of b1 renewing b2 at "+m.Name, err, codes.PermissionDenied, `"b1-agent" (agent of broker b1)`, `broker "b2"`,
			waldenv1.Agent_RenewLease_FullMethodName)
		_, err = ag.Register(ctx, &waldenv1.RegisterRequest{ClusterName: c.Opts.ClusterName, BrokerId: "b2", AgentAddr: m.Admin,
			Wal: &waldenv1.WalLocation{Path: "/stolen"}})
		refused("agent of b1 registering b2 at "+m.Name, err, codes.PermissionDenied, `broker "b2"`, waldenv1.Agent_Register_FullMethodName)
	}

	// 3. A forged raft frame: c2's certificate on c1's raft port, claiming
	// to be c3 and asking for votes at term 1000. And an operator's
	// certificate on the raft port.
	c1, c3 := c.Proc("c1"), "c3"
	forged, err := proto.Marshal(&raftpb.Message{Type: raftpb.MsgVote.Enum(), From: new(raftnode.RaftID(c3)), To: new(raftnode.RaftID("c1")),
		Term: new(uint64(1000)), LogTerm: new(uint64(1000)), Index: new(uint64(1 << 40))})
	if err != nil {
		t.Fatal(err)
	}
	sendRaft := func(id authz.Identity) error {
		st, err := waldenv1.NewRaftClient(conn(id, c1.Raft)).Stream(ctx)
		if err != nil {
			return err
		}
		for range 3 {
			if err := st.Send(&waldenv1.RaftFrame{ClusterName: c.Opts.ClusterName, FromId: c3, Message: forged}); err != nil {
				break // the receiver ended the stream: CloseAndRecv says why
			}
		}
		_, err = st.CloseAndRecv()
		return err
	}
	c2 := authz.Identity{Name: "c2", Role: authz.RoleCoordinator}
	refused("c2 sending raft frames as c3", sendRaft(c2), codes.PermissionDenied, `"c2" (coordinator)`, `as member "c3"`)
	operator := authz.Identity{Name: "alice", Role: authz.RoleOperator}
	refused("an operator on the raft port", sendRaft(operator), codes.PermissionDenied, `"alice" (operator)`, waldenv1.Raft_Stream_FullMethodName)

	// 4. No certificate at all: the handshake fails on every listener.
	for _, addr := range []string{c1.Admin, c1.Raft} {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		_, err = waldenv1.NewClusterClient(cc).Status(ctx, &waldenv1.StatusRequest{})
		cc.Close()
		refused("plaintext to "+addr, err, codes.Unavailable)
	}

	// Nothing changed: b2 keeps its epoch, is alive and its broker serves
	// with a valid lease; no member's term jumped to the forged one; the
	// cluster still has a leader among its members.
	after, err := c.ListBrokers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b := brokerOf(t, after, "b2"); b.GetEpoch() != b2.GetEpoch() || b.GetFenced() || b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_ALIVE {
		t.Fatalf("b2 after the attacks: %v (before: %v)", b, b2)
	}
	st, err := c.BrokerStatus(ctx, c.Proc("b2"))
	if err != nil || !st.GetServing() || !st.GetLeaseValid() || st.GetBrokerEpoch() != b2.GetEpoch() {
		t.Fatalf("b2's own status: %v %v", st, err)
	}
	for name, term := range coordinatorTerms(ctx, t, c, reader, conn) {
		if term >= 1000 || term < terms[name] {
			t.Fatalf("%s: term %d after the forged frames (before: %d)", name, term, terms[name])
		}
	}
	if _, err := c.WaitLeader(ctx, "", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitRenewalTransports(ctx, t, c)
}

// waitRenewalTransports waits until every live coordinator counts one
// framed renewal connection per live broker's agent and no renewal stream
// (walden_lease_renewal_streams by transport): with TLS on and the default
// settings every agent renews over frames. It scrapes every quarter of a
// second (each scrape opens connections of its own).
func waitRenewalTransports(ctx context.Context, t *testing.T, c *devcluster.Cluster) {
	t.Helper()
	agents := 0
	for _, b := range c.Brokers {
		if b.Alive() {
			agents++
		}
	}
	counted := func() error {
		for _, m := range c.Coords {
			if !m.Alive() {
				continue
			}
			smp, err := c.Scrape(ctx, m.Metrics)
			if err != nil {
				return err
			}
			frames := smp.Value("walden_lease_renewal_streams", "transport", "frames")
			stream := smp.Value("walden_lease_renewal_streams", "transport", "stream")
			if frames != float64(agents) || stream != 0 {
				return fmt.Errorf("%s counts %v renewal connections over frames and %v over the gRPC stream, want %d and 0", m.Name, frames, stream, agents)
			}
		}
		return nil
	}
	deadline := time.Now().Add(testutil.Deadline(30 * time.Second))
	for {
		err := counted()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("every coordinator counting the agents' renewals over frames: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func brokerOf(t *testing.T, bs []*waldenv1.Broker, id string) *waldenv1.Broker {
	t.Helper()
	for _, b := range bs {
		if b.GetBrokerId() == id {
			return b
		}
	}
	t.Fatalf("broker %s not registered: %v", id, bs)
	return nil
}

// coordinatorTerms asks each coordinator for its raft term, as id.
func coordinatorTerms(ctx context.Context, t *testing.T, c *devcluster.Cluster, id authz.Identity, conn func(authz.Identity, string) *grpc.ClientConn) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, m := range c.Coords {
		st, err := waldenv1.NewClusterClient(conn(id, m.Admin)).Status(ctx, &waldenv1.StatusRequest{})
		if err != nil {
			t.Fatalf("status of %s as %s: %v", m.Name, id.Name, err)
		}
		out[m.Name] = st.GetTerm()
	}
	if len(out) != len(c.Coords) {
		t.Fatal(fmt.Sprint("terms of ", out))
	}
	return out
}
