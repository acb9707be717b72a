package server

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/config"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// TestHardeningAPI is the API rows of the hardening table
// (docs/security.md): each bad request is refused InvalidArgument naming
// the field, and the state the API shows afterwards (registry, streams
// and objects, members, policy) is what it was before.
func TestHardeningAPI(t *testing.T) {
	cfg := singleMember(t)
	s := startServer(t, cfg)
	conn, err := grpc.NewClient(s.Addrs().Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	agent, catalog := waldenv1.NewAgentClient(conn), waldenv1.NewCatalogClient(conn)
	brokers, cluster := waldenv1.NewBrokersClient(conn), waldenv1.NewClusterClient(conn)

	reg, err := agent.Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: "b1", AgentAddr: "127.0.0.1:1",
		Wal: &waldenv1.WalLocation{Path: "/wal/b1"}})
	if err != nil {
		t.Fatal(err)
	}
	epoch := reg.GetEpoch()
	if reg.GetFailureTimeoutMs() != cfg.Policy.FailureTimeout.Milliseconds() {
		t.Fatalf("registration answered failure_timeout_ms %d, the policy says %s", reg.GetFailureTimeoutMs(), cfg.Policy.FailureTimeout)
	}
	// An agent beside an AutoMQ broker reports its node; the broker record
	// shows it.
	if _, err := agent.Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: "b2", AgentAddr: "127.0.0.1:2",
		Wal: &waldenv1.WalLocation{Path: "/wal/b2"}, Automq: &waldenv1.AutomqNode{NodeId: 0, NodeEpoch: 1732870000000}}); err != nil {
		t.Fatal(err)
	}
	if got, err := brokers.GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: "b2"}); err != nil ||
		got.GetBroker().GetAutomq() == nil || got.GetBroker().GetAutomq().GetNodeEpoch() != 1732870000000 {
		t.Fatalf("GetBroker(b2) = %v, %v; want its AutoMQ node 0 at epoch 1732870000000", got, err)
	}
	if _, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: 2}); err != nil {
		t.Fatal(err)
	}
	commit := func(o *waldenv1.Object) error {
		_, err := catalog.CommitObject(ctx, &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: epoch, Object: o})
		return err
	}
	rng := func(stream, start, end, pos, length uint64) *waldenv1.ObjectRange {
		return &waldenv1.ObjectRange{StreamId: stream, StreamEpoch: 1, StartOffset: start, EndOffset: end, Position: pos, Length: length}
	}
	if err := commit(&waldenv1.Object{ObjectId: "o1", Key: "k/o1", Size: 400, Ranges: []*waldenv1.ObjectRange{rng(1, 0, 10, 16, 100), rng(2, 0, 5, 116, 50)}}); err != nil {
		t.Fatal(err)
	}

	// snapshot is what the API shows; it must not change.
	snapshot := func() []proto.Message {
		t.Helper()
		var out []proto.Message
		lb, err := brokers.ListBrokers(ctx, &waldenv1.ListBrokersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range lb.GetBrokers() {
			b.LeaseRemainingMs = 0 // moves with the clock
			out = append(out, b)
		}
		for _, id := range []uint64{1, 2} {
			d, err := catalog.DescribeStream(ctx, &waldenv1.DescribeStreamRequest{StreamId: id})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
		ls, err := catalog.ListStreams(ctx, &waldenv1.ListStreamsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ml, err := cluster.MemberList(ctx, &waldenv1.MemberListRequest{Linearizable: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ml.GetMembers() {
			m.Reachable, m.MatchIndex = false, 0
		}
		// The policy is seeded by the first leader: wait for it.
		gp, err := brokers.GetPolicy(ctx, &waldenv1.GetPolicyRequest{})
		for deadline := time.Now().Add(10 * time.Second); status.Code(err) == codes.Unavailable && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			gp, err = brokers.GetPolicy(ctx, &waldenv1.GetPolicyRequest{})
		}
		if err != nil {
			t.Fatal(err)
		}
		return append(out, ls, ml, gp)
	}
	before := snapshot()
	long := func(n int) string { return strings.Repeat("x", n) }

	rows := []struct {
		name, field string
		call        func() error
	}{
		// CommitObject: the ranges must lie inside the object.
		{"a range beyond the object's size", "object.ranges[0].length", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 100, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 1<<40, 16, 1000)}})
		}},
		{"a range whose position + length wraps", "object.ranges[0].length", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 100, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 20, math.MaxUint64-5, 10)}})
		}},
		{"an object of size 0", "object.ranges[0].length", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Ranges: []*waldenv1.ObjectRange{rng(1, 10, 20, 0, 10)}})
		}},
		{"an empty range", "object.ranges[0].length", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 100, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 20, 16, 0)}})
		}},
		{"overlapping ranges", "object.ranges[1].position", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 400, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 20, 16, 40), rng(2, 5, 9, 40, 20)}})
		}},
		{"ranges in descending positions", "object.ranges[1].position", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 400, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 20, 60, 20), rng(2, 5, 9, 16, 20)}})
		}},
		{"offsets descending", "object.ranges[0].end_offset", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 100, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 9, 16, 20)}})
		}},
		{"a range of stream 0", "object.ranges[0].stream_id", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 100, Ranges: []*waldenv1.ObjectRange{rng(0, 0, 9, 16, 20)}})
		}},
		// CommitObject: the offsets must fit what the object can hold.
		// The commit claimed [311, 2^64-1) in 10 bytes at
		// position 0: the stream then claimed 2^64 records, every later
		// upload of its broker failed and acknowledged records were in no
		// object.
		{"the offsets [10, 2^64-1) in 10 bytes", "object.ranges[0].end_offset", func() error {
			return commit(&waldenv1.Object{ObjectId: "k5", Key: "k5", Size: 100, Ranges: []*waldenv1.ObjectRange{rng(1, 10, math.MaxUint64, 0, 10)}})
		}},
		{"an end offset of 2^63", "object.ranges[0].end_offset", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 400, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 1<<63, 16, 32)}})
		}},
		{"more offsets than 32 bytes can hold", "object.ranges[0].end_offset", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 400, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 10+1<<33, 16, 32)}})
		}},
		{"a section inside the object's header", "object.ranges[0].position", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 400, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 20, 0, 32)}})
		}},
		{"a section reaching into the object's index", "object.ranges[0].length", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 100, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 20, 16, 60)}})
		}},
		// Stream ids 0 and 2^64-1.
		{"opening stream 0", "stream_id", func() error {
			_, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: 0})
			return err
		}},
		{"opening stream 2^64-1", "stream_id", func() error {
			_, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: math.MaxUint64})
			return err
		}},
		{"closing stream 2^64-1", "stream_id", func() error {
			_, err := catalog.CloseStream(ctx, &waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: math.MaxUint64, StreamEpoch: 1})
			return err
		}},
		// Size limits on every string and repeated field.
		{"a 3 MB wal.path", "wal.path", func() error {
			_, err := agent.Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: "b9", AgentAddr: "127.0.0.1:1",
				Wal: &waldenv1.WalLocation{Path: long(3 << 20)}})
			return err
		}},
		{"a 2 KiB volume id", "wal.volume_id", func() error {
			_, err := agent.Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: "b9", AgentAddr: "127.0.0.1:1",
				Wal: &waldenv1.WalLocation{Path: "/w", VolumeId: long(2048)}})
			return err
		}},
		{"a negative AutoMQ node id", "automq.node_id", func() error {
			_, err := agent.Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: "b9", AgentAddr: "127.0.0.1:1",
				Wal: &waldenv1.WalLocation{Path: "/w"}, Automq: &waldenv1.AutomqNode{NodeId: -1}})
			return err
		}},
		{"a negative AutoMQ node epoch", "automq.node_epoch", func() error {
			_, err := agent.Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: "b9", AgentAddr: "127.0.0.1:1",
				Wal: &waldenv1.WalLocation{Path: "/w"}, Automq: &waldenv1.AutomqNode{NodeId: 1, NodeEpoch: -1}})
			return err
		}},
		{"a 2 KiB S3 key", "object.key", func() error {
			return commit(&waldenv1.Object{ObjectId: "o2", Key: long(2048), Size: 100, Ranges: []*waldenv1.ObjectRange{rng(1, 10, 20, 16, 20)}})
		}},
		{"a 2 KiB failover reason", "reason", func() error {
			_, err := brokers.Failover(ctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: long(2048)})
			return err
		}},
		{"a 2 KiB policy value", `set["cooldown"]`, func() error {
			_, err := brokers.SetPolicy(ctx, &waldenv1.SetPolicyRequest{Set: map[string]string{"cooldown": long(2048)}})
			return err
		}},
		{"10001 ranges", "object.ranges", func() error {
			rs := make([]*waldenv1.ObjectRange, 10001)
			for i := range rs {
				rs[i] = rng(uint64(i+1), 0, 1, uint64(16+i), 1)
			}
			return commit(&waldenv1.Object{ObjectId: "o2", Key: "k/o2", Size: 1 << 20, Ranges: rs})
		}},
		// A policy duration whose sums would overflow.
		{"restart_grace of 2562047h", "restart_grace", func() error {
			_, err := brokers.SetPolicy(ctx, &waldenv1.SetPolicyRequest{Set: map[string]string{"restart_grace": "2562047h"}})
			return err
		}},
		// Durations and counts are bounded before any arithmetic: a ttl
		// of 2^63-1 ms once passed the 168 h bound (the check multiplied
		// and wrapped) and the maintenance ended 1.5 s later.
		{"a maintenance ttl of 2^63-1 ms", "ttl_ms", func() error {
			_, err := brokers.SetMaintenance(ctx, &waldenv1.SetMaintenanceRequest{BrokerId: "b1", On: true, TtlMs: math.MaxInt64})
			return err
		}},
		{"a maintenance ttl of 2^63/1000 ms", "ttl_ms", func() error {
			_, err := brokers.SetMaintenance(ctx, &waldenv1.SetMaintenanceRequest{BrokerId: "b1", On: true, TtlMs: math.MaxInt64/1000 + 1})
			return err
		}},
		{"a maintenance ttl of 200h", "ttl_ms", func() error {
			_, err := brokers.SetMaintenance(ctx, &waldenv1.SetMaintenanceRequest{BrokerId: "b1", On: true, TtlMs: (200 * time.Hour).Milliseconds()})
			return err
		}},
		{"an event limit of 2^32-1", "limit", func() error {
			_, err := brokers.ListEvents(ctx, &waldenv1.ListEventsRequest{Limit: math.MaxUint32})
			return err
		}},
		{"a max_objects of 2^32-1", "max_objects", func() error {
			_, err := catalog.DescribeStream(ctx, &waldenv1.DescribeStreamRequest{StreamId: 1, MaxObjects: math.MaxUint32})
			return err
		}},
		// MemberAdd: addresses of another member.
		{"a member on c1's raft address", "raft_addr", func() error {
			st, _ := cluster.Status(ctx, &waldenv1.StatusRequest{})
			_, err := cluster.MemberAdd(ctx, &waldenv1.MemberAddRequest{Id: "c2", RaftAddr: st.GetMembers()[0].GetRaftAddr(), AdminAddr: "127.0.0.1:9"})
			return err
		}},
		{"a member on c1's admin address", "admin_addr", func() error {
			st, _ := cluster.Status(ctx, &waldenv1.StatusRequest{})
			_, err := cluster.MemberAdd(ctx, &waldenv1.MemberAddRequest{Id: "c2", RaftAddr: "127.0.0.1:9", AdminAddr: st.GetMembers()[0].GetAdminAddr()})
			return err
		}},
		{"a member whose raft and admin addresses are one", "admin_addr", func() error {
			_, err := cluster.MemberAdd(ctx, &waldenv1.MemberAddRequest{Id: "c2", RaftAddr: "127.0.0.1:9", AdminAddr: "127.0.0.1:9"})
			return err
		}},
	}
	for _, row := range rows {
		err := row.call()
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument || !containsField(st, row.field) {
			t.Errorf("%s: %v, want InvalidArgument naming %s", row.name, err, row.field)
			continue
		}
		t.Logf("%s: %s", row.name, shortMsg(st.Message()))
	}
	after := snapshot()
	if len(after) != len(before) {
		t.Fatalf("state changed: %d parts, was %d", len(after), len(before))
	}
	for i := range before {
		if !proto.Equal(before[i], after[i]) {
			t.Fatalf("state changed:\nbefore %v\nafter  %v", before[i], after[i])
		}
	}
}

