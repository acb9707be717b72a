package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"walden/agent"
	"walden/config"
	"walden/gossip"
)

// The detection benchmark (not a timed test). Run it with
//
//	go test ./server -run '^$' -bench BenchmarkDetection -benchtime 1x -timeout 30m
//
// and, for a longer soak, add -detect.soak 10m.
var (
	benchTrials = flag.Int("detect.trials", 20, "detection benchmark: agents killed per configuration")
	benchWindow = flag.Duration("detect.window", 20*time.Second, "detection benchmark: kills are spread at random over this window")
	benchAlone  = flag.Bool("detect.memberlist-alone", false, "detection benchmark: also run memberlist in a pool of its own")
	benchSoak   = flag.Duration("detect.soak", 2*time.Minute, "detection benchmark: duration of the false-positive soak (0 skips it)")
	benchSoakOn = flag.String("detect.soak-on", "both", "detection benchmark: the soak's faults are on the links of a \"follower\", of the \"leader\", or \"both\" one after the other")
)

// latencies summarises detection latencies.
type latencies []time.Duration

func (l latencies) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	i := int(float64(len(s)-1)*p + 0.5)
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

// tunedConfig is the "tuned" policy of the failover goals: failure_timeout
// 2s, lease_ttl 1s, drift_margin 200ms; the probes, gossip and raft keep
// their defaults, as for an operator who changes only the policy.
func tunedConfig(cfg *config.Server) {
	defaultConfig(cfg)
	cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = 2*time.Second, time.Second, 200*time.Millisecond
}

// defaultConfig restores every default of gossip, raft and policy.
func defaultConfig(cfg *config.Server) {
	def := config.DefaultServerConfig()
	bind, join, faults := cfg.Gossip.BindAddr, cfg.Gossip.Join, cfg.Gossip.Faults
	cfg.Gossip = def.Gossip
	cfg.Gossip.BindAddr, cfg.Gossip.Join, cfg.Gossip.Faults = bind, join, faults
	cfg.Raft = def.Raft
	cfg.Policy = def.Policy
	benchGates(cfg)
}

// benchGates opens the two gates that would otherwise stop a benchmark that
// kills 20 brokers with nobody recovering them: the jobs stay pending (no
// executor), and many brokers are down at once. Neither gate changes when
// a single broker is detected.
func benchGates(cfg *config.Server) {
	cfg.Policy.MaxConcurrentRecoveries = 1000
	cfg.Policy.MaxFailedFraction = 1
}

// runResult is one configuration's measurement.
type runResult struct {
	lat latencies
	// early counts brokers declared failed before they were killed (false
	// positives, e.g. under CPU starvation); they are not in lat.
	early int
	// terms is how many raft terms passed during the measurement (leader
	// changes restart the decision clock).
	terms uint64
	// gossip are memberlist's detection latencies of the same kills (the
	// coordinators' gossip pools).
	gossip latencies
}

// measureWalden starts a cluster with configure, registers trials agents,
// kills each at a random instant within the window, and returns the time
// from each kill to its FAILED commit as seen on the leader.
func measureWalden(b *testing.B, name string, configure func(*config.Server), agentGossip gossip.Config, margin time.Duration) runResult {
	c := newDetCluster(b, configure)
	c.agentGossip, c.agentMargin = agentGossip, margin
	n := *benchTrials
	agents := make([]*agent.Agent, n)
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("b%02d", i)
		agents[i] = c.startAgent(ids[i], nil)
	}
	c.waitAllAlive(ids...)
	term0 := c.leader().node.Status().Term
	var res runResult
	var mu sync.Mutex
	// memberlist's own verdict on the same node: the first coordinator
	// whose gossip pool says the agent is dead.
	gossipDead := func(i int) bool {
		for _, s := range c.servers {
			for _, m := range s.detector.pool.Members() {
				if m.Name == "agent/"+ids[i] && m.State != gossip.StateAlive {
					return true
				}
			}
		}
		return false
	}
	res.lat, res.gossip = killAndWatch(b, name, n, func(i int) {
		if c.broker(ids[i]).GetFenced() {
			mu.Lock()
			res.early++
			mu.Unlock()
		}
		_ = agents[i].Stop(false)
	}, func(i int) bool {
		return c.broker(ids[i]).GetFenced()
	}, gossipDead)
	res.terms = c.leader().node.Status().Term - term0
	if res.early > 0 {
		var kept latencies
		for _, l := range res.lat {
			if l > 50*time.Millisecond {
				kept = append(kept, l)
			}
		}
		res.lat = kept
	}
	return res
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

