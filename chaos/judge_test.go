package chaos

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"walden/chaos/history"
	"walden/loadgen"
)

func TestJudge(t *testing.T) {
	ok := Result{Acked: 10, Present: 10, Linearizable: history.Linearizable, ReopenMs: -1}
	judge(&ok)
	if ok.Verdict != "pass" || len(ok.Missed) != 0 {
		t.Fatalf("clean result judged %s %v", ok.Verdict, ok.Missed)
	}
	wd := Result{Acked: 10, Present: 10, Linearizable: history.Linearizable, ReopenMs: -1, Watchdog: &WatchdogTiming{KillMs: 1800, FirstAttestMs: 3700}}
	judge(&wd)
	if wd.Verdict != "pass" {
		t.Fatalf("a broker killed before the attestations judged %s %v", wd.Verdict, wd.Missed)
	}
	cases := []struct {
		name string
		edit func(*Result)
		want string
	}{
		{"lost", func(r *Result) { r.Lost = 1 }, "1 acknowledged records lost"},
		{"duplicates", func(r *Result) { r.Duplicates = 2 }, "2 duplicates"},
		{"stale", func(r *Result) { r.StaleWrites = 1 }, "1 stale writes"},
		{"false failover", func(r *Result) { r.FalseFailovers = 1 }, "1 false failovers"},
		{"not linearizable", func(r *Result) { r.Linearizable = history.NotLinearizable }, "linearizable: illegal"},
		{"check timed out", func(r *Result) { r.Linearizable = history.CheckTimedOut }, "linearizable: unknown"},
		{"slow reopen", func(r *Result) { r.ReopenMs, r.ReopenGoalMs = 7000, 6500 }, "reopened after 7000 ms, goal 6500 ms"},
		{"never reopened", func(r *Result) { r.ReopenMs, r.ReopenGoalMs = -1, 6500 }, "reopened after -1 ms"},
		{"error", func(r *Result) { r.Error = "boom" }, "did not complete: boom"},
		{"watchdog late", func(r *Result) { r.Watchdog = &WatchdogTiming{KillMs: 3000, FirstAttestMs: 2500} }, "not before the first attestation"},
		{"watchdog never", func(r *Result) { r.Watchdog = &WatchdogTiming{KillMs: -1, FirstAttestMs: 2500} }, "never killed"},
		{"slow decision", func(r *Result) { r.DecisionMs, r.DecisionGoalMs = 6100, 6000 }, "decided) after 6100 ms, goal 6000 ms"},
		{"no decision", func(r *Result) { r.DecisionMs, r.DecisionGoalMs = -1, 6000 }, "decided) after -1 ms"},
		{"healthy lapse", func(r *Result) { r.HealthyLapses = 2 }, "2 lease lapses of brokers the scenario did not act on"},
		{"acknowledged twice", func(r *Result) { r.AckedTwice = 1 }, "1 offsets acknowledged twice"},
	}
	for _, tc := range cases {
		r := Result{Acked: 10, Present: 10, Linearizable: history.Linearizable, ReopenMs: -1}
		tc.edit(&r)
		judge(&r)
		if r.Verdict != "fail" || !strings.Contains(strings.Join(r.Missed, "; "), tc.want) {
			t.Errorf("%s: verdict %s, missed %v; want fail naming %q", tc.name, r.Verdict, r.Missed, tc.want)
		}
	}
}

func TestReopenAfter(t *testing.T) {
	ops := []history.Op{
		{Kind: history.KindStream, Stream: 101, Return: 500e6, State: "opened", OwnerID: "b2"}, // before the fault
		{Kind: history.KindStream, Stream: 101, Return: 3000e6, State: "closed"},
		{Kind: history.KindStream, Stream: 101, Return: 3100e6, State: "opened", OwnerID: "b2"},
		{Kind: history.KindStream, Stream: 102, Return: 3400e6, State: "opened", OwnerID: "b1"}, // still the victim's
		{Kind: history.KindStream, Stream: 102, Return: 3500e6, State: "opened", OwnerID: "b3"},
	}
	if got := reopenAfter(ops, []uint64{101, 102}, "b1", 1000e6); got != 2500 {
		t.Fatalf("reopenAfter = %d ms, want 2500", got)
	}
	if got := reopenAfter(ops, []uint64{101, 103}, "b1", 1000e6); got != -1 {
		t.Fatalf("reopenAfter with a stream never reopened = %d, want -1", got)
	}
}

