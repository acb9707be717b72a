package broker_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/broker"
	"walden/config"
	"walden/coordclient"
	"walden/internal/testutil"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
)

var reopenTrials = flag.Int("reopen.trials", 10, "BenchmarkReopen: trials per mode (each closes -reopen.streams streams)")
var reopenStreams = flag.Int("reopen.streams", 5, "BenchmarkReopen: streams closed per trial")

// reopenObserver records, through its own Watch, when each stream was seen
// closed and when opened by the taker. Both are seen through the same path,
// so their difference is the time the catalog had the stream closed.
type reopenObserver struct {
	mu     sync.Mutex
	closed map[uint64]time.Time
	opened map[uint64]time.Time
	taker  string
}

func (o *reopenObserver) see(r *waldenv1.WatchResponse) error {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range r.GetChanges() {
		st := c.GetStream()
		switch {
		case st.GetState() == "closed":
			if _, ok := o.closed[st.GetStreamId()]; !ok {
				o.closed[st.GetStreamId()] = now
			}
		case st.GetState() == "opened" && st.GetOwnerBrokerId() == o.taker:
			if _, ok := o.opened[st.GetStreamId()]; !ok {
				o.opened[st.GetStreamId()] = now
			}
		}
	}
	return nil
}

func (o *reopenObserver) gap(id uint64) (time.Duration, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c, ok1 := o.closed[id]
	op, ok2 := o.opened[id]
	return op.Sub(c), ok1 && ok2
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := int(float64(len(s))*p+0.5) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// BenchmarkReopen measures "reopen minus recovery": the time a stream stays
// CLOSED in the catalog before a broker with takeover opens it again, for a
// taker that learns of closed streams by polling every takeover_interval
// (500 ms, the default: the behaviour before the Watch API) and for one
// that watches the coordinators' state, side by side in one run against
// one in-process coordinator (raft, catalog, Watch). Each trial starts an
// owner of -reopen.streams fresh streams, appends to them and stops it
// gracefully (it uploads and closes them, as a recovery closes a failed
// broker's streams); the modes alternate trial by trial, each with a taker
// of its own started for the trial, the close at a random point of the
// poller's period.
//
//	go test ./broker -run '^$' -bench BenchmarkReopen -benchtime 1x -reopen.trials 20
func BenchmarkReopen(b *testing.B) {
	dir := b.TempDir()
	fakeS3 := s3test.StartFake(b)
	s3 := fakeS3
	admin, gossipAddr := startCoordinator(b, s3)
	obs := &reopenObserver{closed: map[uint64]time.Time{}, opened: map[uint64]time.Time{}}
	cc := coordclient.New([]string{admin}, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	go func() {
		_ = cc.Watch(wctx, &waldenv1.WatchRequest{Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_STREAM}}, coordclient.WatchOptions{}, obs.see)
	}()

	start := func(id string, pollOnly bool, streams ...uint64) *broker.Broker {
		cfg := realBrokerConfig(dir, admin, gossipAddr, s3, id, streams...)
		cfg.Takeover = len(streams) == 0
		cfg.TakeoverInterval = config.DefaultBrokerTakeoverInterval
		br, err := broker.New(cfg, broker.Options{Logger: logger(b), PollOnly: pollOnly})
		if err != nil {
			b.Fatal(err)
		}
		if err := br.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		waitReady(b, br)
		return br
	}
	modes := []string{"poll", "watch"}
	gaps := map[string][]time.Duration{}
	next := uint64(1000)
	for i := 0; i < b.N; i++ {
		for trial := 0; trial < *reopenTrials; trial++ {
			for _, mode := range modes {
				taker := fmt.Sprintf("t-%s-%d", mode, trial)
				obs.mu.Lock()
				obs.taker = taker
				obs.mu.Unlock()
				tk := start(taker, mode == "poll")
				var ids []uint64
				for k := 0; k < *reopenStreams; k++ {
					ids = append(ids, next)
					next++
				}
				owner := start(fmt.Sprintf("o-%s-%d", mode, trial), true, ids...)
				cl := client(b, owner.Addr())
				for _, id := range ids {
					mustAppend(b, cl, id, "x")
				}
				// The close falls anywhere in the poller's period.
				time.Sleep(time.Duration(rand.Int64N(int64(config.DefaultBrokerTakeoverInterval))))
				if err := owner.Stop(true); err != nil {
					b.Fatal(err)
				}
				testutil.Eventually(b, 30*time.Second, "the taker opens every stream", func() error {
					for _, id := range ids {
						if _, ok := obs.gap(id); !ok {
							return fmt.Errorf("stream %d not seen closed and reopened", id)
						}
					}
					return nil
				})
				for _, id := range ids {
					g, _ := obs.gap(id)
					gaps[mode] = append(gaps[mode], g)
				}
				_ = tk.Stop(false) // its streams stay opened: no other taker takes them
			}
		}
	}
	load := "n/a"
	if l, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Fields(string(l))[0]
	}
	fmt.Fprintf(os.Stderr, "reopen minus recovery (stream CLOSED -> OPENED by the taker), %d streams per mode, %d CPUs, load average %s:\n",
		len(gaps["poll"]), runtime.NumCPU(), load)
	fmt.Fprintf(os.Stderr, "%-6s %10s %10s %10s %10s\n", "mode", "median", "p99", "min", "max")
	for _, m := range modes {
		d := gaps[m]
		fmt.Fprintf(os.Stderr, "%-6s %10s %10s %10s %10s\n", m, percentile(d, 0.5).Round(10*time.Microsecond), percentile(d, 0.99).Round(10*time.Microsecond),
			percentile(d, 0).Round(10*time.Microsecond), percentile(d, 1).Round(10*time.Microsecond))
	}
	ratio := float64(percentile(gaps["poll"], 0.5)) / float64(percentile(gaps["watch"], 0.5))
	fmt.Fprintf(os.Stderr, "median poll / watch: %.1fx\n", ratio)
	b.ReportMetric(float64(percentile(gaps["poll"], 0.5).Microseconds())/1000, "poll-p50-ms")
	b.ReportMetric(float64(percentile(gaps["poll"], 0.99).Microseconds())/1000, "poll-p99-ms")
	b.ReportMetric(float64(percentile(gaps["watch"], 0.5).Microseconds())/1000, "watch-p50-ms")
	b.ReportMetric(float64(percentile(gaps["watch"], 0.99).Microseconds())/1000, "watch-p99-ms")
}
