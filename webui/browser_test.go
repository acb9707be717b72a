package webui_test

import (
	"context"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	waldenv1 "walden/proto/walden/v1"
	"walden/webui"
)

var screenshots = flag.String("webui.screenshots", "", "directory for the trouble-first test's screenshot (docs/img when the pictures of docs/operating.md are taken again)")

// troubleSource is a cluster in trouble: a coordinator that is reachable
// but does not commit, a broker suspect and held, one failed and held by
// the freeze, one failed over and down, one in maintenance without a ttl,
// a blocked recovery, and healthy brokers around them.
type troubleSource struct{ fakeSource }

const now = t0 + 60_000

func (troubleSource) Status(context.Context) (*waldenv1.StatusResponse, error) {
	return &waldenv1.StatusResponse{ClusterName: "prod", NodeId: "c2", LeaderId: "c1", Term: 9, CommitIndex: 900, ProgressBy: "c1",
		Members: []*waldenv1.Member{
			{Id: "c1", MemberRole: waldenv1.MemberRole_MEMBER_ROLE_LEADER, Reachable: true, Commits: true, MatchIndex: 900, Version: "v0.2.0", RaftAddr: "10.0.1.11:7101", AdminAddr: "10.0.1.11:7001"},
			{Id: "c2", MemberRole: waldenv1.MemberRole_MEMBER_ROLE_FOLLOWER, Reachable: true, Commits: true, MatchIndex: 900, Version: "v0.2.0", RaftAddr: "10.0.1.12:7101", AdminAddr: "10.0.1.12:7001"},
			{Id: "c3", MemberRole: waldenv1.MemberRole_MEMBER_ROLE_FOLLOWER, Reachable: true, Commits: false, MatchIndex: 412, Version: "v0.1.0", RaftAddr: "10.0.1.13:7101", AdminAddr: "10.0.1.13:7001"},
		}}, nil
}

func obs(observer string, st waldenv1.ObservationState, since, unheard int64, reason string) *waldenv1.Observation {
	return &waldenv1.Observation{ObserverId: observer, ObservationState: st, SinceUnixMs: since, UnheardForMs: unheard, Reason: reason, Epoch: 3}
}

func (troubleSource) Brokers(context.Context) ([]*waldenv1.Broker, map[string][]string, error) {
	alive := waldenv1.ObservationState_OBSERVATION_STATE_ALIVE
	suspect := waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT
	dead := waldenv1.ObservationState_OBSERVATION_STATE_DEAD
	healthy := func(id string) *waldenv1.Broker {
		return &waldenv1.Broker{BrokerId: id, BrokerState: waldenv1.BrokerState_BROKER_STATE_ALIVE, Epoch: 3, LeaseRemainingMs: 2800,
			Observations: []*waldenv1.Observation{obs("c1", alive, t0, 0, "probe ok"), obs("c2", alive, t0, 0, "probe ok"), obs("c3", alive, t0, 0, "probe ok")}}
	}
	b1 := &waldenv1.Broker{BrokerId: "b1", BrokerState: waldenv1.BrokerState_BROKER_STATE_RECOVERED, Epoch: 5, Fenced: true, Failovers: 1, FailedUnixMs: now - 30_000,
		Observations: []*waldenv1.Observation{obs("c1", dead, now-33_000, 2_100, "probe: 3 consecutive failures: connection refused"),
			obs("c2", dead, now-33_100, 2_050, "probe: 3 consecutive failures: connection refused")}}
	b2 := &waldenv1.Broker{BrokerId: "b2", BrokerState: waldenv1.BrokerState_BROKER_STATE_SUSPECT, Epoch: 3, LeaseRemainingMs: 900, Hold: "quorum",
		Observations: []*waldenv1.Observation{obs("c1", suspect, now-1_500, 1_200, "probe: 2 consecutive failures: i/o timeout with a long reason that wraps"), obs("c2", alive, t0, 0, "probe ok"), obs("c3", alive, t0, 0, "probe ok")}}
	b6 := &waldenv1.Broker{BrokerId: "b6", BrokerState: waldenv1.BrokerState_BROKER_STATE_SUSPECT, Epoch: 3, Hold: "frozen",
		Observations: []*waldenv1.Observation{obs("c1", dead, now-9_000, 2_000, "gossip: dead"), obs("c2", dead, now-9_000, 2_000, "gossip: dead"), obs("c3", dead, now-9_000, 2_000, "gossip: dead")}}
	b5 := healthy("b5")
	b5.BrokerState, b5.Maintenance, b5.MaintenanceReason = waldenv1.BrokerState_BROKER_STATE_MAINTENANCE, true, "kernel upgrade"
	return []*waldenv1.Broker{b1, b2, healthy("b3"), healthy("b4"), b5, b6, healthy("b7"), healthy("b8")},
		map[string][]string{
			"b2": {"quorum: 1 of 3 coordinators observe it suspect or dead, 2 needed"},
			"b6": {"frozen: automatic failover is frozen: 3 of 8 brokers look failed (max_failed_fraction 0.25)"},
		}, nil
}