// killAndWatch kills n members at random offsets in the window and polls
// until each is detected; it returns kill → detection latencies. When also
// is set, it measures a second detector on the same kills (bounded: it gives
// up on members also has not detected a minute after the last detection).
func killAndWatch(b *testing.B, name string, n int, kill func(int), detected func(int) bool, also func(int) bool) (latencies, latencies) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	offsets := make([]time.Duration, n)
	for i := range offsets {
		offsets[i] = time.Duration(rng.Int64N(int64(*benchWindow)))
	}
	start := time.Now()
	killedAt := make([]time.Time, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(offsets[i])
			mu.Lock()
			killedAt[i] = time.Now()
			mu.Unlock()
			kill(i)
		}()
	}
	out := make(latencies, n)
	done := make([]bool, n)
	var out2 latencies
	done2 := make([]bool, n)
	left, left2 := n, 0
	if also != nil {
		left2 = n
	}
	deadline := start.Add(*benchWindow + 3*time.Minute)
	var alsoDeadline time.Time
	for left > 0 || left2 > 0 {
		if left > 0 && time.Now().After(deadline) {
			b.Fatalf("%s: %d members never detected", name, left)
		}
		if left == 0 && alsoDeadline.IsZero() {
			alsoDeadline = time.Now().Add(time.Minute)
		}
		if left == 0 && time.Now().After(alsoDeadline) {
			b.Logf("%s: the second detector missed %d members within a minute", name, left2)
			break
		}
		for i := range n {
			mu.Lock()
			k := killedAt[i]
			mu.Unlock()
			if k.IsZero() {
				continue
			}
			if !done[i] && detected(i) {
				out[i] = time.Since(k)
				done[i] = true
				left--
			}
			if also != nil && !done2[i] && also(i) {
				out2 = append(out2, time.Since(k))
				done2[i] = true
				left2--
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	return out, out2
}

// measureMemberlist runs memberlist alone (gossip pools with
// DefaultLANConfig): 3 observers and n members that are killed (shut down
// without leaving); the latency is kill → the first observer's dead event.
func measureMemberlist(b *testing.B, n int) latencies {
	start := func(name string, join []string) *gossip.Pool {
		g := gossip.DefaultConfig()
		g.ClusterName, g.NodeName, g.BindAddr, g.Join = "mlbench", name, "127.0.0.1:0", join
		role := gossip.RoleAgent
		if name[0] == 'c' {
			role = gossip.RoleCoordinator
		}
		g.Meta = gossip.Meta{Role: role, ID: name}
		p, err := gossip.Start(g)
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	var observers []*gossip.Pool
	var join []string
	for i := range 3 {
		p := start(fmt.Sprintf("c%d", i+1), join)
		observers = append(observers, p)
		join = append(join, p.Addr())
	}
	var mu sync.Mutex
	dead := map[string]bool{}
	for _, o := range observers {
		go func() {
			for ev := range o.Events() {
				if ev.Kind == gossip.EventLeave {
					mu.Lock()
					dead[ev.Node] = true
					mu.Unlock()
				}
			}
		}()
	}
	members := make([]*gossip.Pool, n)
	for i := range n {
		members[i] = start(fmt.Sprintf("m%02d", i), join)
	}
	defer func() {
		for _, o := range observers {
			_ = o.Shutdown()
		}
	}()
	// Wait until every observer knows every member.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, o := range observers {
			if len(o.Members()) < n+3 {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("memberlist pool did not converge")
		}
		time.Sleep(50 * time.Millisecond)
	}
	l, _ := killAndWatch(b, "memberlist", n, func(i int) { _ = members[i].Shutdown() }, func(i int) bool {
		mu.Lock()
		defer mu.Unlock()
		return dead[fmt.Sprintf("m%02d", i)]
	}, nil)
	return l
}

// soakResult is what the false-positive soak measured.
type soakResult struct {
	// node is the coordinator whose links were degraded, on the one that
	// led at the start (on: "follower" or "leader").
	node, on string
	// failovers sums the brokers' failover counters; decisions counts the
	// decision events (both must stay 0).
	failovers, decisions int
	faults               faultCounts
	// terms is how many raft terms passed during the soak; leaderless
	// counts the 100 ms samples in which no member was leader.
	terms               uint64
	samples, leaderless int
	// checks counts the agents' lease checks (one per agent every 10 ms,
	// as a broker checks before it acknowledges a write); refused those
	// answered "lease not valid", and lapses the times an agent's lease
	// went from valid to not valid.
	checks, refused, lapses int
}

// soak runs the tuned configuration with 20% loss and 0–100 ms jitter on
// every link of one coordinator, a follower or the leader at the start (its
// direct probes, the agents' lease renewals to it and their answers, its
// gossip to and from every member, its raft streams both ways) and counts
// the failovers, and the writes the brokers would have refused for lack of
// a lease.
func soak(b *testing.B, d time.Duration, on string) soakResult {
	c := newDetCluster(b, tunedConfig)
	c.agentGossip, c.agentMargin = gossip.DefaultConfig(), config.DefaultLeaseSafetyMargin
	ids := []string{"s1", "s2", "s3", "s4", "s5"}
	var agents []*agent.Agent
	for _, id := range ids {
		agents = append(agents, c.startAgent(id, nil))
	}
	c.waitAllAlive(ids...)
	r := soakResult{on: on}
	term0 := c.leader().node.Status().Term
	before := c.faults.counts()
	r.node = c.pick(on)
	c.degradeCoordinator(r.node, 0.2, 0, 100*time.Millisecond)
	stop := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			valid := true
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				err := a.Check()
				mu.Lock()
				r.checks++
				if errors.Is(err, agent.ErrLeaseExpired) {
					r.refused++
				}
				if valid && err != nil {
					r.lapses++
				}
				mu.Unlock()
				valid = err == nil
			}
		}()
	}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		r.samples++
		if !slices.ContainsFunc(c.servers, func(s *Server) bool { return s.node.IsLeader() }) {
			r.leaderless++
		}
	}
	close(stop)
	wg.Wait()
	r.faults = c.faults.counts().sub(before)
	for _, id := range ids {
		r.failovers += int(c.broker(id).GetFailovers())
	}
	r.decisions = len(c.events("", "decision"))
	r.terms = c.leader().node.Status().Term - term0
	return r
}

