package broker_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"walden/config"
	"walden/gossip"
	"walden/internal/testutil"
	"walden/loadgen"
	"walden/objstore"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/server"
)

// startCoordinator runs one in-process coordinator (server.New) with the
// given S3 (recovery uploads there) and short timings; it returns its admin
// and gossip addresses. It skips the test while the coordinator does not
// serve the Catalog service.
func startCoordinator(t testing.TB, s3 objstore.Config) (admin, gossipAddr string) {
	t.Helper()
	adminLis := testutil.Listen(t, "127.0.0.1")
	gossipSockets, err := gossip.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gossipSockets.Close() })
	admin, gossipAddr = adminLis.Addr().String(), gossipSockets.Addr()
	cfg := config.DefaultServerConfig()
	cfg.ClusterName, cfg.NodeID = "demo", "c1"
	cfg.DataDir = filepath.Join(t.TempDir(), "c1")
	cfg.Listen = config.Listen{Admin: admin, Raft: "127.0.0.1:0"}
	cfg.InitialCluster = []config.Member{{ID: "c1", Raft: "127.0.0.1:1", Admin: admin}}
	cfg.Raft.TickInterval = 10 * time.Millisecond
	cfg.Gossip.BindAddr, cfg.Gossip.Listener = gossipAddr, gossipSockets
	cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	cfg.Gossip.GossipInterval = 50 * time.Millisecond
	cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin, cfg.Policy.FailureTimeout = time.Second, 200*time.Millisecond, 2*time.Second
	cfg.S3 = s3
	cfg.Recovery.JobLease = time.Second
	cfg.Recovery.RetryMin, cfg.Recovery.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	srv, err := server.New(cfg, slog.New(slog.DiscardHandler), server.WithListeners(server.Listeners{Admin: adminLis}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("coordinator did not stop")
		}
	})
	conn, err := grpc.NewClient(admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testutil.Eventually(t, 15*time.Second, "catalog answers", func() error {
		_, err := waldenv1.NewCatalogClient(conn).ListStreams(context.Background(), &waldenv1.ListStreamsRequest{})
		if status.Code(err) == codes.Unimplemented {
			t.Skip("the coordinator does not serve the Catalog service yet")
		}
		return err
	})
	return admin, gossipAddr
}

// realBrokerConfig is a broker of the in-process coordinator's cluster.
func realBrokerConfig(dir, admin, gossipAddr string, s3 objstore.Config, id string, streams ...uint64) *config.Broker {
	c := config.DefaultBrokerConfig()
	c.BrokerID, c.ClusterName = id, "demo"
	c.Listen, c.AgentListen = "127.0.0.1:0", "127.0.0.1:0"
	c.Coordinators = []string{admin}
	c.Gossip.BindAddr = "127.0.0.1:0"
	c.Gossip.Join = []string{gossipAddr}
	c.Gossip.ProbeInterval, c.Gossip.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	c.Gossip.GossipInterval = 50 * time.Millisecond
	c.WAL = config.BrokerWAL{Path: filepath.Join(dir, id+".wal"), Capacity: 4 << 20}
	c.S3 = s3
	c.Streams = streams
	c.UploadInterval, c.UploadBytes, c.TakeoverInterval = 100*time.Millisecond, 256<<10, 100*time.Millisecond
	c.LeaseSafetyMargin = 200 * time.Millisecond
	return c
}

