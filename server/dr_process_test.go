package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/server"
)

// aliveAgent serves GET /healthz 200 on loopback, so that the coordinators'
// probes see the test's brokers alive and nothing is failed over.
func aliveAgent(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

func dial(t *testing.T, addrs []string) *grpc.ClientConn {
	t.Helper()
	// Any member: the writes are forwarded to the leader.
	conn, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// writeCatalog registers two brokers, opens three streams and commits two
// objects, through the leader at addr.
func writeCatalog(t *testing.T, cluster, leaderAdmin string) {
	t.Helper()
	conn := dial(t, []string{leaderAdmin})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	agent := aliveAgent(t)
	epochs := map[string]uint64{}
	for _, b := range []string{"b1", "b2"} {
		r, err := waldenv1.NewAgentClient(conn).Register(ctx, &waldenv1.RegisterRequest{ClusterName: cluster, BrokerId: b, AgentAddr: agent, BrokerAddr: "127.0.0.1:1"})
		if err != nil {
			t.Fatalf("register %s: %v", b, err)
		}
		epochs[b] = r.GetEpoch()
	}
	cat := waldenv1.NewCatalogClient(conn)
	for _, s := range []struct {
		broker string
		id     uint64
	}{{"b1", 1}, {"b1", 2}, {"b2", 3}} {
		if _, err := cat.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: s.broker, BrokerEpoch: epochs[s.broker], StreamId: s.id}); err != nil {
			t.Fatalf("open stream %d: %v", s.id, err)
		}
	}
	for i, o := range []struct {
		broker     string
		stream     uint64
		start, end uint64
	}{{"b1", 1, 0, 10}, {"b2", 3, 0, 7}} {
		_, err := cat.CommitObject(ctx, &waldenv1.CommitObjectRequest{BrokerId: o.broker, BrokerEpoch: epochs[o.broker], Object: &waldenv1.Object{
			ObjectId: fmt.Sprintf("obj-%d", i), Key: fmt.Sprintf("k/%d", i), Size: 200,
			Ranges: []*waldenv1.ObjectRange{{StreamId: o.stream, StreamEpoch: 1, StartOffset: o.start, EndOffset: o.end, Position: 16, Length: 64}},
		}})
		if err != nil {
			t.Fatalf("commit object %d: %v", i, err)
		}
	}
}

