package broker_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"walden/broker"
	"walden/broker/brokertest"
	"walden/config"
	"walden/internal/testutil"
	"walden/objstore"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/wal"
)

type env struct {
	t     testing.TB
	coord *brokertest.Coordinator
	s3    objstore.Config
	dir   string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	coord, err := brokertest.Start("demo", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Stop)
	dir := t.TempDir()
	fakeS3 := s3test.StartFake(t)
	return &env{t: t, coord: coord, s3: fakeS3, dir: dir}
}

func (e *env) config(id string, streams ...uint64) *config.Broker {
	cfg := config.DefaultBrokerConfig()
	cfg.BrokerID, cfg.ClusterName = id, "demo"
	cfg.Listen, cfg.AgentListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Coordinators = []string{e.coord.Addr}
	cfg.Gossip.BindAddr = "127.0.0.1:0"
	cfg.WAL = config.BrokerWAL{Path: filepath.Join(e.dir, id+".wal"), Capacity: 1 << 20}
	cfg.S3 = e.s3
	cfg.Streams = streams
	cfg.UploadInterval, cfg.UploadBytes, cfg.TakeoverInterval = 50*time.Millisecond, 64<<10, 50*time.Millisecond
	cfg.LeaseSafetyMargin = 200 * time.Millisecond
	return cfg
}

func logger(t testing.TB) *slog.Logger {
	if os.Getenv("WALDEN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// start starts a broker and stops it (crash-style) at the end of the test
// unless the test stopped it.
func (e *env) start(cfg *config.Broker) *broker.Broker {
	e.t.Helper()
	return e.startWith(cfg, broker.Hooks{})
}

// startWith is start with hooks that hold the broker where a test needs it.
func (e *env) startWith(cfg *config.Broker, hooks broker.Hooks) *broker.Broker {
	e.t.Helper()
	b, err := broker.New(cfg, broker.Options{Logger: logger(e.t), Hooks: hooks})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = b.Stop(false) })
	return b
}

// durableHold holds the next append that becomes durable, once armed:
// Durable is closed when it is durable, and it is acknowledged (or not)
// once Release is closed. Later appends pass.
type durableHold struct {
	armed            atomic.Bool
	Durable, Release chan struct{}
}

func newDurableHold() *durableHold {
	return &durableHold{Durable: make(chan struct{}), Release: make(chan struct{})}
}

// Arm makes the hold take the next durable append.
func (h *durableHold) Arm() { h.armed.Store(true) }

// Hooks are the broker hooks that hold it.
func (h *durableHold) Hooks() broker.Hooks {
	return broker.Hooks{AppendDurable: func() {
		if h.armed.CompareAndSwap(true, false) {
			close(h.Durable)
			<-h.Release
		}
	}}
}

func waitReady(t testing.TB, b *broker.Broker) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "broker ready", func() error {
		if !b.Ready() {
			return fmt.Errorf("not ready")
		}
		return nil
	})
}

func client(t testing.TB, addr string) waldenv1.BrokerAPIClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return waldenv1.NewBrokerAPIClient(conn)
}

func appendRecs(t testing.TB, c waldenv1.BrokerAPIClient, stream uint64, recs ...string) (*waldenv1.AppendResponse, error) {
	t.Helper()
	var rr [][]byte
	for _, r := range recs {
		rr = append(rr, []byte(r))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Append(ctx, &waldenv1.AppendRequest{StreamId: stream, Records: rr})
}

func mustAppend(t testing.TB, c waldenv1.BrokerAPIClient, stream uint64, recs ...string) uint64 {
	t.Helper()
	r, err := appendRecs(t, c, stream, recs...)
	if err != nil {
		t.Fatalf("append to stream %d: %v", stream, err)
	}
	if int(r.GetCount()) != len(recs) {
		t.Fatalf("append count %d, want %d", r.GetCount(), len(recs))
	}
	return r.GetBaseOffset()
}

// readAll reads stream from 0 through c until an empty answer.
func readAll(t testing.TB, c waldenv1.BrokerAPIClient, stream uint64) []string {
	t.Helper()
	var out []string
	from := uint64(0)
	for {
		r, err := c.Read(context.Background(), &waldenv1.ReadRequest{StreamId: stream, FromOffset: from, MaxRecords: 7})
		if err != nil {
			t.Fatalf("read stream %d from %d: %v", stream, from, err)
		}
		if len(r.GetRecords()) == 0 {
			return out
		}
		for _, rec := range r.GetRecords() {
			if rec.GetOffset() != from {
				t.Fatalf("stream %d: record at offset %d, want %d", stream, rec.GetOffset(), from)
			}
			out = append(out, string(rec.GetPayload()))
			from++
		}
	}
}

func reasonOf(err error) (refusal.Reason, map[string]string) {
	return rpcerr.Reason(err), rpcerr.Metadata(err)
}

func committedEnd(e *env, stream uint64) uint64 {
	s, _ := e.coord.State().Stream(stream)
	return s.GetEndOffset()
}

func waitCommitted(t testing.TB, e *env, stream, end uint64) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("stream %d committed to %d", stream, end), func() error {
		if got := committedEnd(e, stream); got != end {
			return fmt.Errorf("end offset %d", got)
		}
		return nil
	})
}

