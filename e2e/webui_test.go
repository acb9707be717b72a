package e2e_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"walden/internal/devcluster"
	waldenv1 "walden/proto/walden/v1"
)

var screenshots = flag.String("e2e.screenshots", "", "directory for the web view test's screenshots (default: walden-webui-screenshots under the system's temporary directory)")

// chromium returns the path of the headless browser, installed by
// scripts/install-deps.sh (make deps). Without it the test is skipped,
// except in CI, where it must be there.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed: make deps installs it (scripts/install-deps.sh)")
	}
	t.Skip("chromium is not installed: make deps installs it (scripts/install-deps.sh)")
	return ""
}

// TestE2EShortWebView drives the web view in a real headless Chromium
// while a broker is killed: the page shows the broker alive, then failed,
// recovering and recovered (its recent states), the recovery job's
// progress, and the failover's timeline with every phase up to the reopen
// of its streams; the event log filters. Screenshots of each stage are
// saved (-e2e.screenshots).
func TestE2EShortWebView(t *testing.T) {
	bin := chromium(t)
	const backlog = 16 << 20
	c := startCluster(t, func(o *devcluster.Options) {
		// A backlog of un-uploaded WAL to recover, and a fence plugin that
		// takes 3 seconds (as stopping a machine does), so that the
		// recovery runs long enough to be seen between two polls of the
		// page.
		capacity := int64(2*backlog+64<<20+4095) / 4096 * 4096
		o.WALCapacity, o.UploadBytes, o.BacklogStreams, o.UploadInterval = capacity, capacity/2, true, time.Hour
		o.Recovery = append(o.Recovery, "fence: exec", `exec: {command: /bin/sh, args: ["-c", "sleep 3"]}`)
		// The browser has no client certificate: the page is served in
		// plaintext (the web view's authorization is server's
		// TestWebViewAuthorization).
		o.Insecure = true
	})
	dir := *screenshots
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "walden-webui-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()

	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Errorf("screenshot %s: %v", name, err)
			return
		}
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Error(err)
		}
	}
	// wait waits for a CSS selector to match, with a deadline of its own.
	wait := func(what, sel string, timeout time.Duration) {
		t.Helper()
		wctx, cancel := context.WithTimeout(bctx, timeout)
		defer cancel()
		if err := chromedp.Do(wctx, chromedp.WaitReady(chromedp.CSS(sel))); err != nil {
			html, _ := chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("main")))
			t.Fatalf("the page never showed %s (%s): %v\n%s", what, sel, err, html)
		}
	}
	js := func(expr string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Evaluate[any](expr)); err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
	}

	// A follower's view serves too: open the page on c2.
	url := "http://" + c.Coords[1].HTTP + "/ui/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	wait("b1 alive", `#brokers tr[data-broker="b1"][data-state="alive"]`, 60*time.Second)
	wait("the leader", `#leader[data-leader^="c"]`, 30*time.Second)
	wait("three coordinators", `#members tr[data-member="c3"]`, 10*time.Second)
	shot("webui-1-healthy.png")
	// Record every state b1's row shows from now on.
	js(`window.seenStates = []; setInterval(() => {
		const r = document.querySelector('#brokers tr[data-broker="b1"]');
		if (r && window.seenStates[window.seenStates.length - 1] !== r.dataset.state) window.seenStates.push(r.dataset.state);
	}, 50); true`)

	recoveringShot := false
	sc := &devcluster.Failover{Victim: "b1", Warmup: 2 * time.Second, Backlog: backlog, After: time.Second, Say: logSay(t),
		DuringRecovery: func(ctx context.Context, j *waldenv1.Job) (bool, error) {
			if j.GetJobState() != waldenv1.JobState_JOB_STATE_RUNNING {
				return false, nil
			}
			// The fence plugin runs for 3s: the page shows the recovery
			// running; photograph it.
			wctx, cancel := context.WithTimeout(bctx, 2500*time.Millisecond)
			defer cancel()
			if chromedp.Do(wctx, chromedp.WaitReady(chromedp.CSS(`#brokers tr[data-broker="b1"][data-state="recovering"]`))) == nil {
				recoveringShot = true
				shot("webui-2-recovering.png")
			}
			return true, nil
		}}
	sum, err := sc.Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, sum)

	// The page: b1 recovered, and its recent states went through failed
	// and recovering; the job succeeded; the failover's timeline has every
	// phase, the reopen finished.
	wait("b1 recovered", `#brokers tr[data-broker="b1"][data-state="recovered"]`, 30*time.Second)
	for _, st := range []string{"failed", "recovering", "recovered"} {
		wait("b1's recent state "+st, `#brokers tr[data-broker="b1"] .history [data-state="`+st+`"]`, 10*time.Second)
	}
	wait("the job succeeded", `#jobs tr[data-job="`+sum.JobID+`"][data-state="succeeded"]`, 10*time.Second)
	card := `.failover[data-failover="` + sum.JobID + `"]`
	wait("the failover succeeded", card+`[data-state="succeeded"]`, 10*time.Second)
	for _, kind := range []string{"observe", "decide", "fence", "attach", "read", "upload", "commit", "close", "detach"} {
		wait("the timeline's "+kind+" phase", card+` svg.timeline g.phase[data-kind="`+kind+`"]`, 10*time.Second)
	}
	wait("the reopen, finished", card+` svg.timeline g.phase[data-kind="reopen"][data-running="false"]`, 30*time.Second)

	// Trouble first: b1 is failed over and stays down (killed, not
	// restarted): the page lists it under "needs attention", above the
	// brokers, and its row says since when it is down; every coordinator
	// commits; the columns that explain a state fit in 1,280 px.
	wait("b1 down, needing attention", `#attention li[data-kind="down"][data-id="b1"]`, 10*time.Second)
	wait("b1's down since", `#brokers tr[data-broker="b1"] .down-since`, 10*time.Second)
	wait("every coordinator committing", `#members tr[data-member="c3"][data-health="ok"]`, 10*time.Second)
	layout, err := chromedp.Run(bctx, chromedp.Evaluate[string](`[
		[...document.querySelectorAll('main > section')].map(s => s.id).slice(0, 3).join(" "),
		String(document.querySelectorAll('#members tr[data-health="ok"]').length),
		[...document.querySelectorAll('#brokers th[data-col="state"], #brokers th[data-col="why"], #brokers th[data-col="views"], #members th[data-col="health"]')]
			.filter(h => h.getBoundingClientRect().right > document.documentElement.clientWidth).map(h => h.dataset.col).join(","),
		String(document.documentElement.scrollWidth <= document.documentElement.clientWidth),
	].join("|")`))
	if err != nil || layout != "attention-section brokers-section members-section|3||true" {
		wide, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
			.slice(0, 8).map(e => e.tagName + "#" + e.id + "." + e.className.baseVal + e.className + " " + Math.round(e.getBoundingClientRect().right)).join("; ")`))
		t.Fatalf("layout (sections | members committing | columns outside 1,280 px | no sideways scroll): %q %v; wider than the window: %s", layout, err, wide)
	}
	// Each coordinator's observation starts at its last contact with b1:
	// the decision needed failure_timeout (2s) of silence, so the observed
	// phases of a quorum of coordinators last at least that long (from the
	// first suspicion they lasted less).
	long, err := chromedp.Run(bctx, chromedp.Evaluate[int](`[...document.querySelectorAll('`+card+` svg.timeline g.phase[data-kind="observe"]')].filter(g => Number(g.dataset.ms) >= 2000).length`))
	if err != nil || long < 2 {
		t.Fatalf("observed phases of at least failure_timeout: %d (%v); the timeline must start at the last contact", long, err)
	}
	seen, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`window.seenStates`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("states b1's row showed: %v (recovery photographed: %v)", seen, recoveringShot)
	if len(seen) == 0 || seen[len(seen)-1] != "recovered" || !slices.Contains(seen, "recovering") || !recoveringShot {
		t.Fatalf("b1's row showed %v; the recovery photographed: %v", seen, recoveringShot)
	}
	facts, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('`+card+` .facts').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(facts, "recovered by "+sum.JobAssignee) || !strings.Contains(facts, "decided by c") {
		t.Fatalf("failover facts %q (assignee %s)", facts, sum.JobAssignee)
	}
	shot("webui-3-recovered.png")
	if err := chromedp.Do(bctx, chromedp.ScrollIntoView(chromedp.CSS(card))); err != nil {
		t.Fatal(err)
	}
	timelinePNG, err := chromedp.Run(bctx, chromedp.Screenshot(chromedp.CSS(card)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "webui-timeline.png"), timelinePNG, 0o644); err != nil {
		t.Fatal(err)
	}

	// The event log filters: only decisions, then only b1's.
	js(`const k = document.querySelector('#filter-kind'); k.value = 'decision'; k.dispatchEvent(new Event('input')); true`)
	err = devcluster.Poll(ctx, 10*time.Second, "the event log filtered to decisions", func() error {
		kinds, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#events tbody tr')].map(r => r.dataset.kind)`))
		if err != nil {
			return err
		}
		if len(kinds) == 0 || strings.Trim(strings.Join(kinds, ""), "decision") != "" {
			return fmt.Errorf("rows of kinds %v", kinds)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	shot("webui-4-events-filtered.png")
}
