package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/internal/devcluster"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// full runs every scenario; without it only TestE2EShort* runs (the form
// `go test ./...` and `make test` run).
var full = flag.Bool("e2e.full", false, "run every end-to-end scenario, not only the short form")

func needFull(t *testing.T) {
	t.Helper()
	if !*full {
		t.Skip("full end-to-end scenario: run with -e2e.full (make e2e)")
	}
}

// Binaries built once by TestMain.
var (
	waldenBin    string
	waldenctlBin string
)

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "walden-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	waldenBin, waldenctlBin = filepath.Join(dir, "walden"), filepath.Join(dir, "waldenctl")
	for _, b := range [][2]string{{waldenBin, "walden/cmd/walden"}, {waldenctlBin, "walden/cmd/waldenctl"}} {
		out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go build %s: %v\n%s", b[1], err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testPolicy shortens detection so that each scenario stays short; the
// assertions are about outcomes, never about these timings.
var testPolicy = []string{"failure_timeout: 2s", "lease_ttl: 1s", "drift_margin: 200ms"}

// startCluster starts versitygw (the test is skipped when it is not
// installed), three coordinators and three brokers as processes; every
// process is killed at the end of the test, and on failure the tail of
// each log is printed.
func startCluster(t *testing.T, edit func(*devcluster.Options)) *devcluster.Cluster {
	t.Helper()
	s3 := s3test.StartVersity(t, "")
	opts := devcluster.Options{Bin: waldenBin, Dir: t.TempDir(), S3: &s3, Policy: testPolicy,
		Recovery: []string{"job_lease: 3s"}}
	if edit != nil {
		edit(&opts)
	}
	c, err := devcluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if t.Failed() {
			dumpLogs(t, c)
		}
	})
	if err := c.Start(context.Background(), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// readerID is the identity the tests read the cluster with from the
// command line.
var readerID = authz.Identity{Name: "e2e-reader", Role: authz.RoleReader}

// clientFlags are c.ClientFlags(id), or the test fails.
func clientFlags(t *testing.T, c *devcluster.Cluster, id authz.Identity) []string {
	t.Helper()
	f, err := c.ClientFlags(id)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func dumpLogs(t *testing.T, c *devcluster.Cluster) {
	for _, p := range append(append([]*devcluster.Proc{}, c.Coords...), c.Brokers...) {
		b, err := os.ReadFile(p.Log)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		t.Logf("---- %s (%s), last lines:\n%s", p.Name, p.Log, strings.Join(lines, "\n"))
	}
}

func logSay(t *testing.T) func(string) {
	return func(line string) { t.Logf("%s %s", time.Now().Format("15:04:05.000"), line) }
}

// checkNothingLost asserts the verify outcome of a scenario: every
// acknowledged record at its offset, no gaps, and no record twice: an
// append the broker made durable but never answered (killed or stopped in
// between) is recovered from its WAL, and the producer's retry of it (on
// another broker) is answered with the stored offsets (the load generator
// is an idempotent producer).
func checkNothingLost(t *testing.T, s *devcluster.Summary) {
	t.Helper()
	if s.Acked == 0 {
		t.Fatalf("no record acknowledged: %+v", s)
	}
	if s.Lost != 0 || s.Gaps != 0 || s.Duplicates != 0 || s.Present != s.Acked {
		t.Fatalf("acked %d present %d lost %d gaps %d duplicates %d", s.Acked, s.Present, s.Lost, s.Gaps, s.Duplicates)
	}
	t.Logf("verify: acked %d, present %d, lost 0, gaps 0, duplicates 0; retried records found stored %d", s.Acked, s.Present, s.DuplicateAcks)
}

// checkReopenedElsewhere asserts that every stream the victim owned at the
// kill is OPENED by another broker with a higher stream epoch.
func checkReopenedElsewhere(t *testing.T, c *devcluster.Cluster, victim string) {
	t.Helper()
	ss, err := c.ListStreams(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	vp := c.Proc(victim)
	mine := map[uint64]bool{}
	for _, id := range vp.Streams {
		mine[id] = true
	}
	for _, s := range ss {
		if !mine[s.GetStreamId()] {
			continue
		}
		if s.GetState() != "opened" || s.GetOwnerBrokerId() == victim || s.GetOwnerBrokerId() == "" || s.GetEpoch() < 2 {
			t.Errorf("stream %d after the failover of %s: %v", s.GetStreamId(), victim, s)
		}
	}
}

// TestE2EShortKillBrokerAndRestart: kill -9 a broker under load; its
// streams reopen on the other brokers, nothing acknowledged is lost, no
// gaps; `walden verify` agrees; the killed broker restarts, registers with
// a new epoch and serves again.
func TestE2EShortKillBrokerAndRestart(t *testing.T) {
	c := startCluster(t, nil)
	ctx := context.Background()
	sc := &devcluster.Failover{Warmup: 3 * time.Second, Say: logSay(t)}
	sum, err := sc.Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, sum)
	checkReopenedElsewhere(t, c, sum.Victim)
	if sum.NewEpoch <= sum.OldEpoch {
		t.Fatalf("epoch %d -> %d: the failover did not fence", sum.OldEpoch, sum.NewEpoch)
	}

	// The command-line verify over the same ledger.
	// A reader's certificate is enough to verify.
	out, err := exec.Command(waldenBin, append([]string{"verify", "--coordinators", strings.Join(c.AdminAddrs(), ","),
		"--ledger", filepath.Join(c.Opts.Dir, "ledger.jsonl"), "-o", "json"}, clientFlags(t, c, readerID)...)...).Output()
	if err != nil {
		t.Fatalf("walden verify: %v\n%s", err, out)
	}
	var v struct{ Acked, Present, Lost, Gaps, Duplicates int64 }
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("walden verify -o json: %v\n%s", err, out)
	}
	if v.Acked != sum.Acked || v.Lost != 0 || v.Gaps != 0 || v.Duplicates != 0 {
		t.Fatalf("walden verify: %s", out)
	}

	// The killed broker restarts: a new epoch, serving, and reads work.
	victim := c.Proc(sum.Victim)
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	var st *waldenv1.BrokerStatusResponse
	err = devcluster.Poll(ctx, 60*time.Second, sum.Victim+" serving again", func() error {
		b, err := c.GetBroker(ctx, sum.Victim)
		if err != nil {
			return err
		}
		if b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_ALIVE || b.GetFenced() || b.GetEpoch() <= sum.NewEpoch {
			return fmt.Errorf("registry: state %s fenced %v epoch %d (fenced epoch %d)", b.GetBrokerState().Name(), b.GetFenced(), b.GetEpoch(), sum.NewEpoch)
		}
		st, err = c.BrokerStatus(ctx, victim)
		if err != nil {
			return err
		}
		if !st.GetServing() || !st.GetLeaseValid() || st.GetFenced() || st.GetBrokerEpoch() != b.GetEpoch() {
			return fmt.Errorf("broker status %v", st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s serves again with epoch %d", sum.Victim, st.GetBrokerEpoch())
	cc, err := c.Conn(victim.Listen)
	if err != nil {
		t.Fatal(err)
	}
	stream := victim.Streams[0]
	r, err := waldenv1.NewBrokerAPIClient(cc).Read(ctx, &waldenv1.ReadRequest{StreamId: stream, MaxRecords: 10})
	if err != nil || len(r.GetRecords()) == 0 {
		t.Fatalf("read stream %d through the restarted %s: %v %v", stream, sum.Victim, r, err)
	}
	// Its old stream belongs to another broker now: an append is refused
	// with NOT_OWNER naming the owner, never acknowledged.
	_, err = waldenv1.NewBrokerAPIClient(cc).Append(ctx, &waldenv1.AppendRequest{StreamId: stream, Records: [][]byte{[]byte("x")}})
	if reason := rpcerr.Reason(err); reason != refusal.NotOwner {
		t.Fatalf("append to stream %d on the restarted %s: %v (reason %q)", stream, sum.Victim, err, reason)
	}
}

// TestE2EZombieBroker: SIGSTOP a broker past failure_timeout; it is failed
// over. SIGCONT: the appends it finds waiting are refused (its lease ran out
// while it was stopped, then the cluster tells it it is fenced), the catalog
// refuses its old epoch, and nothing acknowledged is lost.
func TestE2EZombieBroker(t *testing.T) {
	needFull(t)
	c := startCluster(t, nil)
	ctx := context.Background()
	var reasons []string
	sc := &devcluster.Failover{Warmup: 3 * time.Second, Say: logSay(t), Signal: syscall.SIGSTOP}
	var zombieEpoch uint64
	sc.BeforeKill = func(ctx context.Context) error {
		b, err := c.GetBroker(ctx, sc.Victim)
		zombieEpoch = b.GetEpoch()
		return err
	}
	sc.AfterFailover = func(ctx context.Context) error {
		v := c.Proc(sc.Victim)
		// The zombie is still stopped and fenced: the catalog refuses its
		// epoch with NODE_FENCED.
		old, err := c.GetBroker(ctx, sc.Victim)
		if err != nil {
			return err
		}
		if !old.GetFenced() {
			return fmt.Errorf("%s not fenced after the failover: %v", sc.Victim, old)
		}
		if reason := catalogAsOldEpoch(t, c, sc.Victim, zombieEpoch); reason != "NODE_FENCED" {
			return fmt.Errorf("catalog: the zombie's epoch refused with %q, want NODE_FENCED", reason)
		}
		cc, err := c.Conn(v.Listen)
		if err != nil {
			return err
		}
		api := waldenv1.NewBrokerAPIClient(cc)
		// Appends sent while the broker is stopped wait in its socket; the
		// broker handles them first thing when it continues.
		var wg sync.WaitGroup
		var mu sync.Mutex
		var acked []string
		for i, id := range v.Streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				r, err := api.Append(actx, &waldenv1.AppendRequest{StreamId: id, Records: [][]byte{[]byte(fmt.Sprintf("zombie-%d", i))}})
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					acked = append(acked, fmt.Sprintf("stream %d offset %d epoch %d", id, r.GetBaseOffset(), r.GetBrokerEpoch()))
					return
				}
				reasons = append(reasons, fmt.Sprintf("%s/%s", status.Code(err), rpcerr.Reason(err)))
			}()
		}
		time.Sleep(300 * time.Millisecond)
		if err := v.Signal(syscall.SIGCONT); err != nil {
			return err
		}
		wg.Wait()
		if len(acked) > 0 {
			return fmt.Errorf("the zombie acknowledged appends: %v", acked)
		}
		t.Logf("the zombie's appends were refused: %v", reasons)
		return nil
	}
	sum, err := sc.Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, sum)
	checkReopenedElsewhere(t, c, sum.Victim)
	sawFence := false
	for _, r := range reasons {
		if strings.HasSuffix(r, "/"+string(refusal.LeaseInvalid)) || strings.HasSuffix(r, "/"+string(refusal.NodeFenced)) {
			sawFence = true
		}
	}
	if !sawFence {
		t.Fatalf("no LEASE_INVALID or NODE_FENCED refusal among %v", reasons)
	}
	// After SIGCONT the broker registered again: its old epoch is refused
	// still, now as an expired one (or still fenced).
	if reason := catalogAsOldEpoch(t, c, sum.Victim, sum.OldEpoch); reason != "NODE_FENCED" && reason != "EPOCH_EXPIRED" {
		t.Fatalf("catalog OpenStream with the zombie's old epoch %d after SIGCONT: reason %q", sum.OldEpoch, reason)
	}
}

// catalogAsOldEpoch asks the catalog, as broker id with the given epoch, to
// open id's first stream, and returns the refusal's reason ("" if it was
// accepted).
func catalogAsOldEpoch(t *testing.T, c *devcluster.Cluster, id string, epoch uint64) string {
	t.Helper()
	var catErr error
	// As the broker itself: its certificate is the one the catalog lets
	// write its streams.
	self := authz.Identity{Name: id, Role: authz.RoleBroker, BrokerID: id}
	err := c.CallAs(context.Background(), self, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, catErr = waldenv1.NewCatalogClient(cc).OpenStream(ctx, &waldenv1.OpenStreamRequest{
			BrokerId: id, BrokerEpoch: epoch, StreamId: c.Proc(id).Streams[0]})
		if status.Code(catErr) == codes.Unavailable {
			return catErr
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	reason := rpcerr.Reason(catErr)
	t.Logf("catalog OpenStream as %s epoch %d: %v (reason %q)", id, epoch, catErr, reason)
	return string(reason)
}

// waldenctlJobs runs `waldenctl jobs -o json` against the cluster.
func waldenctlJobs(ctx context.Context, c *devcluster.Cluster, broker string) ([]map[string]any, error) {
	flags, err := c.ClientFlags(readerID)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, waldenctlBin, append([]string{"--endpoints", strings.Join(liveAdmins(c), ","), "jobs", "--broker", broker, "-o", "json"}, flags...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("waldenctl jobs: %v: %s", err, stderr.String())
	}
	var resp struct {
		Jobs []map[string]any `json:"jobs"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		return nil, fmt.Errorf("waldenctl jobs -o json: %v: %s", err, out)
	}
	return resp.Jobs, nil
}

func liveAdmins(c *devcluster.Cluster) []string {
	var out []string
	for _, m := range c.Coords {
		if m.Alive() {
			out = append(out, m.Admin)
		}
	}
	return out
}

// TestE2EKillRecoveryExecutor: the dead broker leaves a large WAL not yet
// uploaded; the coordinator executing its recovery (found with `waldenctl
// jobs -o json`) is killed with SIGKILL in the upload step; the job is
// reassigned and completes on another coordinator; nothing is lost.
func TestE2EKillRecoveryExecutor(t *testing.T) {
	needFull(t)
	const backlog = 128 << 20
	c := startCluster(t, func(o *devcluster.Options) {
		o.BacklogStreams = true
		o.WALCapacity = 2*backlog + 64<<20
		o.UploadBytes, o.UploadInterval = o.WALCapacity/2, time.Hour
		// One upload at a time, in small parts: the upload step lasts.
		o.Recovery = append(o.Recovery, "upload_concurrency: 1", "part_size: 5242880")
	})
	ctx := context.Background()
	var killed string
	var inUpload time.Time
	sc := &devcluster.Failover{Warmup: 2 * time.Second, Backlog: backlog, Say: logSay(t)}
	sc.DuringRecovery = func(ctx context.Context, _ *waldenv1.Job) (bool, error) {
		jobs, err := waldenctlJobs(ctx, c, sc.Victim)
		if err != nil || len(jobs) == 0 {
			return false, nil // not visible yet
		}
		j := jobs[len(jobs)-1]
		state, step, assignee := fmt.Sprint(j["state"]), fmt.Sprint(j["step"]), fmt.Sprint(j["assignee_id"])
		switch {
		case state == "running" && step == "upload" && assignee != "":
			// Kill once bytes are reported uploaded, or 300ms into the
			// step (parts in flight), whichever comes first.
			if inUpload.IsZero() {
				inUpload = time.Now()
			}
			if fmt.Sprint(j["bytes_uploaded"]) == "0" && time.Since(inUpload) < 300*time.Millisecond {
				return false, nil
			}
			p := c.Proc(assignee)
			if p == nil {
				return false, fmt.Errorf("job assignee %q is not a coordinator", assignee)
			}
			t.Logf("kill -9 %s, executing job %v in step %s (%v of %v bytes uploaded)", assignee, j["job_id"], step, j["bytes_uploaded"], j["bytes_total"])
			p.Kill()
			killed = assignee
			return true, nil
		case state == "running" || state == "pending":
			return false, nil
		default:
			return false, fmt.Errorf("the job reached %s/%s before its upload could be interrupted: %v", state, step, j)
		}
	}
	sum, err := sc.Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, sum)
	checkReopenedElsewhere(t, c, sum.Victim)
	if killed == "" || sum.JobAssignee == killed || sum.JobAttempts < 2 {
		t.Fatalf("job %s finished on %s at attempt %d; killed executor %q", sum.JobID, sum.JobAssignee, sum.JobAttempts, killed)
	}
	if sum.UploadedBytes < backlog {
		t.Fatalf("job uploaded %d bytes, the backlog was %d", sum.UploadedBytes, backlog)
	}
	t.Logf("job %s completed on %s at attempt %d after %s was killed", sum.JobID, sum.JobAssignee, sum.JobAttempts, killed)
}

// TestE2EKillLeaderDuringFailover: the raft leader is killed with SIGKILL
// while the coordinators suspect the killed broker; the new leader decides,
// fences and recovers; nothing is lost.
func TestE2EKillLeaderDuringFailover(t *testing.T) {
	needFull(t)
	c := startCluster(t, nil)
	ctx := context.Background()
	var oldLeader string
	sc := &devcluster.Failover{Warmup: 3 * time.Second, Say: logSay(t)}
	sc.AfterKill = func(ctx context.Context) error {
		err := devcluster.Poll(ctx, 30*time.Second, sc.Victim+" suspected", func() error {
			b, err := c.GetBroker(ctx, sc.Victim)
			if err != nil {
				return err
			}
			if b.GetBrokerState() == waldenv1.BrokerState_BROKER_STATE_ALIVE {
				return fmt.Errorf("state %s", b.GetBrokerState().Name())
			}
			if b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_SUSPECT {
				return devcluster.Permanent(fmt.Errorf("the broker is %s before the leader could be killed", b.GetBrokerState().Name()))
			}
			return nil
		})
		if err != nil {
			return err
		}
		l, err := c.WaitLeader(ctx, "", 10*time.Second)
		if err != nil {
			return err
		}
		t.Logf("kill -9 the raft leader %s while %s is suspect", l.Name, sc.Victim)
		l.Kill()
		oldLeader = l.Name
		return nil
	}
	sum, err := sc.Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, sum)
	checkReopenedElsewhere(t, c, sum.Victim)
	l, err := c.WaitLeader(ctx, oldLeader, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover completed under the new leader %s (job %s on %s)", l.Name, sum.JobID, sum.JobAssignee)
	if sum.JobAssignee == oldLeader {
		t.Fatalf("the job finished on the killed leader %s", oldLeader)
	}
}

// TestE2EDevCommand runs `walden dev -o json` itself (its own `walden s3`,
// the demo policy) and checks its summary: every required key a JSON number,
// nothing lost, exit status 0.
// TestE2EShortDevCommand runs `walden dev -o json` as a user does: the
// victim is killed while its WAL holds records S3 lacks, and the summary
// reports what the recovery read from it and uploaded, never nothing.
func TestE2EShortDevCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, waldenBin, "dev", "-o", "json", "--policy", "demo", "--warmup", "2s", "--dir", t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("walden dev: %v\n%s\n%s", err, out, stderr.String())
	}
	var sum map[string]any
	if err := json.Unmarshal(out, &sum); err != nil {
		t.Fatalf("walden dev -o json: %v\n%s", err, out)
	}
	for _, k := range []string{"acked", "lost", "gaps", "detection_ms", "recovery_ms", "max_unavailable_ms", "median_unavailable_ms",
		"backlog_bytes", "uploaded_bytes", "records_recovered"} {
		if _, ok := sum[k].(float64); !ok {
			t.Errorf("summary key %q: %v (%T), want a JSON number", k, sum[k], sum[k])
		}
	}
	if sum["lost"] != 0.0 || sum["gaps"] != 0.0 || sum["acked"] == 0.0 || sum["policy"] != "demo" {
		t.Fatalf("summary: %s", out)
	}
	if sum["backlog_bytes"] == 0.0 || sum["uploaded_bytes"] == 0.0 || sum["records_recovered"] == 0.0 {
		t.Fatalf("the failover recovered nothing from the victim's WAL: %s", out)
	}
	t.Logf("recovered %v bytes in %v record batches (%v bytes not in S3 at the kill)", sum["uploaded_bytes"], sum["records_recovered"], sum["backlog_bytes"])
}
