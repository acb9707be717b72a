package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"walden/bench/internal/procstat"
	waldenv1 "walden/proto/walden/v1"
)

// errUsage marks a bad command line.
var errUsage = errors.New("scale: usage")

// options are the command-line flags.
type options struct {
	Walden        string
	Baseline      string
	Brokers       []int
	Kills         int
	Window        time.Duration
	Steady        time.Duration
	Settle        time.Duration
	PerProcess    int
	GossipMembers int
	Transports    []string
	Slots         []time.Duration
	RegisterRate  int
	JoinRate      int
	LoadNice      int
	LoadProcs     int
	MinReady      float64
	Policy        string
	Format        string
	Dir           string
	Keep          bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-load" {
		loadMain()
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Walden, "walden", "", "the walden binary the coordinators run (empty: built from the repository into the run's directory)")
	fs.StringVar(&o.Baseline, "baseline", "", "another walden binary (e.g. built from an earlier commit), measured side by side: before each measurement of -walden, the same measurement of it")
	brokers := fs.String("brokers", "10,100,1000,5000", "comma-separated numbers of brokers, one measurement each")
	transports := fs.String("transports", "frames", "comma-separated renewal transports of the agents, one measurement each: frames (one connection of frames per agent and coordinator, as package agent renews by default), frames-direct (the same connections and frames, renewed by the load generator's own loop instead of package agent's Renewer: the coordinators see the same traffic, the load side spends less on each renewal, for fleets one host cannot simulate otherwise), frames-epoll (the same again, every connection of a load process driven by one goroutine through an epoll set of its own: the lightest load side, Linux only), stream (one gRPC stream per agent and coordinator, as package agent renews with renewals.transport: stream) and unary (one RenewLease call per renewal, as agents before streamed renewals did; the -baseline binary is measured with it)")
	slots := fs.String("slots", "100ms", "comma-separated renewal slots of the coordinators (renewals.slot; 0: off), one measurement each with every transport (the -baseline binary is measured without the key)")
	fs.IntVar(&o.Kills, "kills", 20, "brokers killed per measurement (in rounds of at most half the brokers, revived between rounds)")
	fs.DurationVar(&o.Window, "window", 20*time.Second, "the kills of a round happen at random instants over this window")
	fs.DurationVar(&o.Steady, "steady", 60*time.Second, "the steady-state window over which CPU, RSS, raft entries, renewals and probes are measured")
	fs.DurationVar(&o.Settle, "settle", 10*time.Second, "wait after every broker is observed alive, before the steady window")
	fs.IntVar(&o.PerProcess, "per-process", 1000, "simulated agents per load process")
	fs.IntVar(&o.GossipMembers, "gossip-members", 1000, "how many of the agents are memberlist gossip members, spread evenly over the load processes (each holds the whole pool: memory grows as its square in the load processes)")
	fs.IntVar(&o.RegisterRate, "register-rate", 100, "registrations per second per load process at start")
	fs.IntVar(&o.LoadNice, "load-nice", 0, "the load processes' nice value (0 to 19): above 0, the coordinators are served first when the host's cores are all busy, as on a fleet where every agent runs on its broker's own host; the rows' CPU wait of the load processes says what it cost them")
	fs.IntVar(&o.LoadProcs, "load-procs", 0, "the load processes' GOMAXPROCS (0: Go's default, one per core of the host): 1 keeps a load process's scheduler from spinning on a second core in search of work, CPU that a host shared with the coordinators takes from them")
	fs.IntVar(&o.JoinRate, "gossip-join-rate", 5, "gossip joins per second at start, all load processes together (the members join before any agent registers)")
	fs.Float64Var(&o.MinReady, "min-ready", 1, "the steady window starts once this fraction of the agents hold a valid lease and are observed alive by every coordinator (1: all; below 1 for loads the load generator cannot hold whole; kills pick among those)")
	fs.StringVar(&o.Policy, "policy", "default", "default (walden's defaults) or tuned (failure_timeout 2s, lease_ttl 1s, drift_margin 200ms)")
	fs.StringVar(&o.Format, "o", "table", "output: table or json")
	fs.StringVar(&o.Dir, "dir", "", "parent of the run's temporary directory (default: the system's)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the run's directory (configs, data, logs)")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	for _, f := range strings.Split(*transports, ",") {
		f = strings.TrimSpace(f)
		if f != "frames" && f != "frames-direct" && f != "frames-epoll" && f != "stream" && f != "unary" {
			return o, fmt.Errorf("%w: -transports: frames, frames-direct, frames-epoll, stream or unary, not %q", errUsage, f)
		}
		o.Transports = append(o.Transports, f)
	}
	for _, f := range strings.Split(*slots, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d < 0 || d > time.Second || (d > 0 && d < time.Millisecond) {
			return o, fmt.Errorf("%w: -slots: %q is not 0 or a duration from 1ms to 1s", errUsage, f)
		}
		o.Slots = append(o.Slots, d)
	}
	for _, f := range strings.Split(*brokers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return o, fmt.Errorf("%w: -brokers: %q is not a positive number", errUsage, f)
		}
		o.Brokers = append(o.Brokers, n)
	}
	switch {
	case o.Policy != "default" && o.Policy != "tuned":
		return o, fmt.Errorf("%w: -policy: default or tuned, not %q", errUsage, o.Policy)
	case o.Format != "table" && o.Format != "json":
		return o, fmt.Errorf("%w: -o: table or json, not %q", errUsage, o.Format)
	case o.LoadNice < 0 || o.LoadNice > 19:
		return o, fmt.Errorf("%w: -load-nice: from 0 to 19, not %d", errUsage, o.LoadNice)
	case o.LoadProcs < 0:
		return o, fmt.Errorf("%w: -load-procs: 0 (Go's default) or more, not %d", errUsage, o.LoadProcs)
	case o.Kills < 0 || o.PerProcess < 1 || o.RegisterRate < 1 || o.JoinRate < 1 || o.GossipMembers < 0:
		return o, fmt.Errorf("%w: -kills, -per-process, -register-rate, -gossip-join-rate and -gossip-members must be positive", errUsage)
	case !(o.MinReady > 0 && o.MinReady <= 1):
		return o, fmt.Errorf("%w: -min-ready: a fraction in (0, 1], not %v", errUsage, o.MinReady)
	case o.Window <= 0 || o.Steady <= 0:
		return o, fmt.Errorf("%w: -window and -steady must be positive", errUsage)
	}
	return o, nil
}