// catalogView is the part of the catalog the tests compare: every stream
// with its owner, epoch and end offset.
func catalogView(t *testing.T, waldenctl string, eps ...string) (string, error) {
	out, errOut, err := ctl(waldenctl, "--endpoints", strings.Join(eps, ","), "--timeout", "2s", "streams", "-o", "json")
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, errOut)
	}
	var v struct {
		Streams []struct {
			StreamID  string `json:"stream_id"`
			State     string `json:"state"`
			Owner     string `json:"owner_broker_id"`
			EndOffset string `json:"end_offset"`
			Objects   string `json:"objects"`
		} `json:"streams"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("streams list -o json: %v\n%s", err, out)
	}
	return fmt.Sprintf("%+v", v.Streams), nil
}

func grpcHealth(addr, service string) string {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err.Error()
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return err.Error()
	}
	return r.GetStatus().String()
}

// TestProcessQuorumLossForceNewCluster: a catalog is written to three
// members; two are killed for good. The survivor stays alive (liveness) but
// not ready; restarted with --force-new-cluster it leads alone with the
// whole catalog, takes writes, and a replacement member joins it again.
func TestProcessQuorumLossForceNewCluster(t *testing.T) {
	walden, waldenctl := binaries(t)
	dir := t.TempDir()
	members := opsCluster(t, dir, 3, 60, "dr", "")
	t.Cleanup(func() { dumpLogs(t, members) })
	for _, m := range members {
		m.start(t, walden)
	}
	leader := waitLeader(t, waldenctl, admins(members), "")
	var lm *member
	for _, m := range members {
		if m.id == leader {
			lm = m
		}
	}
	writeCatalog(t, "dr", lm.admin)
	var before string
	waitFor(t, "the catalog on every member", 10*time.Second, func() (bool, string) {
		var views []string
		for _, m := range members {
			v, err := catalogView(t, waldenctl, m.admin)
			if err != nil {
				return false, err.Error()
			}
			views = append(views, v)
		}
		before = views[0]
		return strings.Contains(before, "EndOffset:10") && views[1] == before && views[2] == before, strings.Join(views, "\n")
	})

	// Lose two members for good: the survivor is alive, not ready.
	survivor := members[2]
	members[0].kill()
	members[1].kill()
	waitFor(t, "the survivor without a leader", 15*time.Second, func() (bool, string) {
		code, body := httpGet(survivor.http, "/readyz")
		return code == 503, fmt.Sprintf("%d %s", code, body)
	})
	if code, body := httpGet(survivor.http, "/healthz"); code != 200 {
		t.Fatalf("/healthz during the quorum loss: %d %s", code, body)
	}
	if got := grpcHealth(survivor.admin, ""); got != "SERVING" {
		t.Fatalf("gRPC health \"\" during the quorum loss: %s", got)
	}
	// Readiness in gRPC health follows the node at the next tick of its
	// watcher, shortly after /readyz (which asks the node) said 503.
	waitFor(t, "gRPC health walden.v1.Cluster NOT_SERVING during the quorum loss", 10*time.Second, func() (bool, string) {
		got := grpcHealth(survivor.admin, "walden.v1.Cluster")
		return got == "NOT_SERVING", got
	})

	// Restart the survivor alone.
	if err := survivor.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-survivor.exited
	survivor.args = []string{"--force-new-cluster"}
	survivor.start(t, walden)
	if got := waitLeader(t, waldenctl, []string{survivor.admin}, ""); got != survivor.id {
		t.Fatalf("leader %s after --force-new-cluster, want %s", got, survivor.id)
	}
	waitFor(t, "the catalog after --force-new-cluster", 10*time.Second, func() (bool, string) {
		v, err := catalogView(t, waldenctl, survivor.admin)
		if err != nil {
			return false, err.Error()
		}
		return v == before, v + "\nwant\n" + before
	})
	st, err := status(t, waldenctl, survivor.admin)
	if err != nil || len(st.Members) != 1 {
		t.Fatalf("members after --force-new-cluster: %+v %v", st, err)
	}
	if !logHas(t, survivor, "force new cluster: this member will be the only voter") ||
		!logHas(t, survivor, "whatever the lost members committed beyond index") {
		t.Fatal("no warning logged for --force-new-cluster, or it does not say what it may have lost")
	}
	// The lost members may have issued fencing tokens and stream epochs
	// beyond the survivor's log: every broker epoch is revoked, and both
	// move past what the log issued; the event log says so.
	out, errOut, err := ctl(waldenctl, "--endpoints", survivor.admin, "streams", "-o", "json")
	if err != nil {
		t.Fatalf("streams: %v %s", err, errOut)
	}
	var streams struct {
		Streams []struct {
			Epoch string `json:"epoch"`
		} `json:"streams"`
	}
	if err := json.Unmarshal([]byte(out), &streams); err != nil || len(streams.Streams) == 0 {
		t.Fatalf("streams -o json: %v %s", err, out)
	}
	for _, s := range streams.Streams {
		if e, _ := strconv.ParseUint(s.Epoch, 10, 64); e <= server.ForceNewClusterEpochBump {
			t.Fatalf("stream epoch %s after --force-new-cluster, want beyond %d", s.Epoch, server.ForceNewClusterEpochBump)
		}
	}
	out, errOut, err = ctl(waldenctl, "--endpoints", survivor.admin, "events", "--kind", "force_new_cluster", "-o", "json")
	if err != nil || !strings.Contains(out, "is lost") || !strings.Contains(out, "only voter") {
		t.Fatalf("events --kind force_new_cluster: %v %s %s", err, out, errOut)
	}

	// A replacement joins with an empty data_dir.
	repl := members[0]
	if err := os.RemoveAll(repl.dataDir); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = ctl(waldenctl, "--endpoints", survivor.admin, "member", "add", repl.id, "--raft", repl.raft, "--admin", repl.admin)
	if err != nil {
		t.Fatalf("member add: %v %s %s", err, out, errOut)
	}
	var peers strings.Builder
	for _, m := range members {
		fmt.Fprintf(&peers, "  - {id: %s, raft: %q, admin: %q}\n", m.id, m.raft, m.admin)
	}
	writeMemberConfig(t, repl, "dr", peers.String(), "info", "initial_cluster_state: existing\n")
	repl.args = nil
	repl.start(t, walden)
	waitFor(t, "the replacement caught up as a voter", 20*time.Second, func() (bool, string) {
		s, err := status(t, waldenctl, survivor.admin)
		if err != nil {
			return false, err.Error()
		}
		voters := 0
		for _, m := range s.Members {
			if m.Role != "learner" {
				voters++
			}
		}
		v, _ := catalogView(t, waldenctl, repl.admin)
		return voters == 2 && v == before, fmt.Sprintf("%+v %s", s, v)
	})
}

// TestProcessSnapshotSaveRestore: waldenctl snapshot save takes the
// leader's state; walden snapshot restore writes the data dirs of a new
// cluster of three under another name; it elects a leader with the same
// catalog, every broker's epoch revoked and new epochs beyond the bump.
func TestProcessSnapshotSaveRestore(t *testing.T) {
	walden, waldenctl := binaries(t)
	dir := t.TempDir()
	src := opsCluster(t, filepath.Join(dir, "src"), 1, 70, "prod", "")
	t.Cleanup(func() { dumpLogs(t, src) })
	src[0].start(t, walden)
	waitLeader(t, waldenctl, admins(src), "")
	writeCatalog(t, "prod", src[0].admin)
	before, err := catalogView(t, waldenctl, src[0].admin)
	if err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(dir, "prod.snap")
	out, errOut, err := ctl(waldenctl, "--endpoints", src[0].admin, "snapshot", "save", file, "-o", "json")
	if err != nil {
		t.Fatalf("snapshot save: %v %s %s", err, out, errOut)
	}
	var saved struct {
		Index   uint64 `json:"index"`
		SHA256  string `json:"sha256"`
		Streams int    `json:"streams"`
		Brokers int    `json:"brokers"`
	}
	if err := json.Unmarshal([]byte(out), &saved); err != nil || saved.Index == 0 || len(saved.SHA256) != 64 || saved.Streams != 3 || saved.Brokers != 2 {
		t.Fatalf("snapshot save -o json: %v\n%s", err, out)
	}
	if _, _, err := ctl(waldenctl, "--endpoints", src[0].admin, "snapshot", "save", file); err == nil {
		t.Fatal("snapshot save overwrote an existing file")
	}
	st, errOut, err := ctl(walden, "snapshot", "status", file, "-o", "json")
	if err != nil || !strings.Contains(st, saved.SHA256) {
		t.Fatalf("walden snapshot status: %v %s %s", err, st, errOut)
	}
	src[0].kill()

	// A new cluster, "prod-restored", of three members on other addresses,
	// with the cluster's bucket: it reconciles its catalog with what was
	// written after the backup before any broker registers.
	s3 := s3test.StartFake(t)
	s3yaml := fmt.Sprintf("s3: {endpoint: %q, region: us-east-1, bucket: %q, path_style: true, access_key_id: x, secret_access_key: y}\n"+
		"recovery: {retry_min: 50ms, retry_max: 200ms, blocked_after: 1s}\n", s3.Endpoint, s3.Bucket)
	dst := opsCluster(t, filepath.Join(dir, "dst"), 3, 80, "prod-restored", s3yaml)
	t.Cleanup(func() { dumpLogs(t, dst) })
	for _, m := range dst {
		out, errOut, err := ctl(walden, "snapshot", "restore", file, "--config", m.config)
		if err != nil {
			t.Fatalf("restore %s: %v %s %s", m.id, err, out, errOut)
		}
	}
	// Refused again: the data dir is not empty any more.
	if _, errOut, err := ctl(walden, "snapshot", "restore", file, "--config", dst[0].config); err == nil || !strings.Contains(errOut, "not empty") {
		t.Fatalf("second restore: %v %s", err, errOut)
	}
	// Refused: a damaged backup (truncated), saying what to do instead;
	// nothing written.
	whole, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	damaged := filepath.Join(dir, "damaged.snap")
	if err := os.WriteFile(damaged, whole[:len(whole)-7], 0o600); err != nil {
		t.Fatal(err)
	}
	fresh := opsCluster(t, filepath.Join(dir, "fresh"), 1, 95, "prod-fresh", s3yaml)
	if _, errOut, err := ctl(walden, "snapshot", "restore", damaged, "--config", fresh[0].config); err == nil ||
		!strings.Contains(errOut, "damaged") || !strings.Contains(errOut, "restore from another backup") || !strings.Contains(errOut, "nothing was written") {
		t.Fatalf("restore of a damaged backup: %v %s", err, errOut)
	}
	if _, err := os.Stat(fresh[0].dataDir); !os.IsNotExist(err) {
		t.Fatalf("a refused restore wrote the data dir: %v", err)
	}
	// Refused: the snapshot's own cluster name.
	same := opsCluster(t, filepath.Join(dir, "same"), 1, 90, "prod", "")
	if _, errOut, err := ctl(walden, "snapshot", "restore", file, "--config", same[0].config); err == nil || !strings.Contains(errOut, "cluster_name") {
		t.Fatalf("restore under the old name: %v %s", err, errOut)
	}
	for _, m := range dst {
		m.start(t, walden)
	}
	leader := waitLeader(t, waldenctl, admins(dst), "")
	t.Logf("restored cluster leads on %s", leader)
	after, err := catalogView(t, waldenctl, admins(dst)...)
	if err != nil || after != before {
		t.Fatalf("catalog after restore:\n%s\nwant\n%s (%v)", after, before, err)
	}
	// The brokers' epochs were revoked; none registers until the catalog
	// is reconciled: RESTORE_RECONCILING, with the phase.
	conn := dial(t, admins(dst))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := waldenv1.NewBrokersClient(conn).GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: "b1"})
	if err != nil || !b.GetBroker().GetFenced() {
		t.Fatalf("b1 after restore: %v %v", b, err)
	}
	register := func() (*waldenv1.RegisterResponse, error) {
		return waldenv1.NewAgentClient(conn).Register(ctx, &waldenv1.RegisterRequest{ClusterName: "prod-restored", BrokerId: "b1", AgentAddr: aliveAgent(t), BrokerAddr: "127.0.0.1:1"})
	}
	if _, err := register(); rpcerr.Reason(err) != refusal.RestoreReconciling {
		t.Fatalf("registration while reconciling: %v", err)
	}
	// The brokers registered no WAL path: their restore jobs block, and an
	// operator resolves them with the WAL declared lost.
	waitFor(t, "the restore jobs blocked on their missing WALs", 30*time.Second, func() (bool, string) {
		out, _, _ := ctl(waldenctl, "--endpoints", strings.Join(admins(dst), ","), "jobs", "--state", "blocked", "-o", "json")
		return strings.Count(out, `"restore": true`) == 2, out
	})
	out, errOut, err = ctl(waldenctl, "--endpoints", strings.Join(admins(dst), ","), "restore", "status")
	if err != nil || !strings.Contains(out, "survey") || !strings.Contains(out, "restore-b1-") {
		t.Fatalf("restore status: %v %s %s", err, out, errOut)
	}
	out, errOut, err = ctl(waldenctl, "--endpoints", strings.Join(admins(dst), ","), "jobs", "--state", "blocked", "-o", "json")
	if err != nil {
		t.Fatalf("jobs: %v %s", err, errOut)
	}
	var blocked struct {
		Jobs []struct {
			JobID string `json:"job_id"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &blocked); err != nil {
		t.Fatal(err)
	}
	for _, j := range blocked.Jobs {
		if out, errOut, err := ctl(waldenctl, "--endpoints", strings.Join(admins(dst), ","), "jobs", "resolve", j.JobID,
			"--reason", "test brokers without a WAL", "--wal-lost"); err != nil {
			t.Fatalf("resolve %s: %v %s %s", j.JobID, err, out, errOut)
		}
	}
	out, errOut, err = ctl(waldenctl, "--endpoints", strings.Join(admins(dst), ","), "--timeout", "60s", "restore", "status", "--wait")
	if err != nil || !strings.Contains(out, "done") {
		t.Fatalf("restore status --wait: %v %s %s", err, out, errOut)
	}
	t.Logf("restore status --wait:\n%s", out)
	var r *waldenv1.RegisterResponse
	waitFor(t, "b1 registers again", 10*time.Second, func() (bool, string) {
		r, err = register()
		return err == nil, fmt.Sprint(err)
	})
	if r.GetEpoch() < 1_000_000 {
		t.Fatalf("epoch %d after restore, want past the bump", r.GetEpoch())
	}
}
