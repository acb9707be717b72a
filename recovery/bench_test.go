package recovery_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"walden/objstore"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
	"walden/wal"
)

var (
	benchSize       = flag.Int64("recovery.size", 256<<20, "bytes of un-uploaded WAL payload recovered by BenchmarkRecovery")
	benchObjectSize = flag.Int64("recovery.object_size", 0, "recovery.object_size for BenchmarkRecovery (0: the default)")
	benchObjects    = flag.Int("recovery.upload_objects", 0, "recovery.upload_objects for BenchmarkRecovery (0: the default)")
)

// BenchmarkRecovery recovers a WAL holding -recovery.size bytes of
// un-uploaded records (8 streams, 256 KiB batches) into each S3 backend and,
// in the same run and to the same endpoint, uploads the same number of
// bytes straight through the transfer manager (objstore.Client.Upload, one
// object, the same part size and concurrency). It reports:
//
//	direct-MiB/s     the transfer manager alone (mean of a run before and one after the recovery)
//	upload-MiB/s     the recovery's upload step (read step done → upload step done)
//	ratio            upload-MiB/s ÷ direct-MiB/s (goal ≥ 0.9)
//	recovery-MiB/s   bytes ÷ (decision → all streams closed)
//	decision-to-closed-s
//	closed/direct    (decision → all streams closed) ÷ the transfer manager's time for the same bytes (goal ≤ 1.2)
//
// Run: go test -run '^$' -bench BenchmarkRecovery -benchtime 1x ./recovery [-args -recovery.size=1073741824]
func BenchmarkRecovery(b *testing.B) {
	dir := b.TempDir()
	walPath := filepath.Join(dir, "b1.wal")
	streams, written := writeBenchWAL(b, walPath, *benchSize)
	for _, name := range []string{"fake", "versitygw"} {
		b.Run(name, func(b *testing.B) {
			s3cfg := s3test.Backends()[name](b)
			cfg := recovery.DefaultConfig() // 8 MiB parts, 8 in parallel, 128 MiB objects, one at a time
			if *benchObjectSize > 0 {
				cfg.ObjectSize = *benchObjectSize
			}
			if *benchObjects > 0 {
				cfg.UploadObjects = *benchObjects
			}
			opts := objstore.Options{Concurrency: cfg.UploadConcurrency, PartSize: cfg.PartSize}
			b.SetBytes(written)
			for i := 0; i < b.N; i++ {
				// The baseline runs before and after the recovery and is
				// averaged, so that a change of load on the machine
				// during the run weighs on both sides.
				before := benchDirect(b, s3cfg, opts, written, i)
				r := benchRecover(b, s3cfg, opts, cfg, walPath, streams, i)
				after := benchDirect(b, s3cfg, opts, written, i)
				direct := (before + after) / 2
				up := float64(r.bytes) / r.upload.Seconds() / (1 << 20)
				b.ReportMetric(direct, "direct-MiB/s")
				b.ReportMetric(up, "upload-MiB/s")
				b.ReportMetric(up/direct, "ratio")
				b.ReportMetric(float64(r.bytes)/r.total.Seconds()/(1<<20), "recovery-MiB/s")
				b.ReportMetric(r.total.Seconds(), "decision-to-closed-s")
				directTime := time.Duration(float64(written) / (direct * (1 << 20)) * float64(time.Second))
				b.ReportMetric(r.total.Seconds()/directTime.Seconds(), "closed/direct")
				b.Logf("%s: %d bytes in %d objects: direct %.0f MiB/s (%s for the bytes), recovery upload %.0f MiB/s (ratio %.2f), decision → closed %s = %.2f× the direct upload (read %s, upload %s, commit+close %s); load average %s",
					name, r.bytes, r.objects, direct, directTime.Round(time.Millisecond), up, up/direct, r.total.Round(time.Millisecond), r.total.Seconds()/directTime.Seconds(),
					r.read.Round(time.Millisecond), r.upload.Round(time.Millisecond), r.rest.Round(time.Millisecond), loadavg())
			}
		})
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	return strings.Fields(string(b))[0]
}

// writeBenchWAL writes size bytes of payload for streams 1..8 and returns
// the stream count and the payload bytes written.
func writeBenchWAL(b testing.TB, path string, size int64) (int, int64) {
	const payload = 256 << 10
	const perBlock = 16
	n := int(size / payload)
	capacity := int64(wal.HeaderRegionSize) + int64(n+perBlock)*(payload+4096) + 1<<20
	capacity = (capacity + 4095) / 4096 * 4096
	w, err := wal.Create(path, wal.CreateOptions{Capacity: capacity, NodeID: 1, NodeEpoch: 1})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	bufs := make([][]byte, 4)
	for i := range bufs {
		bufs[i] = make([]byte, payload)
		for k := range bufs[i] {
			bufs[i][k] = byte(rng.Uint32())
		}
	}
	next := map[uint64]uint64{}
	var batch []wal.Batch
	for i := 0; i < n; i++ {
		s := uint64(i%8 + 1)
		batch = append(batch, wal.Batch{StreamID: s, Epoch: 1, BaseOffset: next[s], Count: 10, Payload: bufs[i%len(bufs)]})
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
	return 8, int64(n) * payload
}

// benchDirect uploads size random bytes as one object with the transfer
// manager and returns MiB/s.
func benchDirect(b *testing.B, cfg objstore.Config, opts objstore.Options, size int64, i int) float64 {
	c, err := objstore.New(context.Background(), cfg, opts)
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(3, 4))
	for k := 0; k+8 <= len(data); k += 8 {
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			data[k+j] = byte(v >> (8 * j))
		}
	}
	key := fmt.Sprintf("bench/direct-%d.obj", i)
	ctx := context.Background()
	start := time.Now()
	if _, err := c.Upload(ctx, key, bytes.NewReader(data), size, nil); err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	_ = c.Delete(ctx, key)
	return float64(size) / el.Seconds() / (1 << 20)
}

