package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/config"
	"walden/fsm"
	"walden/objformat"
	"walden/objstore"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/wal"
)

// uploadGate is a proxy in front of S3 that holds upload requests (PUT,
// POST) while closed.
type uploadGate struct {
	closed  atomic.Bool
	holding atomic.Int32
	url     string
}

func newUploadGate(t *testing.T, endpoint string) *uploadGate {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	g := &uploadGate{}
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
	g.url = srv.URL
	return g
}

// TestRecoveryReassignedAcrossCoordinators runs three real coordinators:
// the job's assignee is killed while its upload hangs; the leader (perhaps
// a new one) reassigns the job after job_lease, another coordinator
// completes it, and every offset is committed once.
func TestRecoveryReassignedAcrossCoordinators(t *testing.T) {
	s3cfg := s3test.StartFake(t)
	ids := []string{"c1", "c2", "c3"}
	initial, listeners := bindMembers(t, ids...)
	gates := map[string]*uploadGate{}
	cancels := map[string]context.CancelFunc{}
	dones := map[string]chan error{}
	conns := map[string]*grpc.ClientConn{}
	for _, m := range initial {
		gates[m.ID] = newUploadGate(t, s3cfg.Endpoint)
		gates[m.ID].closed.Store(true)
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "rec", m.ID
		cfg.DataDir = filepath.Join(t.TempDir(), m.ID)
		cfg.Listen = config.Listen{Admin: m.Admin, Raft: m.Raft}
		cfg.InitialCluster = initial
		cfg.Raft.TickInterval = 20 * time.Millisecond
		cfg.S3 = s3cfg
		cfg.S3.Endpoint = gates[m.ID].url
		cfg.Recovery.JobLease = time.Second
		cfg.Recovery.RetryMin, cfg.Recovery.RetryMax = 20*time.Millisecond, 200*time.Millisecond
		cfg.Recovery.PartSize, cfg.Recovery.ObjectSize = 5<<20, 5<<20
		s, err := New(cfg, nil, WithListeners(listeners[m.ID]))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		cancels[m.ID], dones[m.ID] = cancel, done
		conn, err := grpc.NewClient(m.Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conns[m.ID] = conn
	}
	t.Cleanup(func() {
		for id, cancel := range cancels {
			cancel()
			select {
			case <-dones[id]:
			case <-time.After(10 * time.Second):
				t.Errorf("%s: Run did not return", id)
			}
		}
	})
	for _, id := range ids {
		waitServing(t, conns[id])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := conns["c1"]
	catalog := waldenv1.NewCatalogClient(conn)

	walPath := filepath.Join(t.TempDir(), "b1.wal")
	reg, err := waldenv1.NewAgentClient(conn).Register(ctx, &waldenv1.RegisterRequest{ClusterName: "rec", BrokerId: "b1",
		AgentAddr: "127.0.0.1:1", Wal: &waldenv1.WalLocation{Path: walPath}})
	if err != nil {
		t.Fatal(err)
	}
	grantLease(t, ctx, "b1", reg.GetEpoch(), conns["c1"], conns["c2"], conns["c3"])
	// Maintenance keeps the detector from failing it over on its own.
	if _, err := waldenv1.NewBrokersClient(conn).SetMaintenance(ctx, &waldenv1.SetMaintenanceRequest{BrokerId: "b1", On: true}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{1, 2} {
		if _, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: reg.GetEpoch(), StreamId: id}); err != nil {
			t.Fatal(err)
		}
	}
	w, err := wal.Create(walPath, wal.CreateOptions{Capacity: 64 << 20, NodeID: 1, NodeEpoch: reg.GetEpoch()})
	if err != nil {
		t.Fatal(err)
	}
	const records = 60
	payload := make([]byte, 300<<10)
	for i := 0; i < records; i++ {
		payload[0] = byte(i)
		if _, err := w.Append(ctx, wal.Batch{StreamID: uint64(i%2 + 1), Epoch: 1, BaseOffset: uint64(i / 2 * 5), Count: 5, Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Abandon(); err != nil {
		t.Fatal(err)
	}

	fo, err := waldenv1.NewBrokersClient(conn).Failover(ctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	getJob := func(via string) *waldenv1.Job {
		resp, err := waldenv1.NewJobsClient(conns[via]).GetJob(ctx, &waldenv1.GetJobRequest{JobId: fo.GetJobId()})
		if err != nil {
			return nil
		}
		return resp.GetJob()
	}
	first := getJob("c1").GetAssigneeId()
	if gates[first] == nil {
		t.Fatalf("assignee %q", first)
	}
	deadline := time.Now().Add(20 * time.Second)
	for gates[first].holding.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no upload in flight on %s: %v", first, getJob("c1"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Kill the assignee; the others upload freely.
	cancels[first]()
	if err := <-dones[first]; err != nil {
		t.Fatalf("%s: %v", first, err)
	}
	delete(cancels, first)
	var other string
	for _, id := range ids {
		if id != first {
			gates[id].closed.Store(false)
			other = id
		}
	}
	var j *waldenv1.Job
	deadline = time.Now().Add(30 * time.Second)
	for j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED {
		if time.Now().After(deadline) {
			t.Fatalf("job not succeeded: %v", j)
		}
		time.Sleep(50 * time.Millisecond)
		if cur := getJob(other); cur != nil {
			j = cur
		}
	}
	if j.GetAttempt() < 2 || j.GetAssigneeId() == first {
		t.Fatalf("finished by attempt %d on %s (killed: %s)", j.GetAttempt(), j.GetAssigneeId(), first)
	}
	// Every offset once: each stream's objects are contiguous from 0 and
	// hold the WAL's batches.
	store, err := objstore.New(ctx, s3cfg, objstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cat := waldenv1.NewCatalogClient(conns[other])
	for _, sid := range []uint64{1, 2} {
		ds, err := cat.DescribeStream(ctx, &waldenv1.DescribeStreamRequest{StreamId: sid})
		if err != nil {
			t.Fatal(err)
		}
		if ds.GetStream().GetState() != fsm.StreamClosed || ds.GetStream().GetEndOffset() != records/2*5 {
			t.Fatalf("stream %d: %v", sid, ds.GetStream())
		}
		next, batches := uint64(0), 0
		for _, o := range ds.GetObjects() {
			for _, r := range o.GetRanges() {
				if r.GetStreamId() != sid {
					continue
				}
				if r.GetStartOffset() != next {
					t.Fatalf("stream %d: range %d..%d after %d", sid, r.GetStartOffset(), r.GetEndOffset(), next)
				}
				next = r.GetEndOffset()
			}
			data, err := store.Get(ctx, o.GetKey())
			if err != nil {
				t.Fatal(err)
			}
			_, bs, err := objformat.ReadAll(bytesAt(data), int64(len(data)))
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range bs {
				if b.StreamID == sid {
					batches++
				}
			}
		}
		if batches != records/2 {
			t.Fatalf("stream %d: %d batches in S3, want %d", sid, batches, records/2)
		}
	}
}

type bytesAt []byte

func (b bytesAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