func shortMsg(s string) string {
	if len(s) > 160 {
		return s[:160] + "..."
	}
	return s
}

// TestHardeningRemoveBroker: a registration nobody uses can go (RemoveBroker,
// admins only); one whose lease still runs, or that owns an opened stream,
// stays, and the refusal says why.
func TestHardeningRemoveBroker(t *testing.T) {
	cfg := singleMember(t)
	cfg.Policy.LeaseTTL = 500 * time.Millisecond
	s := startServer(t, cfg)
	conn, err := grpc.NewClient(s.Addrs().Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	agent, brokers := waldenv1.NewAgentClient(conn), waldenv1.NewBrokersClient(conn)
	register := func(id string) uint64 {
		r, err := agent.Register(ctx, &waldenv1.RegisterRequest{ClusterName: cfg.ClusterName, BrokerId: id, AgentAddr: "127.0.0.1:1", Wal: &waldenv1.WalLocation{Path: "/w/" + id}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetEpoch()
	}
	// b1 registers first: once ghost's lease window has passed, b1's has
	// too, and its refusal below is its opened stream, not its lease.
	epoch := register("b1")
	if _, err := waldenv1.NewCatalogClient(conn).OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: 5}); err != nil {
		t.Fatal(err)
	}
	register("ghost")

	// Just registered: its lease runs, the registration stays.
	_, err = brokers.RemoveBroker(ctx, &waldenv1.RemoveBrokerRequest{BrokerId: "ghost"})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || rpcerr.Reason(err) != refusal.LeaseHeld || !strings.Contains(st.Message(), "holds a lease") {
		t.Fatalf("removing a leased broker: %v", err)
	}
	// Once nobody renews it, it goes.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = brokers.RemoveBroker(ctx, &waldenv1.RemoveBrokerRequest{BrokerId: "ghost"})
		if err == nil {
			break
		}
		if status.Code(err) != codes.FailedPrecondition || time.Now().After(deadline) {
			t.Fatalf("removing ghost: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := brokers.GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: "ghost"}); status.Code(err) != codes.NotFound {
		t.Fatalf("ghost after removal: %v", err)
	}
	// b1 owns stream 5: it stays, unchanged.
	before, err := brokers.GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = brokers.RemoveBroker(ctx, &waldenv1.RemoveBrokerRequest{BrokerId: "b1"})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "opened streams 5") {
		t.Fatalf("removing b1: %v", err)
	}
	after, err := brokers.GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: "b1"})
	if err != nil || after.GetBroker().GetEpoch() != before.GetBroker().GetEpoch() || after.GetBroker().GetRegisteredUnixMs() != before.GetBroker().GetRegisteredUnixMs() {
		t.Fatalf("b1 changed: %v -> %v (%v)", before, after, err)
	}
}

