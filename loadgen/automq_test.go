package loadgen_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"walden/automq/devcontroller"
	"walden/broker"
	"walden/config"
	"walden/loadgen"
	"walden/objstore"
	"walden/objstore/s3test"
)

// TestLoadAndVerifyAutomq loads an AutoMQ-mode broker found through its
// BrokerStatus (no coordinators) and verifies the ledger through the
// controller's view and AutoMQ's objects in S3; an object removed from the
// bucket is reported unbacked and its records lost.
func TestLoadAndVerifyAutomq(t *testing.T) {
	dc, err := devcontroller.New(devcontroller.Config{ClusterID: "lg", Streams: []int64{1, 2}})
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
	defer dc.Close()
	hs := httptest.NewServer(dc.HTTPHandler())
	defer hs.Close()
	s3 := s3test.StartFake(t)
	y := fmt.Sprintf(`broker_id: a
mode: automq
listen: 127.0.0.1:0
wal: {path: %q, capacity: 4194304}
s3: {endpoint: %q, bucket: %q, path_style: true, access_key_id: %q, secret_access_key: %q}
streams: [1, 2]
upload_interval: 100ms
automq: {node_id: 1, cluster_id: lg, controller: {voters: [%q]}, metadata_url: %q}
`, filepath.Join(t.TempDir(), "a.wal"), s3.Endpoint, s3.Bucket, s3.AccessKeyID, s3.SecretAccessKey, dc.Addrs()[0], hs.URL)
	cfg, err := config.ParseBroker("a.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.NewAutomq(cfg, broker.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(false)

	ledger := filepath.Join(t.TempDir(), "ledger.jsonl")
	rep, err := loadgen.Load(context.Background(), loadgen.LoadConfig{Brokers: []string{b.Addr()}, Streams: []uint64{1, 2},
		Rate: 400, Duration: 20 * time.Second, MaxRecords: 400, Ledger: ledger})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Acked != 400 {
		t.Fatalf("load: %+v", rep)
	}
	vc := loadgen.AutomqVerifyConfig{MetadataURL: hs.URL, S3: s3, Ledger: ledger, Wait: 20 * time.Second}
	v, err := loadgen.VerifyAutomq(context.Background(), vc)
	if err != nil || !v.OK() || v.Acked != 400 || v.Present != 400 {
		t.Fatalf("verify: %+v %v", v, err)
	}
	// The same records read through the broker that leads each stream.
	bv, err := loadgen.Verify(context.Background(), loadgen.VerifyConfig{Brokers: []string{b.Addr()}, Ledger: ledger, Wait: 20 * time.Second})
	if err != nil || !bv.OK() || bv.Present != 400 {
		t.Fatalf("verify through the broker: %+v %v", bv, err)
	}
	// An object the controller lists but the bucket lost.
	store, err := objstore.New(context.Background(), s3, objstore.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	objs := dc.Snapshot().Objects
	if err := store.Delete(context.Background(), objs[0].Key); err != nil {
		t.Fatal(err)
	}
	v, err = loadgen.VerifyAutomq(context.Background(), vc)
	if err != nil || v.OK() || v.Unbacked == 0 || v.Lost == 0 {
		t.Fatalf("verify without object %s: %+v %v", objs[0].Key, v, err)
	}
	if _, err := loadgen.Load(context.Background(), loadgen.LoadConfig{Brokers: []string{b.Addr()}, Rate: 1, Duration: time.Second,
		Ledger: ledger}); err == nil {
		t.Fatal("a load of brokers without --streams was accepted")
	}
}