// TestWithRealCoordinator runs brokers against one in-process coordinator
// (server.New: raft, agent service, catalog service): appends, upload and
// commit through raft, a crash and restart that recovers the WAL tail, and
// a load + verify round trip.
func TestWithRealCoordinator(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator")
	}
	dir := t.TempDir()
	fakeS3 := s3test.StartFake(t)
	s3 := fakeS3
	admin, gossipAddr := startCoordinator(t, s3)
	conn, err := grpc.NewClient(admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bcfg := func(id string, streams ...uint64) *config.Broker {
		return realBrokerConfig(dir, admin, gossipAddr, s3, id, streams...)
	}
	e := &env{t: t, dir: dir}
	catalog := waldenv1.NewCatalogClient(conn)
	streamEnd := func(id uint64) uint64 {
		d, err := catalog.DescribeStream(context.Background(), &waldenv1.DescribeStreamRequest{StreamId: id})
		if err != nil {
			return 0
		}
		return d.GetStream().GetEndOffset()
	}

	c1 := bcfg("b1", 1, 2)
	b1 := e.start(c1)
	waitReady(t, b1)
	b2 := e.start(bcfg("b2", 3))
	waitReady(t, b2)
	cl := client(t, b1.Addr())
	mustAppend(t, cl, 1, "a0", "a1")
	testutil.Eventually(t, 10*time.Second, "stream 1 committed", func() error {
		if end := streamEnd(1); end != 2 {
			return fmt.Errorf("end %d", end)
		}
		return nil
	})
	equal(t, readAll(t, client(t, b2.Addr()), 1), []string{"a0", "a1"})

	// Crash b1 with a tail that is only in its WAL, restart it at once.
	c1.UploadInterval = time.Hour
	b1.Stop(false)
	b1 = e.start(c1)
	waitReady(t, b1)
	cl = client(t, b1.Addr())
	mustAppend(t, cl, 1, "a2", "a3")
	b1.Stop(false)
	c1.UploadInterval = 100 * time.Millisecond
	b1 = e.start(c1)
	waitReady(t, b1)
	if end := streamEnd(1); end != 4 {
		t.Fatalf("stream 1 end %d after the restart, want 4", end)
	}
	equal(t, readAll(t, client(t, b1.Addr()), 1), []string{"a0", "a1", "a2", "a3"})

	ledger := filepath.Join(dir, "ledger.jsonl")
	rep, err := loadgen.Load(context.Background(), loadgen.LoadConfig{Coordinators: []string{admin}, Streams: []uint64{1, 2, 3},
		Rate: 300, Duration: time.Second, Ledger: ledger})
	if err != nil {
		t.Fatal(err)
	}
	v, err := loadgen.Verify(context.Background(), loadgen.VerifyConfig{Coordinators: []string{admin}, Ledger: ledger, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Acked == 0 || !v.OK() || v.Present != rep.Acked {
		t.Fatalf("load %+v verify %+v", rep, v)
	}
}

// TestKillUnderLoadRealRecovery is the walden promise in one process: a
// broker dies (its WAL keeps a tail not uploaded) while a producer appends;
// the coordinator declares it failed, fences it, recovers its WAL tail into
// S3 and closes its streams; a broker with takeover opens them; the
// producer follows; nothing acknowledged is lost and offsets have no gaps.
func TestKillUnderLoadRealRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and a failover")
	}
	dir := t.TempDir()
	fakeS3 := s3test.StartFake(t)
	s3 := fakeS3
	admin, gossipAddr := startCoordinator(t, s3)
	e := &env{t: t, dir: dir}

	c1 := realBrokerConfig(dir, admin, gossipAddr, s3, "b1", 1, 2)
	c1.UploadInterval, c1.UploadBytes = time.Hour, 1<<20 // b1's tail stays in its WAL
	b1 := e.start(c1)
	waitReady(t, b1)
	c2 := realBrokerConfig(dir, admin, gossipAddr, s3, "b2", 3)
	c2.Takeover = true
	b2 := e.start(c2)
	waitReady(t, b2)

	ledger := filepath.Join(dir, "ledger.jsonl")
	type result struct {
		rep *loadgen.LoadReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := loadgen.Load(context.Background(), loadgen.LoadConfig{Coordinators: []string{admin}, Streams: []uint64{1, 2, 3},
			Rate: 300, Duration: 6 * time.Second, Ledger: ledger, AppendTimeout: 500 * time.Millisecond})
		done <- result{rep, err}
	}()
	time.Sleep(time.Second)
	if err := b1.Stop(false); err != nil { // kill -9
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	rep := res.rep
	v, err := loadgen.Verify(context.Background(), loadgen.VerifyConfig{Coordinators: []string{admin}, Ledger: ledger, Wait: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("load: acked %d, pending %d, retried records found stored %d, max unavailable %dms; verify: %+v",
		rep.Acked, rep.Pending, rep.DuplicateAcks, rep.MaxUnavailableMs, *v)
	// No duplicates either: a record the dead broker wrote to its WAL but
	// could not acknowledge is recovered, and the producer's retry of it on
	// b2 is answered with the recovered offsets (idempotent producer).
	if !v.OK() || v.Present != rep.Acked {
		_, rerr := client(t, b2.Addr()).Read(context.Background(), &waldenv1.ReadRequest{StreamId: 1})
		t.Fatalf("verify %+v, load %+v (read of stream 1 through b2: %v)", v, rep, rerr)
	}
	for _, s := range rep.Streams[:2] {
		if len(s.Owners) != 2 || s.Owners[1] != b2.Addr() {
			t.Fatalf("stream %d owners %v: not moved to b2", s.Stream, s.Owners)
		}
	}
}

// TestRetryAfterFailoverOnAnotherBroker: b1 is killed with two appends
// whose outcome its producers do not know: one acknowledged (the answer
// lost on the way), one durable in its WAL but not acknowledged. The
// coordinator fails b1 over (its recovery uploads the WAL tail and commits
// it with the producers' last batches) and b2 takes the streams over; both
// retries land on b2 and are answered with the original offsets, and each
// record is stored once.
func TestRetryAfterFailoverOnAnotherBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and a failover")
	}
	dir := t.TempDir()
	fakeS3 := s3test.StartFake(t)
	s3 := fakeS3
	admin, gossipAddr := startCoordinator(t, s3)
	e := &env{t: t, dir: dir}
	c1 := realBrokerConfig(dir, admin, gossipAddr, s3, "b1", 1, 2)
	c1.UploadInterval, c1.UploadBytes = time.Hour, 1<<20 // b1's tail stays in its WAL
	hold := newDurableHold()
	b1 := e.startWith(c1, hold.Hooks())
	waitReady(t, b1)
	c2 := realBrokerConfig(dir, admin, gossipAddr, s3, "b2")
	c2.Takeover = true
	b2 := e.start(c2)
	waitReady(t, b2)
	cl1 := client(t, b1.Addr())

	// Producer 11 on stream 1: acknowledged, but say the answer was lost.
	if r := mustAppendAs(t, cl1, 1, 11, 0, "a0", "a1"); r.GetBaseOffset() != 0 {
		t.Fatalf("first append: %v", r)
	}
	// Producer 12 on stream 2: durable in b1's WAL when b1 is killed,
	// before the acknowledgement.
	hold.Arm()
	errc := make(chan error, 1)
	go func() {
		_, err := appendAs(t, cl1, 2, 12, 0, "b0")
		errc <- err
	}()
	<-hold.Durable
	killed := make(chan struct{})
	go func() { _ = b1.Stop(false); close(killed) }()
	if err := <-errc; err == nil {
		t.Fatal("a killed broker acknowledged the append")
	}
	close(hold.Release)
	<-killed

	cl2 := client(t, b2.Addr())
	for _, c := range []struct {
		stream, pid uint64
		recs        []string
	}{{1, 11, []string{"a0", "a1"}}, {2, 12, []string{"b0"}}} {
		var r *waldenv1.AppendResponse
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("the retry on stream %d answered by b2", c.stream), func() error {
			var err error
			r, err = appendAs(t, cl2, c.stream, c.pid, 0, c.recs...)
			return err
		})
		if !r.GetDuplicate() || r.GetBaseOffset() != 0 || r.GetCount() != uint32(len(c.recs)) {
			t.Fatalf("stream %d: retry on b2 answered %v, want the original offsets as a duplicate", c.stream, r)
		}
	}
	mustAppendAs(t, cl2, 2, 12, 1, "b1")
	equal(t, readAll(t, cl2, 1), []string{"a0", "a1"})
	equal(t, readAll(t, cl2, 2), []string{"b0", "b1"})
}