type benchResult struct {
	bytes                     int64
	objects                   int
	read, upload, rest, total time.Duration
}

// benchRecover runs one recovery of the WAL on a fresh one-member cluster
// under a fresh key prefix and measures its steps.
func benchRecover(b *testing.B, s3cfg objstore.Config, opts objstore.Options, cfg recovery.Config, walPath string, streams int, i int) benchResult {
	c := newTestCluster(b, "c1")
	apply := func(cmd *waldenv1.Command) *waldenv1.Result {
		res, err := c.apply("admin", cmd)
		if err != nil {
			b.Fatal(err)
		}
		return res
	}
	epoch := apply(op(&waldenv1.RegisterBroker{BrokerId: "b1", Wal: &waldenv1.WalLocation{Path: walPath}})).GetRegisterBroker().GetEpoch()
	for s := 1; s <= streams; s++ {
		apply(op(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: uint64(s)}))
	}
	s3cfg.Prefix = fmt.Sprintf("bench-%d", i)
	store, err := objstore.New(context.Background(), s3cfg, opts)
	if err != nil {
		b.Fatal(err)
	}
	exe := recovery.NewExecutor(recovery.ExecutorConfig{Config: cfg, NodeID: "c1", State: c.s, Cluster: c.Member("c1"), Store: store})
	start := time.Now()
	res := apply(op(&waldenv1.DeclareFailed{BrokerId: "b1", Epoch: epoch, LiveMembers: []string{"c1"}, Evidence: &waldenv1.Evidence{Manual: true, Reason: "bench"}}))
	jobID := res.GetDeclareFailed().GetJobId()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := exe.Run(ctx, jobID, 1); err != nil {
		b.Fatal(err)
	}
	j, _ := c.s.Job(jobID)
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED {
		b.Fatalf("job %s", j.GetJobState().Name())
	}
	at := map[waldenv1.JobStep]int64{}
	for _, cp := range j.GetCheckpoints() {
		at[cp.GetJobStep()] = cp.GetUnixMs()
	}
	ms := func(d int64) time.Duration { return time.Duration(d) * time.Millisecond }
	r := benchResult{bytes: int64(j.GetBytesTotal()), objects: len(j.GetObjects()),
		read:   ms(at[waldenv1.JobStep_JOB_STEP_READ] - start.UnixMilli()),
		upload: ms(at[waldenv1.JobStep_JOB_STEP_UPLOAD] - at[waldenv1.JobStep_JOB_STEP_READ]),
		rest:   ms(at[waldenv1.JobStep_JOB_STEP_CLOSE] - at[waldenv1.JobStep_JOB_STEP_UPLOAD]),
		total:  ms(at[waldenv1.JobStep_JOB_STEP_CLOSE] - start.UnixMilli()),
	}
	objs, _ := store.List(ctx, s3cfg.Prefix+"/")
	for _, o := range objs {
		_ = store.Delete(ctx, o.Key)
	}
	return r
}
