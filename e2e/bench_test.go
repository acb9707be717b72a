package e2e_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"walden/internal/devcluster"
	"walden/objstore/s3test"
)

var (
	benchBacklog = flag.Int64("e2e.backlog", 64<<20, "BenchmarkFailover: bytes of un-uploaded WAL on the killed broker")
	benchTrials  = flag.Int("e2e.trials", 3, "BenchmarkFailover: trials (a fresh cluster each)")
	benchPolicy  = flag.String("e2e.policy", "default", "BenchmarkFailover: default (walden's defaults) or tuned (failure_timeout 2s, lease_ttl 1s, drift_margin 200ms)")
)

// BenchmarkFailover runs the `walden dev` scenario -e2e.trials times, each on
// a fresh cluster (versitygw S3, 3 coordinators, 3 brokers as processes):
// load on 9 streams at 300 records/s, -e2e.backlog bytes of WAL not uploaded
// on the victim, kill -9, failover, verify. It reports the medians of
// detection (kill -> FAILED committed), recovery (kill -> recovery job done,
// streams closed), reopen (kill -> streams open elsewhere) and the
// producer-visible unavailability (max over streams, and median over
// streams), and fails a trial that loses an acknowledged record.
//
//	go test ./e2e -run '^$' -bench BenchmarkFailover -benchtime 1x -timeout 60m -e2e.backlog 67108864 -e2e.trials 5
func BenchmarkFailover(b *testing.B) {
	var policy []string
	switch *benchPolicy {
	case "default":
	case "tuned":
		policy = testPolicy
	default:
		b.Fatalf("-e2e.policy: default or tuned, not %q", *benchPolicy)
	}
	backlog := *benchBacklog
	for i := 0; i < b.N; i++ {
		var det, rec, reo, rac, maxU, medU []int64
		for trial := 0; trial < *benchTrials; trial++ {
			s := benchTrial(b, policy, backlog)
			det, rec, reo, rac = append(det, s.DetectionMs), append(rec, s.RecoveryMs), append(reo, s.ReopenMs), append(rac, s.ReopenAfterCloseMs)
			maxU, medU = append(maxU, s.MaxUnavailableMs), append(medU, s.MedianUnavailableMs)
			fmt.Fprintf(os.Stderr, "trial %d: backlog %d B, detection %d ms, recovery %d ms, reopen %d ms (%d ms after the close), unavailable max %d ms median %d ms, acked %d lost %d gaps %d duplicates %d\n",
				trial+1, s.BacklogBytes, s.DetectionMs, s.RecoveryMs, s.ReopenMs, s.ReopenAfterCloseMs, s.MaxUnavailableMs, s.MedianUnavailableMs, s.Acked, s.Lost, s.Gaps, s.Duplicates)
		}
		load := "n/a"
		if b, err := os.ReadFile("/proc/loadavg"); err == nil {
			load = strings.Fields(string(b))[0]
		}
		fmt.Fprintf(os.Stderr, "policy %s, backlog %d MiB, %d trials, %d CPUs, load average %s: medians detection %d ms, recovery %d ms, reopen %d ms, unavailable max %d ms, median %d ms; ranges detection %s, recovery %s, max unavailable %s\n",
			*benchPolicy, backlog>>20, len(det), runtime.NumCPU(), load, devcluster.Median(det), devcluster.Median(rec), devcluster.Median(reo), devcluster.Median(maxU), devcluster.Median(medU),
			rangeOf(det), rangeOf(rec), rangeOf(maxU))
		b.ReportMetric(float64(devcluster.Median(det)), "detection-ms")
		b.ReportMetric(float64(devcluster.Median(rec)), "recovery-ms")
		b.ReportMetric(float64(devcluster.Median(reo)), "reopen-ms")
		b.ReportMetric(float64(devcluster.Median(rac)), "reopen-after-close-ms")
		fmt.Fprintf(os.Stderr, "reopen after the recovery closed the streams (catalog times): median %d ms, range %s\n", devcluster.Median(rac), rangeOf(rac))
		b.ReportMetric(float64(devcluster.Median(maxU)), "max-unavail-ms")
		b.ReportMetric(float64(devcluster.Median(medU)), "median-unavail-ms")
	}
}

func rangeOf(xs []int64) string {
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

func benchTrial(b *testing.B, policy []string, backlog int64) *devcluster.Summary {
	b.StopTimer()
	defer b.StartTimer()
	s3 := s3test.StartVersity(b, "")
	// A directory removed after each trial: large WALs do not pile up.
	dir, err := os.MkdirTemp("", "walden-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	opts := devcluster.Options{Bin: waldenBin, Dir: dir, S3: &s3, Policy: policy}
	if backlog > 0 {
		opts.BacklogStreams = true
		opts.WALCapacity = (2*backlog + 64<<20 + 4095) / 4096 * 4096
		opts.UploadBytes, opts.UploadInterval = opts.WALCapacity/2, time.Hour
	}
	c, err := devcluster.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close() // before the directory is removed
	ctx := context.Background()
	if err := c.Start(ctx, 60*time.Second); err != nil {
		b.Fatal(err)
	}
	sc := &devcluster.Failover{Warmup: 3 * time.Second, Backlog: backlog, Timeout: 120 * time.Second}
	s, err := sc.Run(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	if s.Lost != 0 || s.Gaps != 0 || s.Duplicates != 0 {
		b.Fatalf("lost %d gaps %d duplicates %d", s.Lost, s.Gaps, s.Duplicates)
	}
	return s
}
