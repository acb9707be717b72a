package recovery_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"walden/objformat"
	"walden/objstore"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
	"walden/refusal"
)

// TestRecoverCommitsEachRecordOnce runs a whole recovery on one member:
// every record at or beyond the end offsets is committed exactly once and
// in order, the gap is reported, every stream is closed, and running the
// finished job again commits nothing.
func TestRecoverCommitsEachRecordOnce(t *testing.T) {
	for name, start := range s3test.Backends() {
		t.Run(name, func(t *testing.T) {
			s3cfg := start(t)
			c := newTestCluster(t, "c1", "c2", "c3")
			sc := newScenario(t, c, t.TempDir(), 40, 300<<10) // ~12 MiB per stream: several objects
			store := newStore(t, s3cfg)
			cfg := testConfig()
			exe := newExecutor(c, "c1", cfg, store, nil, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := recovery.NewRunner(cfg, "c1", c.s, c.Member("c1"), exe, testLogger())
			done := make(chan struct{})
			go func() { r.Run(ctx); close(done) }()
			j := c.declare(sc.broker, sc.epoch, "c1")
			j = waitJob(t, c, j.GetJobId(), 30*time.Second, "succeeded", func(j *waldenv1.Job) bool { return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED })
			checkCommitted(t, c, store, sc)
			// The producer of stream 2's batches is committed with its last
			// batch, for the stream's next owner.
			last := sc.want[2][len(sc.want[2])-1]
			if got := c.s.Producers(2); len(got) != 1 || got[0].GetProducerId() != 77 || got[0].GetSequence() != last.BaseOffset ||
				got[0].GetOffset() != last.BaseOffset || got[0].GetCount() != last.Count {
				t.Fatalf("producers of stream 2 %v, want producer 77's batch at %d", got, last.BaseOffset)
			}
			if len(j.GetGaps()) != 1 || !strings.Contains(j.GetGaps()[0], "stream 3: gap at offset 4") {
				t.Fatalf("gaps %q, want stream 3's", j.GetGaps())
			}
			if j.GetBytesUploaded() != j.GetBytesTotal() || j.GetBytesTotal() == 0 || j.GetStreamsClosed() != 3 || j.GetStreamsTotal() != 3 {
				t.Fatalf("progress: %d/%d bytes, %d/%d streams", j.GetBytesUploaded(), j.GetBytesTotal(), j.GetStreamsClosed(), j.GetStreamsTotal())
			}
			if len(j.GetObjects()) < 3 {
				t.Fatalf("committed %d objects, want several (object_size %d)", len(j.GetObjects()), cfg.ObjectSize)
			}
			b, _ := c.s.Broker(sc.broker)
			if b.GetRecoveredWalOffset() <= 0 || b.GetRecoveredWalOffset() != j.GetRecoveredWalOffset() {
				t.Fatalf("recovered_wal_offset broker %d job %d", b.GetRecoveredWalOffset(), j.GetRecoveredWalOffset())
			}
			cancel()
			<-done

			// Running the finished job again commits nothing.
			before := len(c.s.StreamObjects(2, 0, 0))
			err := exe.Run(context.Background(), j.GetJobId(), j.GetAttempt())
			if !errors.Is(err, recovery.ErrStale) {
				t.Fatalf("run of a finished job: %v, want ErrStale", err)
			}
			if after := len(c.s.StreamObjects(2, 0, 0)); after != before {
				t.Fatalf("objects of stream 2: %d after the rerun, %d before", after, before)
			}
			checkCommitted(t, c, store, sc)
			// Nothing uncommitted is left under the job's prefix.
			keys := keysUnder(t, store, recovery.JobPrefix(store.Prefix(), sc.broker, j.GetToken()))
			if len(keys) != len(j.GetObjects()) {
				t.Fatalf("%d keys under the job prefix, %d committed objects", len(keys), len(j.GetObjects()))
			}
		})
	}
}

// TestFencedBrokerRefused: once declared failed, the broker's own
// CommitObject and OpenStream are refused NODE_FENCED, while the job's
// failover commit of the current attempt is accepted and a stale attempt's
// is refused STALE_ATTEMPT.
func TestFencedBrokerRefused(t *testing.T) {
	c := newTestCluster(t, "c1", "c2")
	sc := newScenario(t, c, t.TempDir(), 2, 64)
	j := c.declare(sc.broker, sc.epoch, "c1")
	_, err := c.apply("c1", op(&waldenv1.CommitObjectRequest{BrokerId: sc.broker, BrokerEpoch: sc.epoch, Object: &waldenv1.Object{
		ObjectId: "late", Size: 200, Ranges: []*waldenv1.ObjectRange{{StreamId: 2, StreamEpoch: 1, StartOffset: 0, EndOffset: 1, Position: 16, Length: 16}}}}))
	if refusal.Of(err) != "NODE_FENCED" {
		t.Fatalf("fenced commit: %v, want NODE_FENCED", err)
	}
	_, err = c.apply("c1", op(&waldenv1.OpenStreamRequest{BrokerId: sc.broker, BrokerEpoch: sc.epoch, StreamId: 9}))
	if refusal.Of(err) != "NODE_FENCED" {
		t.Fatalf("fenced open: %v, want NODE_FENCED", err)
	}
	c.must(&waldenv1.ReassignJob{JobId: j.GetJobId(), Attempt: 1, LiveMembers: []string{"c2"}})
	_, err = c.apply("c1", op(&waldenv1.CommitObjectRequest{BrokerId: sc.broker, BrokerEpoch: j.GetToken(),
		Failover: &waldenv1.FailoverContext{JobId: j.GetJobId(), Attempt: 1, Token: j.GetToken()},
		Object:   &waldenv1.Object{ObjectId: "stale", Size: 200, Ranges: []*waldenv1.ObjectRange{{StreamId: 2, StreamEpoch: 1, StartOffset: 0, EndOffset: 3, Position: 16, Length: 16}}}}))
	if refusal.Of(err) != "STALE_ATTEMPT" {
		t.Fatalf("stale attempt commit: %v, want STALE_ATTEMPT", err)
	}
	// An executor of the stale attempt stops at once, without side effects.
	exe := newExecutor(c, "c1", testConfig(), nil, nil, nil)
	if err := exe.Run(context.Background(), j.GetJobId(), 1); !errors.Is(err, recovery.ErrStale) {
		t.Fatalf("stale executor: %v, want ErrStale", err)
	}
	if n := len(c.s.StreamObjects(2, 0, 0)); n != 0 {
		t.Fatalf("stream 2 has %d objects", n)
	}
}

// gate is a proxy in front of S3 that holds every upload request (PUT,
// POST) while closed, until the client gives up.
type gate struct {
	closed  atomic.Bool
	holding atomic.Int32
}

func startGate(t *testing.T, endpoint string) (*gate, string) {
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{}
	release := make(chan struct{})
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.closed.Load() && (r.Method == http.MethodPut || r.Method == http.MethodPost) {
			g.holding.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
			case <-release:
			}
			http.Error(w, "gate closed", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	return g, srv.URL
}

// TestReassignAfterAssigneeKilledMidUpload: the assignee is killed while
// its upload hangs; the leader reassigns after job_lease, the new assignee
// completes, no offset is committed twice, the stale attempt's commit is
// refused, and the dead attempt's leftovers are cleaned up.
func TestReassignAfterAssigneeKilledMidUpload(t *testing.T) {
	s3cfg := s3test.StartFake(t)
	c := newTestCluster(t, "c1", "c2", "c3")
	c.setLeader("c3")
	sc := newScenario(t, c, t.TempDir(), 30, 300<<10)
	cfg := testConfig()

	g, gated := startGate(t, s3cfg.Endpoint)
	g.closed.Store(true)
	c1cfg := s3cfg
	c1cfg.Endpoint = gated
	stores := map[string]*objstore.Client{"c1": newStore(t, c1cfg), "c2": newStore(t, s3cfg), "c3": newStore(t, s3cfg)}
	c.seed(stores["c2"]) // c1's store holds every upload
	cancels := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	for _, id := range []string{"c1", "c2", "c3"} {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[id] = cancel
		r := recovery.NewRunner(cfg, id, c.s, c.Member(id), newExecutor(c, id, cfg, stores[id], nil, nil), testLogger())
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
		wg.Wait()
	}()

	j := c.declare(sc.broker, sc.epoch, "c1")
	if j.GetAssigneeId() != "c1" {
		t.Fatalf("assignee %q", j.GetAssigneeId())
	}
	waitJob(t, c, j.GetJobId(), 10*time.Second, "upload in flight on c1", func(j *waldenv1.Job) bool {
		return j.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING && j.GetJobStep() == waldenv1.JobStep_JOB_STEP_UPLOAD && g.holding.Load() > 0
	})
	// Kill c1: its loops stop and its raft node is gone.
	c.setDown("c1", true)
	cancels["c1"]()
	j = waitJob(t, c, j.GetJobId(), 30*time.Second, "succeeded", func(j *waldenv1.Job) bool { return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED })
	if j.GetAttempt() != 2 || j.GetAssigneeId() != "c2" {
		t.Fatalf("finished attempt %d on %q, want attempt 2 on c2", j.GetAttempt(), j.GetAssigneeId())
	}
	checkCommitted(t, c, stores["c2"], sc)
	for _, o := range j.GetObjects() {
		if ob, _ := c.s.Object(o); ob.GetJobId() != j.GetJobId() {
			t.Fatalf("object %s of job %q", o, ob.GetJobId())
		}
	}
	// The dead attempt comes back: its commit is refused.
	c.setDown("c1", false)
	_, err := c.apply("c1", op(&waldenv1.CommitObjectRequest{BrokerId: sc.broker, BrokerEpoch: j.GetToken(),
		Failover: &waldenv1.FailoverContext{JobId: j.GetJobId(), Attempt: 1, Token: j.GetToken()},
		Object: &waldenv1.Object{ObjectId: objformat.ObjectID(sc.broker, j.GetToken(), 1, 2), Size: 200,
			Ranges: []*waldenv1.ObjectRange{{StreamId: 2, StreamEpoch: 1, StartOffset: 0, EndOffset: 3, Position: 16, Length: 16}}}}))
	if !errors.Is(err, refusal.ErrStaleAttempt) && !errors.Is(err, refusal.ErrJobNotRunning) {
		t.Fatalf("stale attempt's commit: %v, want refused", err)
	}
	ups, err := stores["c2"].ListIncompleteUploads(context.Background(), recovery.JobPrefix("", sc.broker, j.GetToken()))
	if err != nil || len(ups) != 0 {
		t.Fatalf("incomplete uploads left: %v %v", ups, err)
	}
}

// TestCorruptTail: a damaged record in the WAL's last block is skipped;
// only valid records are committed and the job and an event say how many
// bytes were skipped.
func TestCorruptTail(t *testing.T) {
	s3cfg := s3test.StartFake(t)
	c := newTestCluster(t, "c1")
	sc := newScenario(t, c, t.TempDir(), 4, 100)
	// Corrupt the body of the last record of stream 2 (mid-block).
	last := sc.want[2][len(sc.want[2])-1]
	corruptPayload(t, sc.walPath, last.Payload)
	sc.want[2] = sc.want[2][:len(sc.want[2])-1]
	cfg := testConfig()
	store := newStore(t, s3cfg)
	exe := newExecutor(c, "c1", cfg, store, nil, nil)
	j := c.declare(sc.broker, sc.epoch, "c1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := exe.Run(ctx, j.GetJobId(), 1); err != nil {
		t.Fatal(err)
	}
	j, _ = c.s.Job(j.GetJobId())
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED || j.GetSkippedBytes() == 0 {
		t.Fatalf("job %s, skipped %d bytes", j.GetJobState().Name(), j.GetSkippedBytes())
	}
	found := false
	for _, ev := range c.s.Events(sc.broker, 0) {
		if ev.GetEventKind() == waldenv1.EventKind_EVENT_KIND_RECOVERY && strings.Contains(ev.GetMessage(), "skipped") && strings.Contains(ev.GetMessage(), "record body crc") {
			found = true
			// The note names the job's step, attempt and epoch as fields.
			if d := ev.GetDetail(); d.GetJobStep() != waldenv1.JobStep_JOB_STEP_READ || d.GetAttempt() != 1 || d.GetEpoch() != j.GetToken() || d.GetMember() == "" {
				t.Errorf("recovery note's fields: %v", d)
			}
		}
	}
	if !found {
		t.Fatalf("no recovery event telling the skipped bytes: %v", c.s.Events(sc.broker, 0))
	}
	checkCommitted(t, c, store, sc)
}

// corruptPayload flips a byte of the one record whose payload is p.
func corruptPayload(t *testing.T, path string, p []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndex(string(data), string(p))
	if i < 0 {
		t.Fatal("payload not found in the WAL")
	}
	data[i+len(p)/2] ^= 0xFF
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestS3DownRetries: with S3 down the job retries with backoff, shows the
// error and is never marked succeeded; once S3 is back it completes.
func TestS3DownRetries(t *testing.T) {
	dir := t.TempDir()
	fs, err := objstore.ServeFake("", dir, nil, s3test.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	addr := fs.Addr().String()
	s3cfg := objstore.FakeConfig(fs.Endpoint, s3test.Bucket)
	c := newTestCluster(t, "c1")
	sc := newScenario(t, c, t.TempDir(), 6, 1000)
	cfg := testConfig()
	store := newStore(t, s3cfg)
	exe := newExecutor(c, "c1", cfg, store, nil, nil) // seeds the objects committed before
	fs.Kill()                                         // S3 down from the start of the recovery
	ctx, cancel := context.WithCancel(context.Background())
	r := recovery.NewRunner(cfg, "c1", c.s, c.Member("c1"), exe, testLogger())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	j := c.declare(sc.broker, sc.epoch, "c1")
	waitJob(t, c, j.GetJobId(), 10*time.Second, "error shown after retries", func(j *waldenv1.Job) bool {
		return j.GetError() != "" && strings.Contains(j.GetError(), "retry 3")
	})
	if j, _ := c.s.Job(j.GetJobId()); j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatal("succeeded with S3 down")
	}
	fs2, err := objstore.ServeFake(addr, dir, nil, s3test.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	defer fs2.Close(context.Background())
	j = waitJob(t, c, j.GetJobId(), 30*time.Second, "succeeded once S3 is back", func(j *waldenv1.Job) bool { return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED })
	if j.GetError() != "" || j.GetAttempt() != 1 {
		t.Fatalf("error %q attempt %d after success", j.GetError(), j.GetAttempt())
	}
	checkCommitted(t, c, store, sc)
}