func TestSelectAndReport(t *testing.T) {
	if _, err := Select([]string{"no-such-scenario"}); err == nil || !strings.Contains(err.Error(), "known:") {
		t.Fatalf("Select of an unknown name: %v", err)
	}
	all, err := Select(nil)
	if err != nil || len(all) != len(Catalog()) {
		t.Fatalf("Select(nil) = %d scenarios, %v", len(all), err)
	}
	short := ShortNames()
	if len(short) == 0 {
		t.Fatal("no scenario in the short form")
	}
	rs := []Result{{Scenario: "a", Verdict: "pass", ReopenMs: -1}, {Scenario: "b", Verdict: "fail", Missed: []string{"2 duplicates"}, ReopenMs: 8500, ReopenGoalMs: 6500}}
	rep := NewReport("walden-chaos", "2026-12-01T00:00:00Z", "default", 7, rs)
	if rep.Passed != 1 || rep.Failed != 1 {
		t.Fatalf("report totals %d/%d", rep.Passed, rep.Failed)
	}
	var tbl, js bytes.Buffer
	if err := rep.WriteTable(&tbl); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SCENARIO", "8.5s (≤6.5s)", "missed: 2 duplicates", "1 passed, 1 failed"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Scenarios) != 2 || back.Scenarios[1].ReopenGoalMs != 6500 {
		t.Fatalf("JSON report: %v\n%s", err, js.String())
	}
}

func TestLeaseRefusals(t *testing.T) {
	ops := []history.Op{
		{Kind: history.KindAppend, Broker: "b1", Reason: "LEASE_INVALID", Return: 500e6},
		{Kind: history.KindAppend, Broker: "b1", Reason: "LEASE_INVALID", Return: 3000e6},
		{Kind: history.KindAppend, Broker: "b1", Reason: "LEASE_INVALID", Return: 9000e6},
		{Kind: history.KindAppend, Broker: "b2", Reason: "LEASE_INVALID", Return: 2000e6},
		{Kind: history.KindAppend, Broker: "b2", Reason: "NOT_OWNER", Return: 2000e6},
	}
	got := leaseRefusals(ops, 1000e6, 5000e6)
	want := "b1 1/1/1 at -0.5s…+8.0s, b2 0/1/0 at +1.0s…+1.0s"
	if got != want {
		t.Fatalf("leaseRefusals = %q, want %q", got, want)
	}
}

// TestHealthyLapses: a lapse is an agent answering "not valid" for an epoch
// it answered valid, or an append refused LEASE_INVALID, of a broker the
// scenario did not act on; a new epoch not valid yet, a fenced answer and
// the affected brokers' lapses are not.
func TestHealthyLapses(t *testing.T) {
	ops := []history.Op{
		{Kind: history.KindLease, Broker: "b2", Epoch: 4, Valid: false, Return: 1},   // not granted yet
		{Kind: history.KindLease, Broker: "b2", Epoch: 4, Valid: true, Return: 2},    // valid
		{Kind: history.KindLease, Broker: "b2", Epoch: 4, Valid: false, Return: 3},   // a lapse
		{Kind: history.KindLease, Broker: "b2", Epoch: 4, Valid: false, Return: 4},   // the same lapse
		{Kind: history.KindLease, Broker: "b2", Epoch: 4, Valid: true, Return: 5},    // valid again
		{Kind: history.KindLease, Broker: "b2", Epoch: 4, Fenced: true, Return: 6},   // fenced: no lapse
		{Kind: history.KindLease, Broker: "b1", Epoch: 1, Valid: true, Return: 2},    // affected
		{Kind: history.KindLease, Broker: "b1", Epoch: 1, Valid: false, Return: 3},   // affected
		{Kind: history.KindAppend, Broker: "b3", Reason: "LEASE_INVALID", Return: 7}, // a refusal
		{Kind: history.KindAppend, Broker: "b1", Reason: "LEASE_INVALID", Return: 7}, // affected
	}
	n, note := healthyLapses(ops, map[string]bool{"b1": true})
	if n != 2 || !strings.Contains(note, "b2 (agent answered not valid) 1") || !strings.Contains(note, "b3 (append refused LEASE_INVALID) 1") {
		t.Fatalf("healthyLapses = %d %q", n, note)
	}
}

// TestAckedTwice counts the offsets of a ledger acknowledged with two
// different records (a record acknowledged again, the same id, is not).
func TestAckedTwice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	var b bytes.Buffer
	for _, e := range []loadgen.LedgerEntry{{Stream: 303, Offset: 2712, ID: "a"}, {Stream: 303, Offset: 2712, ID: "a"},
		{Stream: 303, Offset: 2713, ID: "b"}, {Stream: 303, Offset: 2712, ID: "c"}, {Stream: 101, Offset: 2712, ID: "d"}} {
		line, _ := json.Marshal(e)
		b.Write(append(line, '\n'))
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	n, ex, err := ackedTwice(path)
	if err != nil || n != 1 || len(ex) != 1 || !strings.Contains(ex[0], "stream 303 offset 2712 (a and c)") {
		t.Fatalf("ackedTwice = %d %q %v", n, ex, err)
	}
}
