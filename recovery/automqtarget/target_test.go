package automqtarget_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"walden/automq/controller"
	"walden/automq/devcontroller"
	"walden/automq/failover"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
	"walden/recovery/automqtarget"
	"walden/recovery/recoverytest"
	"walden/wal"
)

const (
	clusterID = "target-test"
	node      = int32(3)
	nodeEpoch = int64(1_733_000_000_000)
)

// world is three coordinators (an in-process replicated state), a
// development AutoMQ controller, an S3 bucket, and AutoMQ node 3 (walden
// broker b3) that opened streams 10 and 20, wrote a WAL and died.
type world struct {
	c      *recoverytest.Cluster
	dc     *devcontroller.Controller
	faults *devcontroller.Faults
	ctl    *controller.Client
	cfg    recovery.Config
	wal    string
	epoch  uint64
	counts map[int64]int64 // records the WAL holds beyond the end offsets
}

func newWorld(t *testing.T, automq bool) *world {
	t.Helper()
	faults := devcontroller.NewFaults()
	dc, err := devcontroller.New(devcontroller.Config{ClusterID: clusterID, Streams: []int64{10, 20}, Faults: faults})
	if err != nil {
		t.Fatal(err)
	}
	var lns []net.Listener
	for i := 0; i < 2; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
	}
	if err := dc.Start(lns...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	cc := controller.DefaultConfig()
	cc.Voters = dc.Addrs()
	ctl, err := controller.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	ctx := context.Background()
	if _, err := ctl.GetOpeningStreams(ctx, node, nodeEpoch, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.OpenStreams(ctx, node, nodeEpoch, []controller.OpenStream{{StreamID: 10, StreamEpoch: 0}, {StreamID: 20, StreamEpoch: 0}}); err != nil {
		t.Fatal(err)
	}
	w := &world{c: recoverytest.NewCluster(t, "c1", "c2", "c3"), dc: dc, faults: faults, ctl: ctl, wal: filepath.Join(t.TempDir(), "b3.wal"), counts: map[int64]int64{}}
	ww, err := wal.Create(w.wal, wal.CreateOptions{Capacity: 4 << 20, NodeID: uint32(node), NodeEpoch: uint64(nodeEpoch)})
	if err != nil {
		t.Fatal(err)
	}
	next := map[int64]int64{}
	for i := 0; i < 50; i++ {
		var bs []wal.Batch
		for _, id := range []int64{10, 20} {
			bs = append(bs, wal.Batch{StreamID: uint64(id), Epoch: 0, BaseOffset: uint64(next[id]), Count: 2, Payload: make([]byte, 200+i)})
			next[id] += 2
			w.counts[id]++
		}
		if _, err := ww.AppendAll(ctx, bs); err != nil {
			t.Fatal(err)
		}
	}
	if err := ww.Abandon(); err != nil {
		t.Fatal(err)
	}
	reg := &waldenv1.RegisterBroker{BrokerId: "b3", Wal: &waldenv1.WalLocation{Path: w.wal}}
	if automq {
		reg.Automq = &waldenv1.AutomqNode{NodeId: node, NodeEpoch: nodeEpoch}
	}
	w.epoch = w.c.Must(reg).GetRegisterBroker().GetEpoch()

	w.cfg = recovery.DefaultConfig()
	w.cfg.Action = automqtarget.Name
	w.cfg.JobLease = 2 * time.Second
	w.cfg.RetryMin, w.cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	w.cfg.AutoMQ.ClusterID = clusterID
	w.cfg.AutoMQ.Controller.Voters = dc.Addrs()
	w.cfg.AutoMQ.S3 = s3test.StartFake(t)
	if err := w.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return w
}

// runner starts member id's job loop with the automq target.
func (w *world) runner(t *testing.T, ctx context.Context, id string) <-chan struct{} {
	t.Helper()
	target, err := recovery.NewTarget(ctx, recovery.TargetDeps{Config: w.cfg, NodeID: id, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	exe := recovery.NewExecutor(recovery.ExecutorConfig{Config: w.cfg, NodeID: id, State: w.c.State(), Cluster: w.c.Member(id), Target: target})
	r := recovery.NewRunner(w.cfg, id, w.c.State(), w.c.Member(id), exe, nil)
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	return done
}

func (w *world) streamState(id int64) devcontroller.StreamView {
	for _, s := range w.dc.Snapshot().Streams {
		if s.StreamID == id {
			return s
		}
	}
	return devcontroller.StreamView{}
}

// TestAutoMQJobFailsOverTheNode runs a recovery job through the automq
// target: the job succeeds once AutoMQ's controller has every record the
// WAL held committed and the node's streams closed, and the job shows
// AutoMQ's ids: node, epoch, objects, end offsets before and after.
func TestAutoMQJobFailsOverTheNode(t *testing.T) {
	w := newWorld(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := w.runner(t, ctx, "c1")
	j := w.c.Declare("b3", w.epoch, "c1")
	j = w.c.WaitJob(j.GetJobId(), 60*time.Second, "succeeded", func(j *waldenv1.Job) bool {
		return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED
	})
	cancel()
	<-done
	rep := j.GetTargetReport()
	if rep.GetTarget() != "automq" || rep.GetNodeId() != int64(node) || rep.GetNodeEpoch() != nodeEpoch || !rep.GetFenced() || !rep.GetWalReset() {
		t.Fatalf("target report %v", rep)
	}
	if len(rep.GetObjects()) == 0 || rep.GetBytesUploaded() == 0 {
		t.Fatalf("no objects in the report: %v", rep)
	}
	for _, o := range rep.GetObjects() {
		if o.GetState() != failover.StateCommitted || !strings.HasSuffix(o.GetKey(), "/_kafka_"+clusterID+"/"+strconv.FormatInt(o.GetObjectId(), 10)) {
			t.Fatalf("object %v", o)
		}
	}
	for _, s := range rep.GetStreams() {
		want := 2 * w.counts[s.GetStreamId()]
		if !s.GetClosed() || s.GetEndOffsetBefore() != 0 || s.GetEndOffsetAfter() != want || s.GetRecords() != uint64(w.counts[s.GetStreamId()]) {
			t.Fatalf("stream report %v, want closed at %d with %d records", s, want, w.counts[s.GetStreamId()])
		}
		if st := w.streamState(s.GetStreamId()); st.State != devcontroller.StreamClosed || st.EndOffset != want {
			t.Fatalf("stream %d at the controller: %s at %d", s.GetStreamId(), st.State, st.EndOffset)
		}
	}
	if j.GetBytesUploaded() != rep.GetBytesUploaded() || j.GetBytesTotal() != rep.GetBytesUploaded() {
		t.Fatalf("job bytes %d/%d, the report's %d", j.GetBytesUploaded(), j.GetBytesTotal(), rep.GetBytesUploaded())
	}
	if j.GetStreamsClosed() != 2 || j.GetStreamsTotal() != 2 || j.GetRecordsUploaded() != uint64(w.counts[10]+w.counts[20]) {
		t.Fatalf("job counters: %d/%d streams, %d records", j.GetStreamsClosed(), j.GetStreamsTotal(), j.GetRecordsUploaded())
	}
	steps := map[waldenv1.JobStep]bool{}
	for _, cp := range j.GetCheckpoints() {
		steps[cp.GetJobStep()] = true
	}
	for _, s := range []waldenv1.JobStep{waldenv1.JobStep_JOB_STEP_FENCE, waldenv1.JobStep_JOB_STEP_ATTACH, waldenv1.JobStep_JOB_STEP_READ,
		waldenv1.JobStep_JOB_STEP_UPLOAD, waldenv1.JobStep_JOB_STEP_COMMIT, waldenv1.JobStep_JOB_STEP_CLOSE, waldenv1.JobStep_JOB_STEP_DETACH} {
		if !steps[s] {
			t.Errorf("no checkpoint of step %s", s.Name())
		}
	}
}

// TestAutoMQJobMovesToAnotherCoordinator: the assignee's first commit is
// applied by the controller but its answer is lost, and the assignee is cut
// off while it waits to retry; the leader reassigns the job and the next
// attempt, on another member, finishes it: each record committed once
// (the first attempt's commit is filtered out by the new end offsets).
func TestAutoMQJobMovesToAnotherCoordinator(t *testing.T) {
	w := newWorld(t, true)
	w.cfg.AutoMQ.BatchSize = 1 << 20
	w.cfg.AutoMQ.Controller.Attempts = 1
	w.cfg.RetryMin, w.cfg.RetryMax = 30*time.Second, 30*time.Second
	w.faults.Add(devcontroller.Fault{Kind: devcontroller.FaultCloseAfterApply, APIKey: 506})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx1, cancel1 := context.WithCancel(ctx)
	done1 := w.runner(t, ctx1, "c1")
	j := w.c.Declare("b3", w.epoch, "c1")
	w.c.WaitJob(j.GetJobId(), 60*time.Second, "failing its first commit", func(j *waldenv1.Job) bool {
		return j.GetError() != ""
	})
	if w.streamState(10).EndOffset == 0 && w.streamState(20).EndOffset == 0 {
		t.Fatal("the lost commit was not applied")
	}
	w.c.SetDown("c1", true)
	cancel1()
	<-done1
	w.c.SetLeader("c2")
	w.cfg.RetryMin, w.cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	done2 := w.runner(t, ctx, "c2")
	j = w.c.WaitJob(j.GetJobId(), 90*time.Second, "succeeded", func(j *waldenv1.Job) bool {
		return j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED
	})
	cancel()
	<-done2
	if j.GetAttempt() < 2 || j.GetAssigneeId() == "c1" {
		t.Fatalf("attempt %d on %s, want a later attempt on another member", j.GetAttempt(), j.GetAssigneeId())
	}
	for _, id := range []int64{10, 20} {
		if st := w.streamState(id); st.State != devcontroller.StreamClosed || st.EndOffset != 2*w.counts[id] {
			t.Fatalf("stream %d: %s at %d, want closed at %d", id, st.State, st.EndOffset, 2*w.counts[id])
		}
	}
	// The report keeps the end offsets from before the first attempt and
	// shows those after the last (the lost commit's records are counted by
	// offsets: its answer never came).
	for _, s := range j.GetTargetReport().GetStreams() {
		if s.GetEndOffsetBefore() != 0 || s.GetEndOffsetAfter() != 2*w.counts[s.GetStreamId()] || !s.GetClosed() {
			t.Fatalf("stream report %v", s)
		}
	}
}

// TestAutoMQJobWithoutANode: a broker whose agent reported no AutoMQ node
// cannot be failed over at AutoMQ's controller: the job says why and keeps
// trying; nothing is done at the controller.
func TestAutoMQJobWithoutANode(t *testing.T) {
	w := newWorld(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := w.runner(t, ctx, "c1")
	j := w.c.Declare("b3", w.epoch, "c1")
	j = w.c.WaitJob(j.GetJobId(), 30*time.Second, "refused", func(j *waldenv1.Job) bool {
		return strings.Contains(j.GetError(), "names no automq.node_id")
	})
	cancel()
	<-done
	for _, n := range w.dc.Snapshot().Nodes {
		if n.FailoverMode {
			t.Fatalf("node %d was fenced at the controller", n.NodeID)
		}
	}
}

// TestAutoMQTargetConfigErrorsNameTheKey: a bad recovery.automq section is
// refused at start, naming the key.
func TestAutoMQTargetConfigErrorsNameTheKey(t *testing.T) {
	cfg := recovery.DefaultConfig()
	cfg.Action = automqtarget.Name
	err := cfg.Validate()
	var ce *recovery.ConfigError
	if !errors.As(err, &ce) || ce.Key != "automq.cluster_id" {
		t.Fatalf("Validate: %v, want automq.cluster_id", err)
	}
	cfg.AutoMQ.ClusterID = "c"
	cfg.AutoMQ.Controller.Voters = []string{"127.0.0.1:1"}
	_, err = recovery.NewTarget(context.Background(), recovery.TargetDeps{Config: cfg})
	if !errors.As(err, &ce) || ce.Key != "automq.s3.bucket" {
		t.Fatalf("NewTarget without a bucket: %v", err)
	}
	cfg.AutoMQ.Controller.SASL.Mechanism = "GSSAPI"
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Key != "automq.controller.sasl.mechanism" {
		t.Fatalf("Validate with GSSAPI: %v", err)
	}
}