func (troubleSource) Jobs(context.Context) ([]*waldenv1.Job, error) {
	done := sampleJob()
	done.JobState, done.JobStep = waldenv1.JobState_JOB_STATE_SUCCEEDED, waldenv1.JobStep_JOB_STEP_DONE
	blocked := &waldenv1.Job{JobId: "job-b9-4", BrokerId: "b9", Token: 4, Attempt: 3, AssigneeId: "c2", JobState: waldenv1.JobState_JOB_STATE_BLOCKED,
		JobStep: waldenv1.JobStep_JOB_STEP_ATTACH, Error: "attach: volume vol-0abc is attached elsewhere", CreatedUnixMs: now - 600_000}
	return []*waldenv1.Job{blocked, done}, nil
}

func (troubleSource) Failovers(context.Context, string) ([]*waldenv1.Failover, error) {
	return nil, nil
}

// chromium is the headless browser of scripts/install-deps.sh; the test is
// skipped without it, except in CI.
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

// TestBrowserTroubleFirst opens the web view of a cluster in trouble in a
// real headless Chromium 1,280 px wide: what needs a person is listed above
// everything else, urgent first; the brokers in trouble come before the
// healthy ones; every column that explains a state is inside the window
// and the page does not scroll sideways; a coordinator that is reachable
// but does not commit says so; a broker failed over and not registered
// again shows "down since" its last contact.
func TestBrowserTroubleFirst(t *testing.T) {
	bin := chromium(t)
	mux := http.NewServeMux()
	mux.Handle("/ui/", webui.Handler(webui.Options{Source: troubleSource{}, Now: func() time.Time { return time.UnixMilli(now) }}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/ui/")); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(bctx, 30*time.Second)
	defer wcancel()
	if err := chromedp.Do(wctx, chromedp.WaitReady(chromedp.CSS(`#attention li[data-kind="maintenance"]`))); err != nil {
		t.Fatalf("the page never listed what needs attention: %v", err)
	}
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}

	// What needs a person, urgent first, in the page's order.
	got := eval(`[...document.querySelectorAll('#attention li')].map(l => l.dataset.kind + ":" + l.dataset.id).join(" ")`)
	if want := "frozen:policy broker:b2 broker:b6 member:c3 job:job-b9-4 down:b1 maintenance:b5"; got != want {
		t.Errorf("attention: %q, want %q", got, want)
	}
	if got := eval(`document.querySelector('#attention li[data-id="b1"]').textContent`); !strings.Contains(got, "down since") {
		t.Errorf("b1's attention item: %q", got)
	}
	if got := eval(`document.querySelector('#attention li[data-id="c3"]').textContent`); !strings.Contains(got, "reachable, not committing") {
		t.Errorf("c3's attention item: %q", got)
	}
	// Sections: attention, then brokers, then coordinators.
	if got := eval(`[...document.querySelectorAll('main > section')].map(s => s.id).slice(0, 3).join(" ")`); got != "attention-section brokers-section members-section" {
		t.Errorf("sections: %q", got)
	}
	// Brokers in trouble first.
	if got := eval(`[...document.querySelectorAll('#brokers tbody tr')].map(r => r.dataset.broker).join(" ")`); got != "b2 b6 b1 b5 b3 b4 b7 b8" {
		t.Errorf("brokers in the order %q", got)
	}
	// b1, failed over and not back, says since when it is down (its last
	// contact: c2 observed it dead 33.1 s before now, not having heard
	// from it for 2.05 s).
	if got := eval(`document.querySelector('#brokers tr[data-broker="b1"] .down-since').textContent`); !strings.Contains(got, "down since") || !strings.Contains(got, "35.15 s") {
		t.Errorf("b1's down since: %q", got)
	}
	// A member's health says whether it commits.
	if got := eval(`[...document.querySelectorAll('#members tbody tr')].map(r => r.dataset.member + "=" + r.querySelector('.health').textContent).join(", ")`); got != "c1=commits, c2=commits, c3=reachable, not committing" {
		t.Errorf("health: %q", got)
	}
	// Every column that explains a state is inside the 1,280 px window,
	// and nothing makes the page scroll sideways.
	if got := eval(`String(window.innerWidth)`); got != "1280" {
		t.Logf("window width %s", got)
	}
	out := eval(`[...document.querySelectorAll('#brokers th[data-col="state"], #brokers th[data-col="why"], #brokers th[data-col="views"], #brokers th[data-col="history"], #members th[data-col="health"], #members th[data-col="version"], #jobs th[data-col="state"], #jobs th[data-col="step"]')]
		.filter(h => h.getBoundingClientRect().right > document.documentElement.clientWidth || h.getBoundingClientRect().width < 40)
		.map(h => h.closest('table').id + "." + h.dataset.col + " right " + Math.round(h.getBoundingClientRect().right)).join(", ")`)
	if out != "" {
		t.Errorf("columns outside the window at 1,280 px: %s", out)
	}
	if got := eval(`document.documentElement.scrollWidth + " " + document.documentElement.clientWidth`); strings.Fields(got)[0] != strings.Fields(got)[1] {
		t.Errorf("the page scrolls sideways at 1,280 px: scroll width, client width %s", got)
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := *screenshots
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.WriteFile(filepath.Join(dir, "webui-trouble-first.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
