package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"walden/automq/controller"
	"walden/automq/devcontroller"
	"walden/objstore"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
	"walden/recovery/recoverytest"
	"walden/wal"
)

// automqWorld is a development AutoMQ controller, an S3 fake and the WAL of
// node 3, dead, with streams 10 and 20 opened.
func automqWorld(t *testing.T) (dc *devcontroller.Controller, s3cfg objstore.Config, walPath string) {
	t.Helper()
	dc, err := devcontroller.New(devcontroller.Config{ClusterID: "cli", Streams: []int64{10, 20}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := dc.Start(ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	cc := controller.DefaultConfig()
	cc.Voters = dc.Addrs()
	ctl, err := controller.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	ctx := context.Background()
	if _, err := ctl.GetOpeningStreams(ctx, 3, 1700, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.OpenStreams(ctx, 3, 1700, []controller.OpenStream{{StreamID: 10, StreamEpoch: 0}, {StreamID: 20, StreamEpoch: 0}}); err != nil {
		t.Fatal(err)
	}
	walPath = filepath.Join(t.TempDir(), "node3.wal")
	w, err := wal.Create(walPath, wal.CreateOptions{Capacity: 1 << 20, NodeID: 3, NodeEpoch: 1700})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < 5; i++ {
		if _, err := w.AppendAll(ctx, []wal.Batch{{StreamID: 10, BaseOffset: i, Count: 1, Payload: []byte("ten")}, {StreamID: 20, BaseOffset: 2 * i, Count: 2, Payload: []byte("twenty")}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Abandon(); err != nil {
		t.Fatal(err)
	}
	return dc, s3test.StartFake(t), walPath
}

// TestAutomqFailoverCommand runs `walden automq failover -o json` by hand
// against a development controller: one JSON object with the node, its
// streams (end offsets before and after, closed), the objects and the WAL
// reset; then `inspect-object` reads an object it uploaded.
func TestAutomqFailoverCommand(t *testing.T) {
	dc, s3cfg, walPath := automqWorld(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3cfg.AccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3cfg.SecretAccessKey)
	var out, errOut bytes.Buffer
	f := automqFailoverFlags{wal: walPath, nodeID: 3, controllers: strings.Join(dc.Addrs(), ","), clusterID: "cli",
		s3Endpoint: s3cfg.Endpoint, s3Bucket: s3cfg.Bucket, s3PathStyle: true, output: "json", timeout: time.Minute}
	if err := runAutomqFailover(context.Background(), f, &out, &errOut); err != nil {
		t.Fatalf("failover: %v\n%s", err, errOut.String())
	}
	var got struct {
		NodeID    int32 `json:"node_id"`
		NodeEpoch int64 `json:"node_epoch"`
		Streams   []struct {
			StreamID        int64 `json:"stream_id"`
			StreamEpoch     int64 `json:"stream_epoch"`
			EndOffsetBefore int64 `json:"end_offset_before"`
			EndOffsetAfter  int64 `json:"end_offset_after"`
			Records         int64 `json:"records"`
			Closed          bool  `json:"closed"`
		} `json:"streams"`
		Objects []struct {
			ObjectID int64  `json:"object_id"`
			Key      string `json:"key"`
			Size     int64  `json:"size"`
			Kind     string `json:"kind"`
		} `json:"objects"`
		BytesUploaded int64  `json:"bytes_uploaded"`
		WALReset      bool   `json:"wal_reset"`
		DurationMS    *int64 `json:"duration_ms"`
		Complete      bool   `json:"complete"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if got.NodeID != 3 || got.NodeEpoch != 1700 || !got.WALReset || !got.Complete || got.DurationMS == nil || got.BytesUploaded == 0 || len(got.Objects) != 1 {
		t.Fatalf("report %s", out.String())
	}
	if len(got.Streams) != 2 || !got.Streams[0].Closed || got.Streams[0].EndOffsetAfter != 5 || got.Streams[1].EndOffsetAfter != 10 || got.Streams[1].Records != 5 {
		t.Fatalf("streams %+v", got.Streams)
	}
	if got.Objects[0].Kind != "stream_set" || got.Objects[0].Size != got.BytesUploaded {
		t.Fatalf("objects %+v", got.Objects)
	}

	// inspect-object reads it back from S3.
	cmd := newAutomqInspectCmd()
	var iout bytes.Buffer
	cmd.SetOut(&iout)
	cmd.SetArgs([]string{"s3://" + s3cfg.Bucket + "/" + got.Objects[0].Key, "--cluster-id", "cli", "--s3-endpoint", s3cfg.Endpoint, "--s3-path-style", "--records", "-o", "json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var desc struct {
		ObjectID    int64 `json:"object_id"`
		RecordCount int64 `json:"record_count"`
		Streams     []struct {
			StreamID int64 `json:"stream_id"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(iout.Bytes(), &desc); err != nil {
		t.Fatal(err)
	}
	if desc.ObjectID != got.Objects[0].ObjectID || desc.RecordCount != 10 || len(desc.Streams) != 2 {
		t.Fatalf("inspect-object %s", iout.String())
	}
}

// TestAutomqFailoverCommandRefusals: missing flags name the flag, a WAL of
// another node says whose it is, and nothing is done.
func TestAutomqFailoverCommandRefusals(t *testing.T) {
	dc, s3cfg, walPath := automqWorld(t)
	base := automqFailoverFlags{wal: walPath, nodeID: 3, controllers: strings.Join(dc.Addrs(), ","), clusterID: "cli",
		s3Endpoint: s3cfg.Endpoint, s3Bucket: s3cfg.Bucket, s3PathStyle: true, output: "table", timeout: time.Minute}
	for name, tc := range map[string]struct {
		mod  func(*automqFailoverFlags)
		want string
	}{
		"no wal":        {func(f *automqFailoverFlags) { f.wal = "" }, "--wal is required"},
		"no node":       {func(f *automqFailoverFlags) { f.nodeID = -1 }, "--node-id is required"},
		"no cluster id": {func(f *automqFailoverFlags) { f.clusterID = "" }, "--cluster-id: required"},
		"no voters":     {func(f *automqFailoverFlags) { f.controllers = "" }, "--controllers: required"},
		"bad voter":     {func(f *automqFailoverFlags) { f.controllers = "10.0.0.1" }, "--controllers"},
		"no bucket":     {func(f *automqFailoverFlags) { f.s3Bucket = "" }, "--s3-bucket is required"},
		"bad output":    {func(f *automqFailoverFlags) { f.output = "yaml" }, "-o: must be table or json"},
		"another node":  {func(f *automqFailoverFlags) { f.nodeID = 4 }, "belongs to node 3, not node 4"},
		"bad config":    {func(f *automqFailoverFlags) { f.config = filepath.Join(t.TempDir(), "missing.yaml") }, "missing.yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			f := base
			tc.mod(&f)
			t.Setenv("AWS_ACCESS_KEY_ID", s3cfg.AccessKeyID)
			t.Setenv("AWS_SECRET_ACCESS_KEY", s3cfg.SecretAccessKey)
			var out, errOut bytes.Buffer
			err := runAutomqFailover(context.Background(), f, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to say %q", err, tc.want)
			}
		})
	}
	for _, n := range dc.Snapshot().Nodes {
		if n.FailoverMode {
			t.Fatal("a refused failover fenced the node")
		}
	}
}

// TestExampleAutoMQExecScript runs examples/recovery-exec/automq-failover.sh
// as a coordinator's exec recovery action, with the walden binary: the job
// hands it the broker's AutoMQ node, the script runs `walden automq
// failover`, and the job succeeds with the node's streams closed at the
// controller.
func TestExampleAutoMQExecScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dc, s3cfg, walPath := automqWorld(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "walden")
	if out, err := exec.Command("go", "build", "-o", bin, "walden/cmd/walden").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cfgPath := filepath.Join(dir, "automq.yaml")
	yaml := fmt.Sprintf("cluster_id: cli\ncontroller:\n  voters: [%q]\ns3:\n  endpoint: %s\n  bucket: %s\n  path_style: true\n  access_key_id: %s\n  secret_access_key: %s\n",
		dc.Addrs()[0], s3cfg.Endpoint, s3cfg.Bucket, s3cfg.AccessKeyID, s3cfg.SecretAccessKey)
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("../../examples/recovery-exec/automq-failover.sh")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("WALDEN", bin)
	c := recoverytest.NewCluster(t, "c1")
	epoch := c.Must(&waldenv1.RegisterBroker{BrokerId: "b3", Wal: &waldenv1.WalLocation{Path: walPath},
		Automq: &waldenv1.AutomqNode{NodeId: 3, NodeEpoch: 1700}}).GetRegisterBroker().GetEpoch()
	cfg := recovery.DefaultConfig()
	cfg.Action = recovery.ActionExec
	cfg.Exec = recovery.Exec{Command: script, Args: []string{cfgPath}, Timeout: time.Minute}
	exe := recovery.NewExecutor(recovery.ExecutorConfig{Config: cfg, NodeID: "c1", State: c.State(), Cluster: c.Member("c1")})
	j := c.Declare("b3", epoch, "c1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := exe.Run(ctx, j.GetJobId(), 1); err != nil {
		t.Fatal(err)
	}
	j, _ = c.State().Job(j.GetJobId())
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED || j.GetStreamsClosed() != 2 || j.GetBytesUploaded() == 0 {
		t.Fatalf("job %s: %d streams closed, %d bytes, error %q", j.GetJobState().Name(), j.GetStreamsClosed(), j.GetBytesUploaded(), j.GetError())
	}
	for _, s := range dc.Snapshot().Streams {
		if s.State != devcontroller.StreamClosed {
			t.Fatalf("stream %d is %s at the controller", s.StreamID, s.State)
		}
	}
}
