package chaos_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"walden/chaos"
	"walden/chaos/history"
	"walden/chaos/netns"
	"walden/objstore/s3test"
)

// TestChaosShort is the short form of `make chaos` (part of `make test`):
// the scenarios marked Short, with the fast policy and short faults, on
// real processes in network namespaces. It asserts the safety goals — no
// acknowledged record lost, no stale write, a linearizable history, no
// false failover, an AutoMQ broker cut off from the coordinators killed by
// its watchdog before any attestation — and logs the others (duplicates,
// the time to reopen) with the table: duplicates need the idempotent
// producer, and the reopen time is a measure, not a property a loaded
// machine can promise.
func TestChaosShort(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skipf("chaos: %v", err)
	}
	versity := s3test.VersityBin()
	if versity == "" {
		t.Skip("chaos: bin/tools/versitygw not installed; run make versitygw")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "walden")
	if out, err := exec.Command("go", "build", "-o", bin, "walden/cmd/walden").CombinedOutput(); err != nil {
		t.Fatalf("go build walden: %v\n%s", err, out)
	}
	cfg := chaos.Config{Walden: bin, Versity: versity, Dir: filepath.Join(dir, "run"), Policy: "fast", Seed: uint64(time.Now().UnixNano()),
		Warmup: 3 * time.Second, Hold: 20 * time.Second, Cut: 8 * time.Second, After: 2 * time.Second,
		Say: func(line string) { t.Logf("%s %s", time.Now().Format("15:04:05.000"), line) }}
	ctx := context.Background()
	h, err := chaos.New(ctx, cfg)
	if errors.Is(err, netns.ErrBusy) {
		t.Skipf("chaos: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	results, err := h.Run(ctx, chaos.ShortNames())
	if cerr := h.Close(); cerr != nil {
		t.Errorf("removing the chaos network: %v", cerr)
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); bytes.Contains(out, []byte(netns.Prefix)) {
		t.Errorf("namespaces left after Close:\n%s", out)
	}
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	_ = chaos.NewReport("go test ./chaos", time.Now().UTC().Format(time.RFC3339), cfg.Policy, cfg.Seed, results).WriteTable(&table)
	t.Logf("results (seed %d):\n%s", cfg.Seed, table.String())
	if len(results) != len(chaos.ShortNames()) {
		t.Fatalf("%d results for %d scenarios", len(results), len(chaos.ShortNames()))
	}
	for _, r := range results {
		var bad []string
		if r.Error != "" {
			bad = append(bad, r.Error)
		}
		if r.Acked == 0 {
			bad = append(bad, "no record acknowledged")
		}
		if r.Lost != 0 || r.Gaps != 0 || r.Present != r.Acked {
			bad = append(bad, fmt.Sprintf("acked %d present %d lost %d gaps %d", r.Acked, r.Present, r.Lost, r.Gaps))
		}
		if r.StaleWrites != 0 || r.StaleLeases != 0 {
			bad = append(bad, fmt.Sprintf("%d stale writes, %d stale lease answers", r.StaleWrites, r.StaleLeases))
		}
		if r.Linearizable != history.Linearizable {
			bad = append(bad, "history linearizable: "+r.Linearizable)
		}
		if r.FalseFailovers != 0 {
			bad = append(bad, fmt.Sprintf("%d false failovers", r.FalseFailovers))
		}
		// An AutoMQ broker cut off from the coordinators must be dead
		// before any of them attests its lease expired.
		if w := r.Watchdog; w != nil && !w.Before() {
			bad = append(bad, fmt.Sprintf("the watchdog killed the broker at %d ms, the first attestation came at %d ms", w.KillMs, w.FirstAttestMs))
		}
		if len(bad) > 0 {
			t.Errorf("%s (logs and history in %s): %v", r.Scenario, r.Dir, bad)
			keepLogs(t, r.Dir)
			continue
		}
		checkCatches(t, filepath.Join(r.Dir, "history.jsonl"))
	}
}

// checkCatches damages a real history two ways — the last owner read cut
// short before a record acknowledged before it (an acknowledged record
// lost), one acknowledgement moved by an offset — and requires the check to
// call each not linearizable: the check is not vacuous on the histories it
// passes.
func checkCatches(t *testing.T, path string) {
	t.Helper()
	ops, err := history.ReadJSONL(path)
	if err != nil {
		t.Fatal(err)
	}
	damaged := func(what string, edit func([]history.Op) bool) {
		m := append([]history.Op(nil), ops...)
		if !edit(m) {
			t.Fatalf("%s: nothing to damage in %s", what, path)
		}
		if got, err := history.Check(m, time.Minute, ""); got != history.NotLinearizable {
			t.Errorf("%s in %s: check says %s (%v), want %s", what, path, got, err, history.NotLinearizable)
		}
	}
	damaged("an owner read missing an acknowledged record", func(m []history.Op) bool {
		for i := len(m) - 1; i >= 0; i-- {
			r := m[i]
			if r.Kind != history.KindRead || !r.Owner || len(r.ReadIDs) == 0 {
				continue
			}
			// The last record of the read that an acknowledgement,
			// complete before the read began, put there.
			for j := len(r.ReadIDs) - 1; j >= 0; j-- {
				off := r.From + uint64(j)
				for _, a := range m {
					if a.Kind == history.KindAppend && a.Outcome == history.Ok && !a.Duplicate && a.Stream == r.Stream &&
						a.Return < r.Call && a.Base <= off && off < a.Base+uint64(len(a.IDs)) {
						m[i].ReadIDs = r.ReadIDs[:j]
						return true
					}
				}
			}
		}
		return false
	})
	damaged("an acknowledgement at the wrong offset", func(m []history.Op) bool {
		for i := len(m) / 2; i < len(m); i++ {
			if m[i].Kind == history.KindAppend && m[i].Outcome == history.Ok && !m[i].Duplicate {
				m[i].Base++
				return true
			}
		}
		return false
	})
}

// keepLogs copies a failed scenario's directory out of the test's
// temporary directory, which the test removes.
func keepLogs(t *testing.T, dir string) {
	keep, err := os.MkdirTemp("", "walden-chaos-failed-")
	if err != nil {
		return
	}
	if err := exec.Command("cp", "-a", dir, keep).Run(); err == nil {
		t.Logf("kept %s in %s", dir, keep)
	}
}