func equal(t testing.TB, got, want []string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func TestAppendReadUploadTrim(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1, 2)
	cfg.UploadInterval = time.Hour // upload on demand: the test looks at the tail first
	b := e.start(cfg)
	waitReady(t, b)
	c := client(t, b.Addr())

	if off := mustAppend(t, c, 1, "a0", "a1", "a2"); off != 0 {
		t.Fatalf("first offset %d", off)
	}
	if off := mustAppend(t, c, 2, "b0"); off != 0 {
		t.Fatalf("first offset of stream 2: %d", off)
	}
	if off := mustAppend(t, c, 1, "a3"); off != 3 {
		t.Fatalf("offset %d, want 3", off)
	}
	// Before any upload the tail is served from memory.
	equal(t, readAll(t, c, 1), []string{"a0", "a1", "a2", "a3"})
	if committedEnd(e, 1) != 0 {
		t.Fatalf("committed before upload: %d", committedEnd(e, 1))
	}
	// Crossing upload_bytes starts an upload at once.
	big := string(make([]byte, 70<<10))
	mustAppend(t, c, 2, big)
	waitCommitted(t, e, 1, 4)
	waitCommitted(t, e, 2, 2)
	equal(t, readAll(t, c, 1), []string{"a0", "a1", "a2", "a3"})
	if got := readAll(t, c, 2); len(got) != 2 || got[0] != "b0" || got[1] != big {
		t.Fatalf("stream 2 read %d records", len(got))
	}
	// The WAL was trimmed to its last uploaded record.
	rd, err := wal.Open(cfg.WAL.Path)
	if err != nil {
		t.Fatal(err)
	}
	trim := rd.Header().TrimOffset
	rd.Close()
	if trim < cfg.WAL.Capacity {
		t.Fatalf("trim offset %d: not trimmed past the first record", trim)
	}
	// The catalog holds one object with both streams, keyed by broker and epoch.
	objs := e.coord.State().StreamObjects(1, 0, 0)
	if len(objs) != 1 || len(objs[0].GetRanges()) != 2 || objs[0].GetBrokerId() != "b1" {
		t.Fatalf("objects %v", objs)
	}
	// Offsets continue after the commit.
	if off := mustAppend(t, c, 1, "a4"); off != 4 {
		t.Fatalf("offset %d, want 4", off)
	}
	equal(t, readAll(t, c, 1), []string{"a0", "a1", "a2", "a3", "a4"})

	st, err := c.BrokerStatus(context.Background(), &waldenv1.BrokerStatusRequest{})
	if err != nil || !st.GetServing() || !st.GetLeaseValid() || st.GetBrokerId() != "b1" || len(st.GetStreams()) != 2 ||
		st.GetStreams()[0].GetNextOffset() != 5 || st.GetUploads() == 0 {
		t.Fatalf("status %v %v", st, err)
	}
	if _, err := c.Read(context.Background(), &waldenv1.ReadRequest{StreamId: 99}); status.Code(err) != codes.NotFound || rpcerr.Reason(err) != refusal.StreamNotFound {
		t.Fatalf("read of an unknown stream: %v", err)
	}
	if _, err := c.Append(context.Background(), &waldenv1.AppendRequest{StreamId: 1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("append without records: %v", err)
	}
}

func TestReadAnswerIsBoundedInBytes(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1)
	cfg.WAL.Capacity, cfg.UploadBytes = 8<<20, 2<<20
	b := e.start(cfg)
	waitReady(t, b)
	c := client(t, b.Addr())
	rec := strings.Repeat("x", 900<<10)
	for i := 0; i < 5; i++ {
		mustAppend(t, c, 1, rec)
	}
	for _, committed := range []bool{false, true} {
		if committed {
			waitCommitted(t, e, 1, 5)
		}
		r, err := c.Read(context.Background(), &waldenv1.ReadRequest{StreamId: 1})
		if err != nil || len(r.GetRecords()) != 3 || r.GetNextOffset() != 3 {
			t.Fatalf("committed=%v: first answer %d records, next %d, %v", committed, len(r.GetRecords()), r.GetNextOffset(), err)
		}
		r, err = c.Read(context.Background(), &waldenv1.ReadRequest{StreamId: 1, FromOffset: 3})
		if err != nil || len(r.GetRecords()) != 2 {
			t.Fatalf("committed=%v: second answer %d records, %v", committed, len(r.GetRecords()), err)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1)
	cfg.TLS = config.TLS{CertFile: "/nonexistent/c.pem", KeyFile: "/nonexistent/k.pem", CAFile: "/nonexistent/ca.pem"}
	if _, err := broker.New(cfg, broker.Options{}); err == nil || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Fatalf("missing tls files: %v", err)
	}
	cfg = e.config("b1", 1)
	cfg.UploadInterval = 0
	if _, err := broker.New(cfg, broker.Options{}); err == nil || !strings.Contains(err.Error(), "upload_interval") {
		t.Fatalf("zero upload_interval: %v", err)
	}
}