// row is one measurement.
type row struct {
	// Build is "walden", or "baseline" for the -baseline binary.
	Build string `json:"build"`
	// Transport is how the agents renewed: frames, frames-direct,
	// frames-epoll, stream or unary.
	Transport string `json:"transport"`
	// SlotMs is the coordinators' renewals.slot in milliseconds (0: off,
	// or the baseline, whose config does not set it).
	SlotMs        float64 `json:"slot_ms"`
	Brokers       int     `json:"brokers"`
	GossipMembers int     `json:"gossip_members"`
	// GossipSeen is the fewest agents a coordinator's gossip pool had
	// alive once the members had joined, before the agents registered.
	GossipSeen int `json:"gossip_seen"`
	// GossipAliveSteady is the fewest agents a coordinator's gossip pool
	// had alive at the start and at the end of the steady window: the
	// members that still held their place while the agents renewed.
	GossipAliveSteady [2]int `json:"gossip_alive_steady"`
	LoadProcesses     int    `json:"load_processes"`
	// LoadNice is the load processes' nice value (-load-nice).
	LoadNice int `json:"load_nice"`
	// LoadProcs is the load processes' GOMAXPROCS (-load-procs; 0: Go's
	// default).
	LoadProcs int    `json:"load_procs"`
	Policy    string `json:"policy"`
	// JoinS is from the first agent started to every coordinator's pool
	// holding every gossip member; StartupS from the registrations' start
	// to every coordinator observing the brokers alive (-min-ready of
	// them).
	JoinS    float64 `json:"gossip_join_s"`
	StartupS float64 `json:"startup_s"`
	// ReadyFraction is the fraction of the brokers that every coordinator
	// observed alive when the steady window started (1 unless -min-ready
	// is below 1).
	ReadyFraction float64 `json:"ready_fraction"`
	// Per coordinator (c1, c2, c3) over the steady window.
	Leader          string     `json:"leader"`
	CoordCores      [3]float64 `json:"coordinator_cores"`
	CoordRSSMB      [3]float64 `json:"coordinator_rss_mb"`
	CoordPeakRSSMB  [3]float64 `json:"coordinator_peak_rss_mb"`
	CoordGoroutines [3]int     `json:"coordinator_goroutines"`
	RaftEntriesPerS float64    `json:"raft_entries_per_s"`
	// Renewals granted per second, all coordinators together, and the
	// renewal round trip's p99 (upper bound of its histogram bucket) as
	// the agents saw it.
	RenewalsPerS float64 `json:"renewals_per_s"`
	// CoordMsPerRenewal is each coordinator's CPU per renewal it granted
	// (its cores over its renewals per second, in ms): everything the
	// coordinator did over the window, the observer, raft and gossip
	// included. CoordMarginalMs is the same above the fewest-broker row of
	// the same build and transport in the run (the CPU the added renewals
	// cost, on the leader and the followers alike). LoadMsPerRenewal is the
	// load processes' CPU per renewal they were granted.
	CoordMsPerRenewal [3]float64        `json:"coordinator_ms_per_renewal"`
	CoordMarginalMs   [3]float64        `json:"coordinator_marginal_ms_per_renewal,omitempty"`
	LoadMsPerRenewal  float64           `json:"load_ms_per_renewal"`
	RenewalP99Ms      float64           `json:"renewal_p99_ms"`
	RenewalsRefused   map[string]uint64 `json:"renewals_refused"`
	RenewalsFailed    uint64            `json:"renewals_failed"`
	ProbesPerS        float64           `json:"probes_per_s"`
	// Detection: kill → FAILED committed, seen on the leader.
	Kills          int     `json:"kills"`
	Detected       int     `json:"detected"`
	DetectP50Ms    float64 `json:"detection_p50_ms"`
	DetectP99Ms    float64 `json:"detection_p99_ms"`
	DetectMinMs    float64 `json:"detection_min_ms"`
	DetectMaxMs    float64 `json:"detection_max_ms"`
	FalseFailovers int     `json:"false_failovers"`
	// Lapses counts live agents whose lease went from valid to not valid
	// during the whole measurement (never a killed one); SteadyLapses those
	// within the steady window.
	Lapses       uint64 `json:"lease_lapses"`
	SteadyLapses uint64 `json:"steady_lease_lapses"`
	// CoordWait and LoadWait are how long the coordinators (the most
	// waiting one) and the load processes (together) waited runnable for
	// a CPU per second they ran, over the steady window: above 1 the
	// machine, not the process, set the pace.
	CoordWait float64 `json:"coordinator_cpu_wait_per_run"`
	LoadWait  float64 `json:"load_cpu_wait_per_run"`
	// Error says why a measurement stopped short.
	Error string `json:"error,omitempty"`
	// The load processes together over the steady window.
	LoadCores  float64 `json:"load_cores"`
	LoadRSSMB  float64 `json:"load_rss_mb"`
	LoadBefore string  `json:"load_average_before"`
	// coordRenewalsPerS are the renewals each coordinator granted per
	// second over the steady window.
	coordRenewalsPerS [3]float64
	LoadAfter         string `json:"load_average_after"`
	Date              string `json:"date"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	top, err := os.MkdirTemp(o.Dir, "walden-scale-")
	if err != nil {
		return err
	}
	if o.Keep {
		fmt.Fprintf(stderr, "run directory: %s\n", top)
	} else {
		defer os.RemoveAll(top)
	}
	if o.Walden == "" {
		o.Walden = filepath.Join(top, "walden")
		fmt.Fprintln(stderr, "building walden ...")
		root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "walden").Output()
		if err != nil {
			return fmt.Errorf("scale: find the walden module: %w", err)
		}
		b := exec.CommandContext(ctx, "go", "build", "-C", strings.TrimSpace(string(root)), "-o", o.Walden, "./cmd/walden")
		b.Stdout, b.Stderr = stderr, stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("scale: build walden: %w", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var rows []row
	// The variants measured side by side at every number of brokers: the
	// -baseline binary (agents renewing one call each, as they did with
	// it), then this walden with each transport and renewal slot.
	type variant struct {
		name, bin, transport string
		slot                 time.Duration // -1: not configured
	}
	var variants []variant
	if o.Baseline != "" {
		variants = append(variants, variant{"baseline", o.Baseline, "unary", -1})
	}
	for _, t := range o.Transports {
		for _, sl := range o.Slots {
			variants = append(variants, variant{"walden", o.Walden, t, sl})
		}
	}
	for _, n := range o.Brokers {
		for _, b := range variants {
			fmt.Fprintf(stderr, "%s (%s renewals, slot %v), %d brokers: starting (load average %s)\n", b.name, b.transport, max(b.slot, 0), n, procstat.Loadavg())
			r, err := measure(ctx, o, b.bin, b.transport, b.slot, self, top, n, stderr)
			r.Build, r.Transport, r.SlotMs = b.name, b.transport, float64(max(b.slot, 0))/float64(time.Millisecond)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				// A measurement that stopped short is a result too: say
				// why, and go on with the next.
				r.Error = err.Error()
				fmt.Fprintf(stderr, "%s (%s renewals), %d brokers: stopped: %v\n", b.name, b.transport, n, err)
			}
			rows = append(rows, r)
			fmt.Fprintf(stderr, "%s (%s renewals), %d brokers: done: %s\n", b.name, b.transport, n, summary(r))
		}
	}
	marginal(rows)
	if o.Format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	printTable(stdout, rows)
	fmt.Fprintf(stdout, "\n%s, %d CPUs, go run ./scale %s\n", time.Now().Format(time.DateTime), runtime.NumCPU(), strings.Join(args, " "))
	return nil
}

func summary(r row) string {
	return fmt.Sprintf("cores %.3f/%.3f/%.3f, rss %.0f/%.0f/%.0f MB, entries/s %.1f, renewals/s %.0f (p99 ≤%.0f ms), ms/renewal %.3f/%.3f/%.3f (load %.3f), lapses %d (%d in the steady window), gossip members alive %d→%d of %d, CPU wait/run %.1f coordinators %.1f load; detection p50 %.0f ms p99 %.0f ms (%d of %d)",
		r.CoordCores[0], r.CoordCores[1], r.CoordCores[2], r.CoordRSSMB[0], r.CoordRSSMB[1], r.CoordRSSMB[2],
		r.RaftEntriesPerS, r.RenewalsPerS, r.RenewalP99Ms, r.CoordMsPerRenewal[0], r.CoordMsPerRenewal[1], r.CoordMsPerRenewal[2], r.LoadMsPerRenewal,
		r.Lapses, r.SteadyLapses, r.GossipAliveSteady[0], r.GossipAliveSteady[1], r.GossipMembers, r.CoordWait, r.LoadWait, r.DetectP50Ms, r.DetectP99Ms, r.Detected, r.Kills)
}

// marginal fills the marginal CPU per renewal of every row above the
// fewest-broker row of the same build, transport and slot: (cores − cores of
// that row) / (renewals/s − its renewals/s), per coordinator.
func marginal(rows []row) {
	for i := range rows {
		r := &rows[i]
		var base *row
		for j := range rows {
			b := &rows[j]
			if b.Build == r.Build && b.Transport == r.Transport && b.SlotMs == r.SlotMs && b.Error == "" && b.Brokers < r.Brokers && (base == nil || b.Brokers < base.Brokers) {
				base = b
			}
		}
		if base == nil || r.Error != "" {
			continue
		}
		for c := range 3 {
			if d := r.coordRenewalsPerS[c] - base.coordRenewalsPerS[c]; d > 0 {
				r.CoordMarginalMs[c] = 1000 * (r.CoordCores[c] - base.CoordCores[c]) / d
			}
		}
	}
}

// renewalsOf names a row's renewals: the transport, and the slot of the
// coordinators when they were set one.
func renewalsOf(r row) string {
	if r.SlotMs > 0 {
		return fmt.Sprintf("%s, %v slots", r.Transport, time.Duration(r.SlotMs*float64(time.Millisecond)))
	}
	return r.Transport
}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "build\trenewals\tbrokers\tgossip (seen; alive in the window)\tcores c1/c2/c3\tRSS MB c1/c2/c3\tgoroutines\tentries/s\trenewals/s\trenewal p99\tms/renewal c1/c2/c3 (marginal)\tprobes/s\tdetection p50\tp99\tmin–max\tfalse failovers\tlapses (in the window)\tload cores\tload ms/renewal\tload RSS MB\tCPU wait/run coord, load\tjoin, startup (ready)\tload avg")
	for _, r := range rows {
		mark := func(i int, s string) string {
			if fmt.Sprintf("c%d", i+1) == r.Leader {
				return s + "*"
			}
			return s
		}
		var c, m, g, ms, mg []string
		for i := range 3 {
			c = append(c, mark(i, fmt.Sprintf("%.3f", r.CoordCores[i])))
			m = append(m, mark(i, fmt.Sprintf("%.0f", r.CoordRSSMB[i])))
			g = append(g, fmt.Sprint(r.CoordGoroutines[i]))
			ms = append(ms, fmt.Sprintf("%.3f", r.CoordMsPerRenewal[i]))
			mg = append(mg, fmt.Sprintf("%.3f", r.CoordMarginalMs[i]))
		}
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t%d\tstopped: %s\n", r.Build, renewalsOf(r), r.Brokers, r.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d (%d; %d→%d)\t%s\t%s\t%s\t%.1f\t%.0f\t≤%.0f ms\t%s (%s)\t%.0f\t%.0f ms\t%.0f ms\t%.0f–%.0f\t%d\t%d (%d)\t%.2f\t%.3f\t%.0f\t%.1f, %.1f\t%.0f s, %.0f s (%.0f %%)\t%s→%s\n",
			r.Build, renewalsOf(r), r.Brokers, r.GossipMembers, r.GossipSeen, r.GossipAliveSteady[0], r.GossipAliveSteady[1], strings.Join(c, "/"), strings.Join(m, "/"), strings.Join(g, "/"),
			r.RaftEntriesPerS, r.RenewalsPerS, r.RenewalP99Ms, strings.Join(ms, "/"), strings.Join(mg, "/"), r.ProbesPerS,
			r.DetectP50Ms, r.DetectP99Ms, r.DetectMinMs, r.DetectMaxMs, r.FalseFailovers, r.Lapses, r.SteadyLapses,
			r.LoadCores, r.LoadMsPerRenewal, r.LoadRSSMB, r.CoordWait, r.LoadWait, r.JoinS, r.StartupS, 100*r.ReadyFraction, r.LoadBefore, r.LoadAfter)
	}
	tw.Flush()
}

// brokerIP gives broker i an address of its own in 127.0.0.0/8.
func brokerIP(i int) string { return fmt.Sprintf("127.1.%d.%d", i/250, i%250+1) }

// run state of one measurement's load processes.
type loads struct {
	procs  []*loadProcess
	byID   map[string]*loadProcess
	joined chan struct{}
	killed chan reply
	stats  map[*loadProcess]chan loadStats
}

func (l *loads) dispatch(lp *loadProcess, errs io.Writer) {
	for r := range lp.replies {
		switch r.Op {
		case "joined":
			l.joined <- struct{}{}
		case "killed":
			l.killed <- r
		case "stats":
			l.stats[lp] <- *r.Stats
		case "error":
			fmt.Fprintf(errs, "load process %d: %s\n", lp.cmd.Process.Pid, r.Error)
		}
	}
}

// collect asks every load process for its counters and sums them.
func (l *loads) collect(ctx context.Context) (loadStats, error) {
	sum := loadStats{Granted: map[string]uint64{}, Refused: map[string]uint64{}}
	for _, lp := range l.procs {
		if err := lp.send(command{Op: "stats"}); err != nil {
			return sum, err
		}
	}
	for _, lp := range l.procs {
		select {
		case s := <-l.stats[lp]:
			sum.Agents += s.Agents
			sum.Registered += s.Registered
			sum.Valid += s.Valid
			sum.Registrations += s.Registrations
			for k, v := range s.Granted {
				sum.Granted[k] += v
			}
			for k, v := range s.Refused {
				sum.Refused[k] += v
			}
			sum.Failed += s.Failed
			for i := range s.Latency {
				sum.Latency[i] += s.Latency[i]
			}
			sum.Lapses += s.Lapses
			sum.Probes += s.Probes
			sum.GossipMembers += s.GossipMembers
		case <-time.After(30 * time.Second):
			return sum, fmt.Errorf("scale: a load process did not answer stats")
		case <-ctx.Done():
			return sum, ctx.Err()
		}
	}
	return sum, nil
}

func (l *loads) stop() {
	var wg sync.WaitGroup
	for _, lp := range l.procs {
		wg.Add(1)
		go func() { defer wg.Done(); lp.stop() }()
	}
	wg.Wait()
}

// measure runs one measurement with n brokers.
func measure(ctx context.Context, o options, bin, transport string, slot time.Duration, self, top string, n int, log io.Writer) (row, error) {
	r := row{Brokers: n, Policy: o.Policy, LoadBefore: procstat.Loadavg(), Date: time.Now().Format(time.RFC3339)}
	dir, err := os.MkdirTemp(top, fmt.Sprintf("n%d-", n))
	if err != nil {
		return r, err
	}
	cl, err := startCluster(ctx, bin, dir, o.Policy, slot, n)
	if err != nil {
		return r, err
	}
	defer cl.stop()

	var coordAddrs, join []string
	for _, m := range cl.coords {
		coordAddrs = append(coordAddrs, m.admin)
		join = append(join, m.gossip)
	}
	// The gossip members are spread evenly over the brokers, so over the
	// load processes: each process carries its share of memberlist's work.
	brokers := make([]simBroker, n)
	every := max(1, n/max(1, o.GossipMembers))
	for i := range brokers {
		gossip := o.GossipMembers > 0 && i%every == 0 && r.GossipMembers < o.GossipMembers
		brokers[i] = simBroker{ID: fmt.Sprintf("b%05d", i), IP: brokerIP(i), Gossip: gossip}
		if gossip {
			r.GossipMembers++
		}
	}
	l := &loads{byID: map[string]*loadProcess{}, joined: make(chan struct{}, 64), killed: make(chan reply, 1024), stats: map[*loadProcess]chan loadStats{}}
	defer l.stop()
	start := time.Now()
	procs := (n + o.PerProcess - 1) / o.PerProcess
	for i := 0; i < n; i += o.PerProcess {
		part := brokers[i:min(i+o.PerProcess, n)]
		lp, err := startLoad(self, o.LoadNice, o.LoadProcs, filepath.Join(dir, fmt.Sprintf("load-%d.log", len(l.procs))), loadConfig{
			ClusterName: "scale", Coordinators: coordAddrs, GossipJoin: join, Brokers: part,
			RegisterRate: o.RegisterRate, JoinRate: max(1, o.JoinRate/procs), Margin: 500 * time.Millisecond, Transport: transport,
		})
		if err != nil {
			return r, err
		}
		l.procs = append(l.procs, lp)
		l.stats[lp] = make(chan loadStats, 1)
		for _, b := range part {
			l.byID[b.ID] = lp
		}
		go l.dispatch(lp, log)
	}
	r.LoadProcesses, r.LoadNice, r.LoadProcs = len(l.procs), o.LoadNice, o.LoadProcs

	// The gossip members join first, a few per second, and the agents
	// register only once every coordinator's pool holds them all (bounded)
	// and the join storm has died down (-settle).
	joinBound := 5*time.Minute + time.Duration(3*r.GossipMembers/o.JoinRate)*time.Second
	joinBy := time.Now().Add(joinBound)
	for range l.procs {
		select {
		case <-l.joined:
		case <-time.After(time.Until(joinBy)):
			return r, fmt.Errorf("the gossip members did not join within %v", joinBound)
		case <-ctx.Done():
			return r, ctx.Err()
		}
	}
	for deadline := time.Now().Add(5 * time.Minute); ; {
		r.GossipSeen = gossipAlive(ctx, cl, r.GossipMembers)
		if r.GossipSeen >= r.GossipMembers || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleep(ctx, 2*time.Second)
	}
	r.JoinS = time.Since(start).Seconds()
	fmt.Fprintf(log, "%d brokers: the coordinators' gossip pools have %d of %d agent members after %.0f s\n", n, r.GossipSeen, r.GossipMembers, r.JoinS)
	if r.GossipMembers > 0 {
		sleep(ctx, o.Settle)
	}

	registered := time.Now()
	for _, lp := range l.procs {
		if err := lp.send(command{Op: "register"}); err != nil {
			return r, err
		}
	}
	need := int(math.Ceil(o.MinReady * float64(n)))
	readyBy := time.Now().Add(3*time.Minute + time.Duration(n/o.RegisterRate/len(l.procs))*time.Second)
	for {
		s, err := l.collect(ctx)
		if err != nil {
			return r, err
		}
		fmt.Fprintf(log, "  %3.0f s: %d registered, %d hold a valid lease; lease lapses %d, renewals failed %d, refused %v\n",
			time.Since(registered).Seconds(), s.Registered, s.Valid, s.Lapses, s.Failed, s.Refused)
		if s.Valid >= need {
			fmt.Fprintf(log, "%d brokers: %d agents hold a valid lease after %v\n", n, s.Valid, time.Since(registered).Round(time.Second))
			break
		}
		if time.Now().After(readyBy) {
			return r, fmt.Errorf("agents not ready in time: %d of %d hold a valid lease (%d needed), %d registered; renewals granted %v, refused %v, failed %d", s.Valid, n, need, s.Registered, s.Granted, s.Refused, s.Failed)
		}
		sleep(ctx, 2*time.Second)
	}
	alive, err := waitObserved(ctx, cl, need, 5*time.Minute)
	if err != nil {
		return r, err
	}
	r.ReadyFraction = float64(alive) / float64(n)
	r.StartupS = time.Since(registered).Seconds()
	fmt.Fprintf(log, "%d brokers: every coordinator observes %d brokers alive %.0f s after they started registering; settling %v\n", n, alive, r.StartupS, o.Settle)
	// Lapses while the fleet settles are told as they come, as while
	// brokers are killed: a fleet that lapses here has not settled.
	settled := make(chan struct{})
	time.AfterFunc(o.Settle, func() { close(settled) })
	traceLapses(ctx, settled, l, log)

	if err := steady(ctx, o, cl, l, &r); err != nil {
		return r, err
	}
	fmt.Fprintf(log, "%d brokers: steady window done: %s; killing %d\n", n, summary(r), o.Kills)
	stopTrace, traced := make(chan struct{}), make(chan struct{})
	go func() { defer close(traced); traceLapses(ctx, stopTrace, l, log) }()
	lat, err := killRounds(ctx, o, cl, l, brokers, log)
	close(stopTrace)
	<-traced
	if err != nil {
		return r, err
	}
	r.Kills, r.Detected = o.Kills, len(lat)
	if len(lat) > 0 {
		r.DetectP50Ms, r.DetectP99Ms = pct(lat, 0.5), pct(lat, 0.99)
		r.DetectMinMs, r.DetectMaxMs = pct(lat, 0), pct(lat, 1)
	}
	final, err := l.collect(ctx)
	if err != nil {
		return r, err
	}
	r.Lapses = final.Lapses
	if ld, err := cl.leader(ctx); err == nil {
		if bs, err := cl.brokers(ctx, ld); err == nil {
			total := 0
			for _, b := range bs {
				total += int(b.GetFailovers())
			}
			r.FalseFailovers = total - len(lat)
		}
	}
	r.LoadAfter = procstat.Loadavg()
	return r, nil
}

// traceLapses says every 5 s how the live agents' lease lapses and failed
// renewals grow while brokers are killed, until stop is closed: a failover
// must not cost the others their leases. A collection in progress when stop
// closes is finished, not abandoned: its answers would otherwise be taken
// for those of the measurement's final collection.
func traceLapses(ctx context.Context, stop <-chan struct{}, l *loads, log io.Writer) {
	start := time.Now()
	prev, err := l.collect(ctx)
	for err == nil {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
		var s loadStats
		if s, err = l.collect(ctx); err == nil {
			fmt.Fprintf(log, "  %3.0f s: lease lapses %d (+%d), renewals failed %d (+%d), refused %v\n", time.Since(start).Seconds(),
				s.Lapses, s.Lapses-prev.Lapses, s.Failed, s.Failed-prev.Failed, s.Refused)
			prev = s
		}
	}
}

// gossipAlive is the fewest agents any coordinator's gossip pool holds
// alive, at most members.
func gossipAlive(ctx context.Context, cl *cluster, members int) int {
	fewest := members
	for _, m := range cl.coords {
		fewest = min(fewest, cl.gossipAgents(ctx, m))
	}
	return fewest
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitObserved waits until every coordinator's state holds an alive
// observation by every coordinator, at its epoch, of at least need brokers,
// and returns the fewest any coordinator holds.
func waitObserved(ctx context.Context, cl *cluster, need int, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for {
		fewest := -1
		for _, m := range cl.coords {
			bs, err := cl.brokers(ctx, m)
			if err != nil {
				fewest = 0
				break
			}
			if c := countAlive(bs); fewest < 0 || c < fewest {
				fewest = c
			}
		}
		if fewest >= need {
			return fewest, nil
		}
		if time.Now().After(deadline) {
			return fewest, fmt.Errorf("after %v, a coordinator observes %d brokers alive everywhere, fewer than the %d needed", d, max(fewest, 0), need)
		}
		sleep(ctx, 2*time.Second)
		if ctx.Err() != nil {
			return fewest, ctx.Err()
		}
	}
}

// countAlive counts the brokers that every coordinator observes alive at
// their current epoch.
func countAlive(bs []*waldenv1.Broker) int {
	n := 0
	for _, b := range bs {
		if aliveEverywhere(b) {
			n++
		}
	}
	return n
}

func aliveEverywhere(b *waldenv1.Broker) bool {
	if b.GetFenced() {
		return false
	}
	alive := 0
	for _, o := range b.GetObservations() {
		if o.GetEpoch() == b.GetEpoch() && o.GetObservationState() == waldenv1.ObservationState_OBSERVATION_STATE_ALIVE && !o.GetLeaseExpired() {
			alive++
		}
	}
	return alive == 3
}

// steady measures CPU, RSS, goroutines, raft entries, renewals and probes
// over the steady window.
func steady(ctx context.Context, o options, cl *cluster, l *loads, r *row) error {
	ld, err := cl.leader(ctx)
	if err != nil {
		return err
	}
	r.Leader = ld.id
	st0, err := cl.status(ctx, ld)
	if err != nil {
		return err
	}
	s0, err := l.collect(ctx)
	if err != nil {
		return err
	}
	c0 := make([]procstat.Sample, 3)
	cs0 := make([]procstat.Sched, 3)
	for i, m := range cl.coords {
		if c0[i], err = procstat.Read(m.cmd.Process.Pid); err != nil {
			return err
		}
		cs0[i] = procstat.ReadSched(m.cmd.Process.Pid)
	}
	l0 := make([]procstat.Sample, len(l.procs))
	var ls0 procstat.Sched
	for i, lp := range l.procs {
		l0[i], _ = procstat.Read(lp.cmd.Process.Pid)
		ss := procstat.ReadSched(lp.cmd.Process.Pid)
		ls0.Run, ls0.Wait = ls0.Run+ss.Run, ls0.Wait+ss.Wait
	}
	r.GossipAliveSteady[0] = gossipAlive(ctx, cl, r.GossipMembers)
	t0 := time.Now()
	var rssSum [3]float64
	samples := 0
	var loadRSS float64
	for end := t0.Add(o.Steady); time.Now().Before(end); {
		sleep(ctx, time.Second)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		samples++
		for i, m := range cl.coords {
			s, _ := procstat.Read(m.cmd.Process.Pid)
			rssSum[i] += float64(s.RSS)
			if samples%5 == 1 {
				r.CoordGoroutines[i] = max(r.CoordGoroutines[i], cl.goroutines(ctx, m))
			}
		}
		var lr float64
		for _, lp := range l.procs {
			s, _ := procstat.Read(lp.cmd.Process.Pid)
			lr += float64(s.RSS)
		}
		loadRSS = max(loadRSS, lr)
	}
	wall := time.Since(t0).Seconds()
	for i, m := range cl.coords {
		s, err := procstat.Read(m.cmd.Process.Pid)
		if err != nil {
			return err
		}
		r.CoordCores[i] = procstat.Cores(c0[i], s)
		r.CoordWait = max(r.CoordWait, procstat.WaitPerRun(cs0[i], procstat.ReadSched(m.cmd.Process.Pid)))
		r.CoordRSSMB[i] = rssSum[i] / float64(samples) / (1 << 20)
		r.CoordPeakRSSMB[i] = float64(s.HWM) / (1 << 20)
	}
	var ls1 procstat.Sched
	for i, lp := range l.procs {
		s, _ := procstat.Read(lp.cmd.Process.Pid)
		r.LoadCores += procstat.Cores(l0[i], s)
		ss := procstat.ReadSched(lp.cmd.Process.Pid)
		ls1.Run, ls1.Wait = ls1.Run+ss.Run, ls1.Wait+ss.Wait
	}
	r.LoadWait = procstat.WaitPerRun(ls0, ls1)
	r.LoadRSSMB = loadRSS / (1 << 20)
	st1, err := cl.status(ctx, ld)
	if err != nil {
		return err
	}
	r.RaftEntriesPerS = float64(st1.GetAppliedIndex()-st0.GetAppliedIndex()) / wall
	s1, err := l.collect(ctx)
	if err != nil {
		return err
	}
	var granted uint64
	for k, v := range s1.Granted {
		granted += v - s0.Granted[k]
	}
	r.RenewalsPerS = float64(granted) / wall
	for i, m := range cl.coords {
		r.coordRenewalsPerS[i] = float64(s1.Granted[m.admin]-s0.Granted[m.admin]) / wall
		if r.coordRenewalsPerS[i] > 0 {
			r.CoordMsPerRenewal[i] = 1000 * r.CoordCores[i] / r.coordRenewalsPerS[i]
		}
	}
	if r.RenewalsPerS > 0 {
		r.LoadMsPerRenewal = 1000 * r.LoadCores / r.RenewalsPerS
	}
	r.ProbesPerS = float64(s1.Probes-s0.Probes) / wall
	r.RenewalsFailed = s1.Failed - s0.Failed
	r.SteadyLapses = s1.Lapses - s0.Lapses
	r.GossipAliveSteady[1] = gossipAlive(ctx, cl, r.GossipMembers)
	r.RenewalsRefused = map[string]uint64{}
	for k, v := range s1.Refused {
		if d := v - s0.Refused[k]; d > 0 {
			r.RenewalsRefused[k] = d
		}
	}
	var hist [len(latencyBuckets) + 1]uint64
	var total uint64
	for i := range hist {
		hist[i] = s1.Latency[i] - s0.Latency[i]
		total += hist[i]
	}
	var cum uint64
	for i, h := range hist {
		cum += h
		if total > 0 && float64(cum) >= 0.99*float64(total) {
			if i < len(latencyBuckets) {
				r.RenewalP99Ms = float64(latencyBuckets[i]) / 1000
			} else {
				r.RenewalP99Ms = float64(latencyBuckets[len(latencyBuckets)-1]) / 1000
			}
			break
		}
	}
	return nil
}

// killRounds kills o.Kills brokers, in rounds of at most half of them at
// random instants over o.Window, and returns each kill → FAILED committed
// latency in milliseconds, seen on the leader. The killed brokers are
// revived between rounds.
// killable returns the indexes of the brokers every coordinator observes
// alive, in random order, once there are at least k (waiting at most 30 s:
// a leader may be between terms).
func killable(ctx context.Context, cl *cluster, brokers []simBroker, k int, rng *rand.Rand) ([]int, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var perm []int
		if ld, err := cl.leader(ctx); err == nil {
			if bs, err := cl.brokers(ctx, ld); err == nil {
				alive := map[string]bool{}
				for _, b := range bs {
					alive[b.GetBrokerId()] = aliveEverywhere(b)
				}
				for _, i := range rng.Perm(len(brokers)) {
					if alive[brokers[i].ID] {
						perm = append(perm, i)
					}
				}
			}
		}
		if len(perm) >= k {
			return perm, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("%d brokers alive on every coordinator, fewer than the %d to kill", len(perm), k)
		}
		sleep(ctx, time.Second)
	}
}

func killRounds(ctx context.Context, o options, cl *cluster, l *loads, brokers []simBroker, log io.Writer) ([]float64, error) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	var lat []float64
	killedBefore := make([]bool, len(brokers))
	timeout := 5 * time.Second
	if o.Policy == "tuned" {
		timeout = 2 * time.Second
	}
	for left := o.Kills; left > 0; {
		k := min(left, max(1, len(brokers)/2))
		left -= k
		// Brokers never killed first: a kill of a revived broker is the
		// same measurement, but keep them apart while there are others.
		// Among the brokers every coordinator observes alive (all of them
		// unless -min-ready is below 1), as the leader lists them.
		perm, err := killable(ctx, cl, brokers, k, rng)
		if err != nil {
			return lat, err
		}
		slices.SortStableFunc(perm, func(a, b int) int { return cmpBool(killedBefore[a], killedBefore[b]) })
		victims := perm[:k]
		for _, v := range victims {
			killedBefore[v] = true
		}
		for _, v := range victims {
			id := brokers[v].ID
			d := time.Duration(rng.Int64N(int64(o.Window)))
			go func() {
				sleep(ctx, d)
				_ = l.byID[id].send(command{Op: "kill", IDs: []string{id}})
			}()
		}
		type kill struct {
			epoch uint64
			at    time.Time
			done  bool
		}
		kills := map[string]*kill{}
		deadline := time.Now().Add(o.Window + 3*time.Minute)
		detected := 0
		for detected < k {
			if time.Now().After(deadline) {
				return lat, fmt.Errorf("%d of %d killed brokers not declared failed within %v", k-detected, k, o.Window+3*time.Minute)
			}
			for drained := false; !drained; {
				select {
				case rep := <-l.killed:
					kills[rep.ID] = &kill{epoch: rep.Epoch, at: time.Unix(0, rep.AtUnixNs)}
				default:
					drained = true
				}
			}
			ld, err := cl.leader(ctx)
			if err != nil {
				sleep(ctx, 100*time.Millisecond)
				continue
			}
			for id, kl := range kills {
				if kl.done || time.Since(kl.at) < timeout/2 {
					continue
				}
				b, err := cl.broker(ctx, ld, id)
				if err != nil {
					continue
				}
				if (b.GetFenced() && b.GetEpoch() == kl.epoch) || b.GetEpoch() > kl.epoch {
					kl.done = true
					detected++
					lat = append(lat, float64(time.Since(kl.at))/float64(time.Millisecond))
				}
			}
			sleep(ctx, 20*time.Millisecond)
			if ctx.Err() != nil {
				return lat, ctx.Err()
			}
		}
		fmt.Fprintf(log, "  round of %d kills detected; reviving them\n", k)
		if left == 0 {
			break
		}
		// Revive the victims and wait until they are observed alive at a
		// new epoch, so that the next round starts from n live brokers.
		var ids []string
		for id := range kills {
			ids = append(ids, id)
		}
		for _, id := range ids {
			_ = l.byID[id].send(command{Op: "revive", IDs: []string{id}})
		}
		reviveBy := time.Now().Add(3 * time.Minute)
		for _, id := range ids {
			for {
				ld, err := cl.leader(ctx)
				if err == nil {
					if b, err := cl.broker(ctx, ld, id); err == nil && b.GetEpoch() > kills[id].epoch && aliveEverywhere(b) {
						break
					}
				}
				if time.Now().After(reviveBy) {
					return lat, fmt.Errorf("broker %s not alive again within 3 minutes of its revival", id)
				}
				sleep(ctx, 200*time.Millisecond)
				if ctx.Err() != nil {
					return lat, ctx.Err()
				}
			}
		}
	}
	return lat, nil
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// pct returns the p-th quantile (nearest rank) of xs.
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p+0.5)]
}