// TestTakeoverLearnsFromTheWatch: with polling effectively off (takeover
// interval of an hour), a taker still opens a stream as soon as its owner
// closes it: it learns it from the coordinators' Watch.
func TestTakeoverLearnsFromTheWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator")
	}
	dir := t.TempDir()
	fakeS3 := s3test.StartFake(t)
	s3 := fakeS3
	admin, gossipAddr := startCoordinator(t, s3)
	e := &env{t: t, dir: dir}
	b1 := e.start(realBrokerConfig(dir, admin, gossipAddr, s3, "b1", 4))
	waitReady(t, b1)
	c2 := realBrokerConfig(dir, admin, gossipAddr, s3, "b2")
	c2.Takeover, c2.TakeoverInterval = true, time.Hour
	b2 := e.start(c2)
	waitReady(t, b2)
	mustAppend(t, client(t, b1.Addr()), 4, "a")
	if err := b1.Stop(true); err != nil { // uploads, then closes stream 4
		t.Fatal(err)
	}
	cl2 := client(t, b2.Addr())
	testutil.Eventually(t, 10*time.Second, "b2 opens stream 4", func() error {
		_, err := appendRecs(t, cl2, 4, "b")
		return err
	})
	equal(t, readAll(t, cl2, 4), []string{"a", "b"})
}
