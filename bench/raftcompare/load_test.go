package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"p50 of 4", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p50 of 5", ms(1, 2, 3, 4, 5), 0.5, 3 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 0.99, 99 * time.Millisecond},
		{"p100", ms(1, 2, 3), 1, 3 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := percentile(tt.sorted, tt.q); got != tt.want {
			t.Errorf("%s: percentile(%v) = %v, want %v", tt.name, tt.q, got, tt.want)
		}
	}
}

func TestSummarizeTakesMedianOfEachMetric(t *testing.T) {
	rounds := []roundResult{
		{Ops: 100, Elapsed: time.Second, P50: 3 * time.Millisecond, P99: 9 * time.Millisecond},
		{Ops: 300, Elapsed: time.Second, P50: 1 * time.Millisecond, P99: 30 * time.Millisecond},
		{Ops: 200, Elapsed: time.Second, P50: 2 * time.Millisecond, P99: 10 * time.Millisecond, Errors: 2, FirstErr: io.EOF},
	}
	c := summarize(rounds)
	if c.OpsPerSec != 200 || c.P50 != 2*time.Millisecond || c.P99 != 10*time.Millisecond {
		t.Fatalf("summarize = %.0f/s p50 %v p99 %v, want 200/s 2ms 10ms", c.OpsPerSec, c.P50, c.P99)
	}
	if c.Ops != 600 || c.Errors != 2 || !errors.Is(c.FirstErr, io.EOF) {
		t.Fatalf("summarize totals = %d ops %d errors %v", c.Ops, c.Errors, c.FirstErr)
	}
}

// fakeSystem answers every proposal after delay, failing every failEvery-th.
type fakeSystem struct {
	delay     time.Duration
	failEvery int64
	calls     atomic.Int64
}

func (f *fakeSystem) Name() string                     { return "fake" }
func (f *fakeSystem) FindLeader(context.Context) error { return nil }
func (f *fakeSystem) Close() error                     { return nil }
func (f *fakeSystem) Propose(ctx context.Context, _ int, _ []byte) error {
	n := f.calls.Add(1)
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.failEvery > 0 && n%f.failEvery == 0 {
		return io.ErrUnexpectedEOF
	}
	return nil
}

func TestRunRoundStopsAtCount(t *testing.T) {
	f := &fakeSystem{failEvery: 10}
	res := runRound(context.Background(), f, loadConfig{
		Concurrency: 8, Duration: time.Minute, MaxOps: 1000, Payload: []byte("x"), OpTimeout: time.Second,
	})
	if got := f.calls.Load(); got != 1000 {
		t.Fatalf("issued %d proposals, want exactly 1000", got)
	}
	if res.Ops != 900 || res.Errors != 100 || !errors.Is(res.FirstErr, io.ErrUnexpectedEOF) {
		t.Fatalf("round = %d ops %d errors (%v), want 900 ops 100 errors", res.Ops, res.Errors, res.FirstErr)
	}
}

func TestRunRoundStopsAtDuration(t *testing.T) {
	f := &fakeSystem{delay: time.Millisecond}
	res := runRound(context.Background(), f, loadConfig{
		Concurrency: 4, Duration: 30 * time.Millisecond, MaxOps: 1 << 30, Payload: []byte("x"), OpTimeout: time.Second,
	})
	if res.Ops == 0 || res.Ops >= 1<<30 || res.Errors != 0 {
		t.Fatalf("round = %d ops %d errors, want some and far below the count bound", res.Ops, res.Errors)
	}
	if res.P50 < time.Millisecond || res.P99 < res.P50 {
		t.Fatalf("latencies p50 %v p99 %v, want p99 >= p50 >= the 1ms delay", res.P50, res.P99)
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Concurrency) != 3 || o.Concurrency[2] != 256 || o.Payload != 256 || len(o.Systems) != 2 || o.Format != "table" {
		t.Fatalf("defaults = %+v", o)
	}
	for _, args := range [][]string{
		{"-concurrency", "1,x"},
		{"-concurrency", "0"},
		{"-systems", "walden,zookeeper"},
		{"-format", "html"},
		{"-o", "yaml"},
		{"-rounds", "0"},
		{"-count", "0"},
		{"-duration", "0s"},
		{"-payload", "0"},
		{"extra"},
	} {
		if _, err := parseFlags(args, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("parseFlags(%q) = %v, want a usage error", args, err)
		}
	}
}

