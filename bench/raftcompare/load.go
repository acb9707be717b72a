package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// errNoLeader is returned when a cluster does not elect a leader in time.
var errNoLeader = errors.New("raftcompare: no leader elected")

// system is one cluster under test, driven on its leader.
type system interface {
	// Name is the column label of the system.
	Name() string
	// FindLeader locates the current leader, so that proposals go to it.
	FindLeader(ctx context.Context) error
	// Propose replicates payload on behalf of worker and returns once the
	// proposal is committed and applied on the leader.
	Propose(ctx context.Context, worker int, payload []byte) error
	// Close stops every member and releases its resources.
	Close() error
}

// loadConfig bounds one round of load.
type loadConfig struct {
	Concurrency int
	Duration    time.Duration // the round stops issuing after this long
	MaxOps      int           // or after this many proposals, whichever comes first
	Payload     []byte
	OpTimeout   time.Duration // per-proposal deadline
}

// roundResult is what one round measured.
type roundResult struct {
	Ops      int
	Errors   int
	Elapsed  time.Duration
	P50      time.Duration
	P90      time.Duration
	P99      time.Duration
	P999     time.Duration
	Max      time.Duration
	Mean     time.Duration
	FirstErr error
}

// OpsPerSec is the rate of successful proposals over the round.
func (r roundResult) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// runRound issues proposals from cfg.Concurrency goroutines until the
// duration or the operation budget is used up, and waits for all of them.
func runRound(ctx context.Context, s system, cfg loadConfig) roundResult {
	var (
		issued   atomic.Int64
		mu       sync.Mutex
		lats     = make([]time.Duration, 0, cfg.MaxOps)
		errCount int
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	for w := range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, cfg.MaxOps/cfg.Concurrency+1)
			var localErrs int
			var localFirst error
			for ctx.Err() == nil && time.Now().Before(deadline) {
				if issued.Add(1) > int64(cfg.MaxOps) {
					break
				}
				opCtx, cancel := context.WithTimeout(ctx, cfg.OpTimeout)
				t0 := time.Now()
				err := s.Propose(opCtx, w, cfg.Payload)
				d := time.Since(t0)
				cancel()
				if err != nil {
					localErrs++
					if localFirst == nil {
						localFirst = err
					}
					continue
				}
				local = append(local, d)
			}
			mu.Lock()
			lats = append(lats, local...)
			errCount += localErrs
			if firstErr == nil {
				firstErr = localFirst
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lats)
	var sum time.Duration
	for _, d := range lats {
		sum += d
	}
	res := roundResult{
		Ops:      len(lats),
		Errors:   errCount,
		Elapsed:  elapsed,
		P50:      percentile(lats, 0.50),
		P90:      percentile(lats, 0.90),
		P99:      percentile(lats, 0.99),
		P999:     percentile(lats, 0.999),
		Max:      percentile(lats, 1),
		FirstErr: firstErr,
	}
	if len(lats) > 0 {
		res.Mean = sum / time.Duration(len(lats))
	}
	return res
}

// percentile returns the nearest-rank q-quantile of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(q*float64(len(sorted))+0.999999999) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

// cellResult is the median across the rounds of one (system, concurrency).
type cellResult struct {
	OpsPerSec float64
	P50, P99  time.Duration
	Ops       int // total successful proposals over all rounds
	Errors    int
	FirstErr  error
	Rounds    []roundResult
}

// summarize takes the median of each metric across rounds independently.
func summarize(rounds []roundResult) cellResult {
	c := cellResult{Rounds: rounds}
	rates := make([]float64, 0, len(rounds))
	p50s := make([]time.Duration, 0, len(rounds))
	p99s := make([]time.Duration, 0, len(rounds))
	for _, r := range rounds {
		rates = append(rates, r.OpsPerSec())
		p50s = append(p50s, r.P50)
		p99s = append(p99s, r.P99)
		c.Ops += r.Ops
		c.Errors += r.Errors
		if c.FirstErr == nil {
			c.FirstErr = r.FirstErr
		}
	}
	sort.Float64s(rates)
	slices.Sort(p50s)
	slices.Sort(p99s)
	if len(rounds) > 0 {
		c.OpsPerSec = medianF(rates)
		c.P50 = medianD(p50s)
		c.P99 = medianD(p99s)
	}
	return c
}

func medianF(s []float64) float64 {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func medianD(s []time.Duration) time.Duration {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// waitFor polls cond every 20ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("raftcompare: waited %s: %w", timeout, ctx.Err())
		case <-t.C:
		}
	}
}
