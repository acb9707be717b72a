package e2e_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"walden/internal/devcluster"
	"walden/objstore/s3test"
)

var (
	benchBacklog = flag.Int64("e2e.backlog", 64<<20, "BenchmarkFailover: bytes of un-uploaded WAL on the killed broker")
	benchTrials  = flag.Int("e2e.trials", 3, "BenchmarkFailover: trials per policy (a fresh cluster each)")
	benchPolicy  = flag.String("e2e.policy", "both", "BenchmarkFailover: default (walden's defaults), tuned (failure_timeout 2s, lease_ttl 1s, drift_margin 200ms) or both, their trials interleaved")
)

// benchPolicies are the policies BenchmarkFailover measures.
var benchPolicies = map[string][]string{"default": nil, "tuned": testPolicy}

// BenchmarkFailover runs the `walden dev` scenario -e2e.trials times per
// policy, each on a fresh cluster (versitygw S3, 3 coordinators, 3 brokers as
// processes): load on 9 streams at 300 records/s, -e2e.backlog bytes of
// WAL not uploaded on the victim, kill -9, failover, verify. With both
// policies their trials alternate, so that load from elsewhere on the
// machine weighs on both alike. It reports, per policy, the medians, p99
// (nearest rank: the largest of a few trials) and ranges of detection
// (kill -> FAILED committed), recovery (kill -> recovery job done, streams
// closed), reopen (kill -> streams open elsewhere), reopen after the close
// (catalog times) and the producer-visible unavailability (max over
// streams, and median over streams), and fails a trial that loses an
// acknowledged record.
//
//	go test ./e2e -run '^$' -bench BenchmarkFailover -benchtime 1x -timeout 60m -e2e.backlog 67108864 -e2e.trials 5
func BenchmarkFailover(b *testing.B) {
	var names []string
	switch *benchPolicy {
	case "default", "tuned":
		names = []string{*benchPolicy}
	case "both":
		names = []string{"default", "tuned"}
	default:
		b.Fatalf("-e2e.policy: default, tuned or both, not %q", *benchPolicy)
	}
	backlog := *benchBacklog
	for i := 0; i < b.N; i++ {
		type series struct{ det, rec, reo, rac, maxU, medU []int64 }
		got := map[string]*series{}
		for _, name := range names {
			got[name] = &series{}
		}
		start := time.Now()
		loadBefore := loadavg()
		for trial := 0; trial < *benchTrials; trial++ {
			for _, name := range names {
				s := benchTrial(b, benchPolicies[name], backlog)
				g := got[name]
				g.det, g.rec, g.reo, g.rac = append(g.det, s.DetectionMs), append(g.rec, s.RecoveryMs), append(g.reo, s.ReopenMs), append(g.rac, s.ReopenAfterCloseMs)
				g.maxU, g.medU = append(g.maxU, s.MaxUnavailableMs), append(g.medU, s.MedianUnavailableMs)
				fmt.Fprintf(os.Stderr, "%s trial %d: backlog %d B, detection %d ms, recovery %d ms, reopen %d ms (%d ms after the close), unavailable max %d ms median %d ms, acked %d lost %d gaps %d duplicates %d\n",
					name, trial+1, s.BacklogBytes, s.DetectionMs, s.RecoveryMs, s.ReopenMs, s.ReopenAfterCloseMs, s.MaxUnavailableMs, s.MedianUnavailableMs, s.Acked, s.Lost, s.Gaps, s.Duplicates)
			}
		}
		fmt.Fprintf(os.Stderr, "\n%s, backlog %d MiB, %d trials per policy, %d CPUs, load average %s before, %s after; median / p99 (range)\n\n",
			start.UTC().Format(time.DateTime), backlog>>20, *benchTrials, runtime.NumCPU(), loadBefore, loadavg())
		fmt.Fprintln(os.Stderr, "| policy | detection | recovery | reopen | reopen after the close | unavailability, worst stream | median over the streams |")
		fmt.Fprintln(os.Stderr, "|---|---|---|---|---|---|---|")
		for _, name := range names {
			g := got[name]
			fmt.Fprintf(os.Stderr, "| %s | %s | %s | %s | %s | %s | %s |\n", name, cell(g.det), cell(g.rec), cell(g.reo), cell(g.rac), cell(g.maxU), cell(g.medU))
			b.ReportMetric(float64(devcluster.Median(g.det)), name+"-detection-ms")
			b.ReportMetric(float64(devcluster.Median(g.rec)), name+"-recovery-ms")
			b.ReportMetric(float64(devcluster.Median(g.reo)), name+"-reopen-ms")
			b.ReportMetric(float64(devcluster.Median(g.rac)), name+"-reopen-after-close-ms")
			b.ReportMetric(float64(slices.Max(g.maxU)), name+"-max-unavail-p99-ms")
			b.ReportMetric(float64(devcluster.Median(g.maxU)), name+"-max-unavail-ms")
			b.ReportMetric(float64(devcluster.Median(g.medU)), name+"-median-unavail-ms")
		}
	}
}

// cell is "median / p99 (min–max)" in milliseconds; the p99 of a few
// trials is their largest (nearest rank).
func cell(xs []int64) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	p99 := s[int(float64(len(s)-1)*0.99+0.5)]
	return fmt.Sprintf("%d / %d (%s)", devcluster.Median(xs), p99, rangeOf(xs))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	return strings.Fields(string(b))[0]
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