func BenchmarkDetection(b *testing.B) {
	out := io.Writer(os.Stdout)
	if *benchTrials > 0 {
		detectionLatency(b, out)
	}
	if *benchSoak > 0 {
		soakTable(b, out)
	}
}

// detectionLatency measures and prints the latency table. Each
// configuration runs in a sub-benchmark, so that its cluster is stopped
// before the next one starts.
func detectionLatency(b *testing.B, out io.Writer) {
	loadBefore := loadavg()
	start := time.Now()
	var def, tuned runResult
	var ml latencies
	b.Run("default", func(b *testing.B) {
		def = measureWalden(b, "walden default", defaultConfig, gossip.DefaultConfig(), config.DefaultLeaseSafetyMargin)
	})
	b.Run("tuned", func(b *testing.B) {
		tuned = measureWalden(b, "walden tuned", tunedConfig, gossip.DefaultConfig(), config.DefaultLeaseSafetyMargin)
	})
	if *benchAlone {
		b.Run("memberlist", func(b *testing.B) { ml = measureMemberlist(b, *benchTrials) })
	}

	fmt.Fprintf(out, "\nDetection latency: agent killed → FAILED committed (walden) / first dead event (memberlist); %d trials each, kills at random instants over %v, 3 coordinators on loopback; %s, load average %s before, %s after\n\n",
		*benchTrials, *benchWindow, start.UTC().Format(time.DateTime), loadBefore, loadavg())
	fmt.Fprintln(out, "| configuration | median | p99 | min | max | goal (p99) | declared before the kill | raft terms during the run |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|")
	for _, r := range []struct {
		name, goal string
		r          runResult
		ml         bool
	}{
		{"walden, default policy (failure_timeout 5s, lease_ttl 3s, drift 500ms; probes 1s/500ms)", "≤ 5500 ms", def, false},
		{"walden, tuned policy (failure_timeout 2s, lease_ttl 1s, drift 200ms; probes 1s/500ms)", "≤ 2500 ms", tuned, false},
		{"memberlist, DefaultLANConfig: the same kills in the default run, first of the 3 coordinators' pools to say dead", "", runResult{lat: def.gossip}, true},
		{"memberlist, DefaultLANConfig: the same kills in the tuned run", "", runResult{lat: tuned.gossip}, true},
		{"memberlist alone, DefaultLANConfig, its own pool of 3 observers + the killed members", "", runResult{lat: ml}, true},
	} {
		if len(r.r.lat) == 0 {
			continue
		}
		early, terms, goal := fmt.Sprint(r.r.early), fmt.Sprint(r.r.terms), r.goal
		if r.ml {
			early, terms, goal = "n/a", "n/a", "n/a"
		}
		l := r.r.lat
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.name+trialsNote(len(l)), ms(l.pct(0.5)), ms(l.pct(0.99)), ms(l.pct(0)), ms(l.pct(1)), goal, early, terms)
	}
	b.ReportMetric(float64(def.lat.pct(0.5).Milliseconds()), "default-median-ms")
	b.ReportMetric(float64(def.lat.pct(0.99).Milliseconds()), "default-p99-ms")
	b.ReportMetric(float64(tuned.lat.pct(0.5).Milliseconds()), "tuned-median-ms")
	b.ReportMetric(float64(tuned.lat.pct(0.99).Milliseconds()), "tuned-p99-ms")
	b.ReportMetric(float64(def.gossip.pct(0.5).Milliseconds()), "memberlist-median-ms")
}

