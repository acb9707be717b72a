package broker

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"walden/broker/brokertest"
	"walden/config"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
)

// TestAppendAdmittedBeforeGracefulStop: an append admitted just before a
// graceful stop began, whose WAL write lands after the stop's last upload,
// must not be acknowledged: the stop closes the streams at the committed
// end, and the next start skips the WAL records of closed streams.
func TestAppendAdmittedBeforeGracefulStop(t *testing.T) {
	coord, err := brokertest.Start("demo", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Stop)
	dir := t.TempDir()
	fakeS3 := s3test.StartFake(t)
	cfg := config.DefaultBrokerConfig()
	cfg.BrokerID, cfg.ClusterName = "b1", "demo"
	cfg.Listen, cfg.AgentListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Coordinators = []string{coord.Addr}
	cfg.Gossip.BindAddr = "127.0.0.1:0"
	cfg.WAL = config.BrokerWAL{Path: filepath.Join(dir, "b1.wal"), Capacity: 1 << 20}
	cfg.S3 = fakeS3
	cfg.Streams = []uint64{1}
	cfg.UploadInterval, cfg.UploadBytes, cfg.TakeoverInterval = time.Hour, 64<<10, 50*time.Millisecond
	cfg.LeaseSafetyMargin = 200 * time.Millisecond

	admitted, release := make(chan struct{}), make(chan struct{})
	type result struct {
		resp *waldenv1.AppendResponse
		err  error
	}
	done := make(chan result, 1)
	hooks := Hooks{
		AppendAdmitted: func() {
			close(admitted)
			<-release
		},
		Drained: func() {
			close(release)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
			}
		},
	}

	b, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(false) })
	deadline := time.Now().Add(10 * time.Second)
	for !b.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("broker not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	api := &apiServer{b: b}
	var res result
	go func() {
		resp, err := api.Append(context.Background(), &waldenv1.AppendRequest{StreamId: 1, Records: [][]byte{[]byte("x")}})
		res = result{resp, err}
		done <- res
	}()
	<-admitted
	if err := b.Stop(true); err != nil {
		t.Logf("stop: %v", err)
	}
	select {
	case <-release:
	default:
		t.Fatal("the graceful stop did not drain")
	}
	st, _ := coord.State().Stream(1)
	if res.err == nil && st.GetEndOffset() < res.resp.GetBaseOffset()+uint64(res.resp.GetCount()) {
		t.Fatalf("append acknowledged offsets %d..%d, but the stream was closed at end offset %d (state %s): acknowledged record lost",
			res.resp.GetBaseOffset(), res.resp.GetBaseOffset()+uint64(res.resp.GetCount()), st.GetEndOffset(), st.GetState())
	}
}
