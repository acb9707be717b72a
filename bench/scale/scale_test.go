package main

import (
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"walden/config"
)

func TestPct(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for _, tc := range []struct{ p, want float64 }{{0, 1}, {0.5, 3}, {0.99, 5}, {1, 5}} {
		if got := pct(xs, tc.p); got != tc.want {
			t.Fatalf("pct(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if pct(nil, 0.5) != 0 {
		t.Fatal("pct of nothing")
	}
}

func TestFlags(t *testing.T) {
	o, err := parseFlags([]string{"-brokers", "10, 1000", "-policy", "tuned"}, io.Discard)
	if err != nil || len(o.Brokers) != 2 || o.Brokers[1] != 1000 || o.Policy != "tuned" {
		t.Fatalf("%+v %v", o, err)
	}
	if o.Transports[0] != "frames" || len(o.Transports) != 1 {
		t.Fatalf("default transports %v", o.Transports)
	}
	if o, err := parseFlags([]string{"-transports", "unary, stream,frames,frames-direct"}, io.Discard); err != nil || len(o.Transports) != 4 || o.Transports[0] != "unary" || o.Transports[2] != "frames" || o.Transports[3] != "frames-direct" {
		t.Fatalf("%+v %v", o, err)
	}
	if len(o.Slots) != 1 || o.Slots[0] != 100*time.Millisecond {
		t.Fatalf("default slots %v", o.Slots)
	}
	if o, err := parseFlags([]string{"-slots", "0, 20ms,1s"}, io.Discard); err != nil || len(o.Slots) != 3 || o.Slots[0] != 0 || o.Slots[1] != 20*time.Millisecond {
		t.Fatalf("%+v %v", o, err)
	}
	if got := slotYAML(50 * time.Millisecond); got != "renewals: {slot: 50ms}\n" {
		t.Fatalf("slotYAML: %q", got)
	}
	if got := slotYAML(-1); got != "" {
		t.Fatalf("slotYAML of the baseline: %q", got)
	}
	if got := renewalsOf(row{Transport: "stream", SlotMs: 100}); got != "stream, 100ms slots" {
		t.Fatalf("renewalsOf: %q", got)
	}
	for _, bad := range [][]string{{"-slots", "2s"}, {"-slots", "-1ms"}, {"-slots", "10us"}, {"-slots", "x"}, {"-transports", "http"}, {"-brokers", "0"}, {"-brokers", "x"}, {"-policy", "fast"}, {"-o", "yaml"}, {"-per-process", "0"}, {"-min-ready", "0"}, {"-min-ready", "1.5"}, {"-gossip-join-rate", "0"}, {"-load-nice", "20"}, {"-load-nice", "-1"}, {"-load-procs", "-1"}} {
		if _, err := parseFlags(bad, io.Discard); !errors.Is(err, errUsage) {
			t.Fatalf("%v: %v, want a usage error", bad, err)
		}
	}
}

func TestBrokerIPsAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i := range 5000 {
		ip := brokerIP(i)
		if seen[ip] {
			t.Fatalf("%s twice", ip)
		}
		seen[ip] = true
	}
}

func TestMarginal(t *testing.T) {
	rows := []row{
		{Build: "walden", Transport: "stream", Brokers: 10, CoordCores: [3]float64{0.02, 0.02, 0.02}, coordRenewalsPerS: [3]float64{10, 10, 10}},
		{Build: "walden", Transport: "unary", Brokers: 1000, CoordCores: [3]float64{0.22, 0.2, 0.2}, coordRenewalsPerS: [3]float64{1000, 1000, 1000}},
		{Build: "walden", Transport: "stream", Brokers: 1000, CoordCores: [3]float64{0.07, 0.05, 0.06}, coordRenewalsPerS: [3]float64{1010, 1010, 1010}},
	}
	marginal(rows)
	for i, want := range [3]float64{0.05, 0.03, 0.04} {
		if got := rows[2].CoordMarginalMs[i]; math.Abs(got-want) > 1e-9 {
			t.Fatalf("marginal %v, want %v at c%d", rows[2].CoordMarginalMs, want, i+1)
		}
	}
	if got := rows[1].CoordMarginalMs; got != [3]float64{} {
		t.Fatalf("a row without a smaller one of its transport got %v", got)
	}
}

// The admin listener's bound is raised only when the agents need it, and
// the coordinator's config accepts the section.
func TestLimitsYAML(t *testing.T) {
	if got := limitsYAML(1000); got != "" {
		t.Fatalf("limits at 1,000 brokers: %q", got)
	}
	text := "cluster_name: scale\nnode_id: c1\ndata_dir: /tmp/x\ninsecure: true\nlisten: {admin: 127.0.0.1:7001, raft: 127.0.0.1:7002}\n" +
		"initial_cluster:\n  - {id: c1, raft: 127.0.0.1:7002, admin: 127.0.0.1:7001}\n" + limitsYAML(5000)
	cfg, err := config.ParseServer("c1.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Limits.Admin.MaxConns != 6000 {
		t.Fatalf("max_conns %d", cfg.Limits.Admin.MaxConns)
	}
}

// The table tells the lapses and the gossip members of the steady window
// from those of the whole measurement.
func TestTableShowsTheSteadyWindow(t *testing.T) {
	var b strings.Builder
	printTable(&b, []row{{Build: "walden", Transport: "frames", Brokers: 1000, GossipMembers: 1000, GossipSeen: 1000,
		GossipAliveSteady: [2]int{998, 997}, Lapses: 759, SteadyLapses: 2}})
	for _, want := range []string{"1000 (1000; 998→997)", "759 (2)", "lapses (in the window)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
