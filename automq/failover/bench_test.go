package failover_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"walden/automq/controller"
	"walden/automq/devcontroller"
	"walden/automq/failover"
	"walden/objstore"
	"walden/objstore/s3test"
	"walden/wal"
)

var (
	benchSize    = flag.Int64("automq.size", 256<<20, "bytes of un-uploaded WAL payload failed over by BenchmarkAutoMQRecovery")
	benchStreams = flag.Int("automq.streams", 16, "opening streams of the node in BenchmarkAutoMQRecovery")
	benchRounds  = flag.Int("automq.rounds", 3, "rounds of BenchmarkAutoMQRecovery (each: direct, failover, direct)")
)

// BenchmarkAutoMQRecovery fails over a node whose WAL holds -automq.size
// bytes of payload across -automq.streams streams, into each S3 backend,
// against the development AutoMQ controller; in the same run and to the
// same endpoint it uploads the same number of bytes straight through the
// transfer manager (objstore.Client.Upload, one object, the same part size
// and concurrency), before and after each failover. Per round it reports
// the failover's time (header to close, everything included) against the
// direct upload's time for its bytes, and the median, p99 (the largest
// of a few rounds) and range of that ratio. Goal: ≤ 1.2.
//
// Run: go test -run '^$' -bench BenchmarkAutoMQRecovery -benchtime 1x ./automq/failover -args -automq.size=1073741824
func BenchmarkAutoMQRecovery(b *testing.B) {
	for _, name := range []string{"fake", "versitygw"} {
		b.Run(name, func(b *testing.B) {
			s3cfg := s3test.Backends()[name](b)
			opts := objstore.Options{Concurrency: 8, PartSize: 8 << 20, Logger: slog.New(slog.DiscardHandler)}
			store, err := objstore.New(context.Background(), s3cfg, opts)
			if err != nil {
				b.Fatal(err)
			}
			var ratios []float64
			for round := 0; round < *benchRounds; round++ {
				before := benchDirect(b, store, *benchSize, round*2)
				fo, bytes := benchFailover(b, s3cfg, store)
				after := benchDirect(b, store, *benchSize, round*2+1)
				direct := (before + after) / 2
				// The direct upload's time for the bytes the failover
				// uploaded (its objects are a little larger than the
				// payload: headers and indexes).
				directTime := time.Duration(float64(direct) * float64(bytes) / float64(*benchSize))
				ratio := fo.Seconds() / directTime.Seconds()
				ratios = append(ratios, ratio)
				b.Logf("%s round %d: failover of %d bytes in %s (%.0f MiB/s); direct upload %s for the same bytes (%.0f MiB/s); ratio %.2f; load average %s",
					name, round, bytes, fo.Round(time.Millisecond), float64(bytes)/fo.Seconds()/(1<<20), directTime.Round(time.Millisecond),
					float64(bytes)/directTime.Seconds()/(1<<20), ratio, loadavg())
			}
			sort.Float64s(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "median-failover/direct")
			b.ReportMetric(ratios[len(ratios)-1], "max-failover/direct")
			b.ReportMetric(ratios[0], "min-failover/direct")
		})
	}
}

// benchDirect uploads size random bytes as one object and returns the time.
func benchDirect(b *testing.B, store *objstore.Client, size int64, n int) time.Duration {
	b.Helper()
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := 0; i < len(data); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8 && i+k < len(data); k++ {
			data[i+k] = byte(v >> (8 * k))
		}
	}
	ctx := context.Background()
	key := fmt.Sprintf("bench/direct-%d", n)
	start := time.Now()
	if _, err := store.Upload(ctx, key, bytes.NewReader(data), size, nil); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	_ = store.Delete(ctx, key)
	return d
}

// benchFailover writes a fresh WAL and controller, fails the node over, and
// returns the failover's time and the bytes it uploaded.
func benchFailover(b *testing.B, s3cfg objstore.Config, store *objstore.Client) (time.Duration, int64) {
	b.Helper()
	ids := make([]int64, *benchStreams)
	for i := range ids {
		ids[i] = int64(100 + i)
	}
	dc, err := devcontroller.New(devcontroller.Config{ClusterID: "bench", Streams: ids})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	if err := dc.Start(ln); err != nil {
		b.Fatal(err)
	}
	defer dc.Close()
	cc := controller.DefaultConfig()
	cc.Voters = dc.Addrs()
	cc.Logger = slog.New(slog.DiscardHandler)
	ctl, err := controller.New(cc)
	if err != nil {
		b.Fatal(err)
	}
	defer ctl.Close()
	ctx := context.Background()
	if _, err := ctl.GetOpeningStreams(ctx, node, nodeEpoch, false); err != nil {
		b.Fatal(err)
	}
	var open []controller.OpenStream
	for _, id := range ids {
		open = append(open, controller.OpenStream{StreamID: id, StreamEpoch: 0})
	}
	if _, err := ctl.OpenStreams(ctx, node, nodeEpoch, open); err != nil {
		b.Fatal(err)
	}
	walPath := filepath.Join(b.TempDir(), "bench.wal")
	writeBenchWAL(b, walPath, ids, *benchSize)
	cfg := failover.DefaultConfig()
	cfg.ClusterID = "bench"
	cfg.Controller.Voters = dc.Addrs()
	f, err := failover.New(cfg, ctl, store, failover.Options{})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	rep, err := f.Run(ctx, failover.Request{WALPath: walPath, NodeID: node})
	d := time.Since(start)
	if err != nil || !rep.Complete() {
		b.Fatalf("failover: %v %+v", err, rep)
	}
	for _, o := range rep.Objects {
		_ = store.Delete(ctx, o.Key)
	}
	return d, rep.BytesUploaded
}

// writeBenchWAL writes size bytes of payload round the streams, in 64 KiB
// records, 16 to a group-commit block.
func writeBenchWAL(b *testing.B, path string, ids []int64, size int64) {
	const payload = 64 << 10
	const perBlock = 16
	n := int(size / payload)
	// Room for the payload and the WAL's own bytes (record and block
	// headers, block alignment: about 2 % here) with an eighth to spare.
	capacity := int64(wal.HeaderRegionSize) + size + size/8 + 4<<20
	capacity = (capacity + 4095) / 4096 * 4096
	w, err := wal.Create(path, wal.CreateOptions{Capacity: capacity, NodeID: uint32(node), NodeEpoch: uint64(nodeEpoch)})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, payload)
		for k := range bufs[i] {
			bufs[i][k] = byte(rng.Uint32())
		}
	}
	next := map[int64]uint64{}
	var batch []wal.Batch
	for i := 0; i < n; i++ {
		s := ids[i%len(ids)]
		batch = append(batch, wal.Batch{StreamID: uint64(s), Epoch: 0, BaseOffset: next[s], Count: 10, Payload: bufs[i%len(bufs)]})
		next[s] += 10
		if len(batch) == perBlock || i == n-1 {
			if _, err := w.AppendAll(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
			batch = nil
		}
	}
	if err := w.Abandon(); err != nil {
		b.Fatal(err)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	return strings.Fields(string(b))[0]
}