// soakTable runs the false-positive soak (on a follower, the leader, or
// both one after the other) and prints its table.
func soakTable(b *testing.B, out io.Writer) {
	var ons []string
	switch *benchSoakOn {
	case "follower", "leader":
		ons = []string{*benchSoakOn}
	case "both":
		ons = []string{"follower", "leader"}
	default:
		b.Fatalf("-detect.soak-on %q: want follower, leader or both", *benchSoakOn)
	}
	start := time.Now()
	var rs []soakResult
	for _, on := range ons {
		var r soakResult
		if !b.Run("soak-"+on, func(b *testing.B) { r = soak(b, *benchSoak, on) }) {
			return
		}
		rs = append(rs, r)
	}
	fmt.Fprintf(out, "\nFalse-positive soak: %v each, tuned policy, 5 brokers, 20%% loss + 0–100 ms jitter on every link of one coordinator (probes, the agents' renewals and their answers, gossip both ways, raft both ways); %s, load average %s after\n\n", *benchSoak, start.UTC().Format(time.DateTime), loadavg())
	fmt.Fprintln(out, "| faults on | its probes (dropped) | renewal chunks (lost → retransmitted) | gossip packets dropped / delayed, streams blocked | raft chunks (lost → retransmitted) | raft terms | samples without a leader | writes refused for lack of lease (of checks), lapses | false failovers (decisions) |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		f := r.faults
		fmt.Fprintf(out, "| %s (%s) | %d (%d) | %d (%d) | %d / %d, %d | %d (%d) | %d | %d of %d | %d (of %d), %d | %d (%d) |\n", r.on, r.node, f.probes, f.probesDropped,
			f.agentChunks, f.agentLost, f.gossipDropped, f.gossipDelayed, f.gossipStreamsBlocked, f.raftChunks, f.raftLost, r.terms, r.leaderless, r.samples,
			r.refused, r.checks, r.lapses, r.failovers, r.decisions)
		b.ReportMetric(float64(r.failovers), "false-failovers-"+r.on)
		b.ReportMetric(float64(r.refused), "lease-refusals-"+r.on)
		if r.failovers != 0 || r.decisions != 0 {
			b.Errorf("%d false failovers (%d decisions) under loss and jitter on the %s", r.failovers, r.decisions, r.on)
		}
	}
}

// trialsNote marks a row with fewer trials than asked (a detector that
// missed some within its bound).
func trialsNote(n int) string {
	if n == *benchTrials {
		return ""
	}
	return fmt.Sprintf(" (%d of %d detected)", n, *benchTrials)
}
