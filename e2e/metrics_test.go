package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"walden/deploy"
	"walden/internal/devcluster"
	waldenv1 "walden/proto/walden/v1"
)

// peaks scrapes every live coordinator and broker until stopped and keeps,
// per series (name and label pairs), the highest value any of them showed.
type peaks struct {
	c      *devcluster.Cluster
	series [][]string // name, label pairs...
	mu     sync.Mutex
	max    map[string]float64
	// scrapes counts the scrapes tried; lastErr is the last failure.
	scrapes int
	lastErr error
}

func (p *peaks) key(s []string) string { return fmt.Sprint(s) }

func (p *peaks) run(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		for _, m := range p.c.Coords {
			if !m.Alive() {
				continue
			}
			smp, err := p.c.Scrape(ctx, m.Metrics)
			p.mu.Lock()
			p.scrapes++
			if err != nil {
				p.lastErr = err
				p.mu.Unlock()
				continue
			}
			for _, s := range p.series {
				if v := smp.Value(s[0], s[1:]...); v > p.max[p.key(s)] {
					p.max[p.key(s)] = v
				}
			}
			p.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *peaks) peak(s ...string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max[p.key(s)]
}

// scrapeAll scrapes every live coordinator (by name).
func scrapeAll(t *testing.T, c *devcluster.Cluster, procs []*devcluster.Proc, addr func(*devcluster.Proc) string) map[string]devcluster.Samples {
	t.Helper()
	out := map[string]devcluster.Samples{}
	for _, p := range procs {
		if !p.Alive() {
			continue
		}
		s, err := c.Scrape(context.Background(), addr(p))
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		out[p.Name] = s
	}
	return out
}

func coordHTTP(p *devcluster.Proc) string { return p.Metrics } // plain listen.metrics, as Prometheus scrapes
func agentHTTP(p *devcluster.Proc) string { return p.AgentListen }
func maxOf(all map[string]devcluster.Samples, name string, labels ...string) float64 {
	m := 0.0
	for _, s := range all {
		m = max(m, s.Value(name, labels...))
	}
	return m
}
func sumOf(all map[string]devcluster.Samples, name string, labels ...string) float64 {
	v := 0.0
	for _, s := range all {
		v += s.Value(name, labels...)
	}
	return v
}

// TestE2EShortMetricsThroughFailover scrapes a live cluster (processes)
// through a failover with a WAL backlog to recover and checks that the
// series that explain it move: brokers by state, observations, jobs by
// state, the failover count, the phase and step durations, the bytes
// uploaded, and on the brokers their lease, streams and uploads.
func TestE2EShortMetricsThroughFailover(t *testing.T) {
	const backlog = 4 << 20
	c := startCluster(t, func(o *devcluster.Options) {
		capacity := int64(2*backlog+64<<20+4095) / 4096 * 4096
		o.WALCapacity, o.UploadBytes, o.BacklogStreams, o.UploadInterval = capacity, capacity/2, true, time.Hour
		// A fence plugin that takes two seconds (as stopping a machine
		// does), so that the failed and recovering states last long
		// enough to be scraped.
		o.Recovery = append(o.Recovery, "fence: exec", `exec: {command: /bin/sh, args: ["-c", "sleep 2"]}`)
	})
	ctx := context.Background()
	before := scrapeAll(t, c, c.Coords, coordHTTP)
	brokersBefore := scrapeAll(t, c, c.Brokers, agentHTTP)
	for name, s := range before {
		for _, series := range []string{"walden_build_info", "walden_raft_is_leader", "walden_policy_fingerprint", "walden_gossip_members"} {
			if !s.Has(series) {
				t.Fatalf("%s exports no %s", name, series)
			}
		}
		if got := s.Value("walden_brokers", "state", "alive"); got != 3 {
			t.Fatalf("%s: walden_brokers{state=alive} = %v before the failover, want 3", name, got)
		}
	}
	if got := sumOf(before, "walden_raft_is_leader"); got != 1 {
		t.Fatalf("walden_raft_is_leader sums to %v over the members, want 1", got)
	}

	p := &peaks{c: c, max: map[string]float64{}, series: [][]string{
		{"walden_brokers", "state", "failed"}, {"walden_brokers", "state", "recovering"},
		{"walden_observations", "state", "dead"}, {"walden_observations", "state", "suspect"},
		{"walden_recovery_jobs", "state", "running"}, {"walden_recovery_jobs", "state", "pending"},
	}}
	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.run(pctx) }()
	sc := &devcluster.Failover{Warmup: 2 * time.Second, Backlog: backlog, After: time.Second, Say: logSay(t)}
	sum, err := sc.Run(ctx, c)
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, sum)

	// During the failover.
	t.Logf("%d scrapes during the failover (last error: %v)", p.scrapes, p.lastErr)
	if p.peak("walden_brokers", "state", "failed")+p.peak("walden_brokers", "state", "recovering") == 0 {
		t.Error("walden_brokers never showed the victim failed or recovering")
	}
	if p.peak("walden_observations", "state", "dead")+p.peak("walden_observations", "state", "suspect") == 0 {
		t.Error("walden_observations never showed the victim suspect or dead")
	}
	if p.peak("walden_recovery_jobs", "state", "running")+p.peak("walden_recovery_jobs", "state", "pending") == 0 {
		t.Error("walden_recovery_jobs never showed the job pending or running")
	}

	// After it: every live member agrees on the replicated counts; the
	// phases were observed; the assignee measured its steps and uploads.
	var after map[string]devcluster.Samples
	err = devcluster.Poll(ctx, 30*time.Second, "the failover's series", func() error {
		after = scrapeAll(t, c, c.Coords, coordHTTP)
		for name, s := range after {
			b := before[name]
			for _, chk := range []struct {
				series []string
				delta  float64
			}{
				{[]string{"walden_failovers_total"}, 1},
				{[]string{"walden_recovery_jobs", "state", "succeeded"}, 1},
				{[]string{"walden_failover_duration_seconds_count"}, 1},
				{[]string{"walden_failover_phase_duration_seconds_count", "phase", "detect"}, 1},
				{[]string{"walden_failover_phase_duration_seconds_count", "phase", "upload"}, 1},
				{[]string{"walden_failover_phase_duration_seconds_count", "phase", "reopen"}, 1},
			} {
				if got := s.Value(chk.series[0], chk.series[1:]...) - b.Value(chk.series[0], chk.series[1:]...); got != chk.delta {
					return fmt.Errorf("%s: %v moved by %v, want %v", name, chk.series, got, chk.delta)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// One automatic decision, by the leader (which held the broker back by
	// a gate until then); every coordinator granted renewals meanwhile.
	if got := sumOf(after, "walden_failover_decisions_total", "outcome", "failed_over", "reason", "automatic") -
		sumOf(before, "walden_failover_decisions_total", "outcome", "failed_over", "reason", "automatic"); got != 1 {
		t.Errorf("walden_failover_decisions_total{outcome=failed_over,reason=automatic} moved by %v over the members, want 1", got)
	}
	for name, s := range after {
		if s.Value("walden_lease_renewals_total", "result", "granted") <= before[name].Value("walden_lease_renewals_total", "result", "granted") {
			t.Errorf("%s granted no renewal during the failover", name)
		}
	}
	if got := sumOf(after, "walden_recovery_uploaded_bytes_total") - sumOf(before, "walden_recovery_uploaded_bytes_total"); got < backlog {
		t.Errorf("walden_recovery_uploaded_bytes_total moved by %v, want at least the backlog %d", got, backlog)
	}
	for _, step := range []string{"fence", "read", "upload", "commit", "close"} {
		if got := sumOf(after, "walden_recovery_step_duration_seconds_count", "step", step, "result", "ok") -
			sumOf(before, "walden_recovery_step_duration_seconds_count", "step", step, "result", "ok"); got < 1 {
			t.Errorf("walden_recovery_step_duration_seconds{step=%q} observed %v runs", step, got)
		}
	}
	if got := maxOf(after, "walden_failover_phase_duration_seconds_sum", "phase", "upload"); got <= 0 {
		t.Errorf("upload phase sums to %v seconds", got)
	}
	if got := maxOf(after, "walden_recovery_job_stalled_seconds"); got != 0 {
		t.Errorf("walden_recovery_job_stalled_seconds = %v with no job active", got)
	}

	// The surviving brokers took the victim's streams over and kept their
	// leases.
	brokersAfter := scrapeAll(t, c, c.Brokers, agentHTTP)
	delete(brokersBefore, sum.Victim)
	if b, a := sumOf(brokersBefore, "walden_broker_streams"), sumOf(brokersAfter, "walden_broker_streams"); a <= b {
		t.Errorf("walden_broker_streams of the survivors did not grow: %v before, %v after", b, a)
	}
	// Every series the dashboard and the alert rules of deploy/ reference is
	// exported by this live cluster.
	referenced, err := deploy.Series()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, all := range []map[string]devcluster.Samples{before, after, brokersBefore, brokersAfter} {
		for _, smp := range all {
			for name := range smp {
				exported[name] = true
			}
		}
	}
	for _, name := range referenced {
		if !exported[name] {
			t.Errorf("deploy/ references %s, which no coordinator, agent or broker exports", name)
		}
	}

	t.Logf("uploaded by the recovery: %v bytes; failover %v s (phases: upload %v s, reopen %v s)",
		sumOf(after, "walden_recovery_uploaded_bytes_total")-sumOf(before, "walden_recovery_uploaded_bytes_total"),
		maxOf(after, "walden_failover_duration_seconds_sum"), maxOf(after, "walden_failover_phase_duration_seconds_sum", "phase", "upload"),
		maxOf(after, "walden_failover_phase_duration_seconds_sum", "phase", "reopen"))
	for name, s := range brokersAfter {
		if s.Value("walden_agent_lease_valid") != 1 || s.Value("walden_agent_lease_remaining_seconds") <= 0 || s.Value("walden_broker_serving") != 1 {
			t.Errorf("%s: lease valid %v remaining %v serving %v", name, s.Value("walden_agent_lease_valid"),
				s.Value("walden_agent_lease_remaining_seconds"), s.Value("walden_broker_serving"))
		}
		if s.Value("walden_agent_lease_renewals_total", "result", "granted") == 0 {
			t.Errorf("%s: no granted renewal counted", name)
		}
		if s.Value("grpc_server_handled_total", "grpc_method", "Append", "grpc_code", "OK") == 0 {
			t.Errorf("%s: no Append counted in grpc_server_handled_total", name)
		}
	}
	if t.Failed() {
		return
	}

	// The victim comes back and dies again within the cooldown: the leader
	// holds it back by the cooldown gate until an operator acks it, and
	// the series say so.
	victim := c.Proc(sum.Victim)
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	err = devcluster.Poll(ctx, 60*time.Second, sum.Victim+" registered again", func() error {
		b, err := c.GetBroker(ctx, sum.Victim)
		if err != nil {
			return err
		}
		if b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_ALIVE || b.GetEpoch() <= sum.NewEpoch {
			return fmt.Errorf("state %s epoch %d", b.GetBrokerState().Name(), b.GetEpoch())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	victim.Kill()
	err = devcluster.Poll(ctx, 60*time.Second, "the cooldown hold in the series", func() error {
		now := scrapeAll(t, c, c.Coords, coordHTTP)
		if h, b := sumOf(now, "walden_failover_holds", "gate", "cooldown"), maxOf(now, "walden_brokers_cooldown_blocked"); h != 1 || b != 1 {
			return fmt.Errorf("walden_failover_holds{gate=cooldown} %v over the members, walden_brokers_cooldown_blocked %v", h, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