func TestPrintTableMarkdownWithRatios(t *testing.T) {
	o, err := parseFlags([]string{"-concurrency", "1,16", "-format", "markdown"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	results := map[string][]cellResult{
		"walden": {{OpsPerSec: 500, P50: 2 * time.Millisecond, P99: 4 * time.Millisecond}, {OpsPerSec: 3000, P99: 8 * time.Millisecond}},
		"etcd":   {{OpsPerSec: 1000, P50: time.Millisecond, P99: 2 * time.Millisecond}, {OpsPerSec: 2000, P99: 16 * time.Millisecond, Errors: 1, FirstErr: io.EOF}},
	}
	var buf bytes.Buffer
	if err := printTable(&buf, o, []string{"walden", "etcd"}, results, "0.5", "0.6"); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"| concurrency | walden proposals/s | walden p50 | walden p99 | etcd proposals/s | etcd p50 | etcd p99 | proposals/s walden/etcd | p99 walden/etcd |",
		"| 1 | 500 | 2.00 ms | 4.00 ms | 1000 | 1.00 ms | 2.00 ms | 0.50 | 2.00 |",
		"| 16 | 3000 | 0.00 ms | 8.00 ms | 2000 | 0.00 ms | 16.00 ms | 1.50 | 0.50 |",
		"etcd at concurrency 16: 1 failed proposals, first: EOF",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestParseFlagsOutput(t *testing.T) {
	for flagArgs, want := range map[string]string{"-o json": "json", "-o markdown": "markdown", "-format text": "table", "-o table": "table"} {
		o, err := parseFlags(strings.Fields(flagArgs), io.Discard)
		if err != nil || o.Format != want {
			t.Errorf("parseFlags(%q) = %q, %v, want %q", flagArgs, o.Format, err, want)
		}
	}
}

func TestPrintJSONRows(t *testing.T) {
	o, err := parseFlags([]string{"-concurrency", "1,16", "-o", "json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	results := map[string][]cellResult{
		"walden": {{OpsPerSec: 500, P50: 2 * time.Millisecond, P99: 4 * time.Millisecond}, {OpsPerSec: 3000, P99: 8 * time.Millisecond}},
		"etcd":   {{OpsPerSec: 1000, P50: time.Millisecond, P99: 2 * time.Millisecond}, {OpsPerSec: 2000, P99: 16 * time.Millisecond, Errors: 1}},
	}
	var buf bytes.Buffer
	if err := printTable(&buf, o, []string{"walden", "etcd"}, results, "0.5", "0.6"); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rows); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, buf.String())
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2", len(rows))
	}
	want := []map[string]float64{
		{"concurrency": 1, "walden_ops": 500, "etcd_ops": 1000, "ratio": 0.5, "walden_p99_ms": 4, "etcd_p99_ms": 2},
		{"concurrency": 16, "walden_ops": 3000, "etcd_ops": 2000, "ratio": 1.5, "walden_p99_ms": 8, "etcd_p99_ms": 16, "etcd_errors": 1},
	}
	for i, w := range want {
		for k, v := range w {
			if got, ok := rows[i][k].(float64); !ok || got != v {
				t.Errorf("row %d %s = %v, want %v", i, k, rows[i][k], v)
			}
		}
	}

	// One system: no ratio.
	buf.Reset()
	if err := printTable(&buf, o, []string{"walden"}, map[string][]cellResult{"walden": results["walden"]}, "0", "0"); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(buf.Bytes(), &rows); err != nil || rows[0]["ratio"] != nil || rows[0]["etcd_ops"] != nil {
		t.Fatalf("walden alone: %v, %v", rows, err)
	}
}