// TestHardeningFilesAndPermissions is findings 6 and 7 of the hardening
// table for a member: a 0777 data directory and a 0644 private key were
// accepted silently, and a certificate file that is /dev/zero would be read
// without end. Each is refused before anything starts, naming the key and
// the chmod to run; tls.allow_group_readable_key lets a key be read by its
// group (a Kubernetes secret mounted with an fsGroup is 0440), never by
// others.
func TestHardeningFilesAndPermissions(t *testing.T) {
	p := newTestPKI(t)
	member := func() *config.Server {
		cfg := singleMember(t)
		cfg.TLS = p.Member(t, "c1")
		return cfg
	}
	refused := func(name string, cfg *config.Server, want ...string) {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			s, err := New(cfg, nil)
			if err == nil {
				s.Stop()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s: started", name)
				return
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %v, want it to say %q", name, err, w)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: New still running after 10s", name)
		}
	}

	open := member()
	if err := os.MkdirAll(open.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open.DataDir, 0o777); err != nil {
		t.Fatal(err)
	}
	refused("a 0777 data_dir", open, "data_dir "+open.DataDir, "mode 0777", "run chmod 700 "+open.DataDir)
	if _, err := os.Stat(filepath.Join(open.DataDir, "raft.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused data_dir was written: %v", err)
	}

	readable := member()
	if err := os.Chmod(readable.TLS.KeyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	refused("a 0644 private key", readable, "tls.key_file", "mode 0644 lets every user at the private key", "run chmod 600 "+readable.TLS.KeyFile)
	readable.TLS.AllowGroupReadableKey = true
	refused("a 0644 private key with the override", readable, "mode 0644", "run chmod 640 "+readable.TLS.KeyFile)

	group := member()
	if err := os.Chmod(group.TLS.KeyFile, 0o640); err != nil {
		t.Fatal(err)
	}
	refused("a 0640 private key", group, "lets its group at the private key", "tls.allow_group_readable_key: true")
	group.TLS.AllowGroupReadableKey = true
	for _, f := range []string{group.TLS.KeyFile, group.TLS.GossipKeyFile()} {
		if err := os.Chmod(f, 0o440); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(group, nil)
	if err != nil {
		t.Fatalf("a 0440 private key with tls.allow_group_readable_key: %v", err)
	}
	s.Stop()

	zero := member()
	zero.TLS.CertFile = "/dev/zero"
	refused("a certificate that is /dev/zero", zero, "certificate file /dev/zero", "not a regular file (a character device)")
}
