package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"walden/chaos/history"
	"walden/chaos/netfault"
	"walden/chaos/netns"
	"walden/internal/devcluster"
	"walden/loadgen"
	"walden/objstore"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// Errors of this package.
var (
	// ErrInvalid wraps an invalid Config or an unknown scenario name.
	ErrInvalid = errors.New("chaos: invalid configuration")
)

// Nodes are the processes of the topology, one namespace each: "amq" is
// the development AutoMQ controller of the AutoMQ scenarios (an AutoMQ-mode
// broker shares its agent's namespace: the agent starts it).
var Nodes = []string{"s3", "c1", "c2", "c3", "b1", "b2", "b3", "client", "amq"}

// Fixed ports: every process has an address of its own.
var ports = map[string]string{
	"s3": "7070", "admin": "7000", "raft": "7001", "http": "7003", "metrics": "7004",
	"listen": "9000", "agent": "9001", "voter1": "9093", "voter2": "9094", "voter3": "9095",
}

func port(proc, role string) string {
	if role == "gossip" {
		if strings.HasPrefix(proc, "c") {
			return "7002"
		}
		return "9002"
	}
	return ports[role]
}

// Policies are the failover policies a run can use.
var Policies = map[string][]string{
	// walden's defaults: failure_timeout 5s, lease_ttl 3s, drift_margin 500ms.
	"default": nil,
	// fast shortens detection (the end-to-end tests' policy), for the
	// short form.
	"fast": {"failure_timeout: 2s", "lease_ttl: 1s", "drift_margin: 200ms"},
}

// policyFailureTimeout is failure_timeout under each policy.
var policyFailureTimeout = map[string]time.Duration{"default": 5 * time.Second, "fast": 2 * time.Second}

// Config configures a run.
type Config struct {
	// Walden is the walden binary (required).
	Walden string
	// Versity is the versitygw binary (required).
	Versity string
	// Dir receives one directory per scenario: configs, data, logs, the
	// ledger, the history (required; created).
	Dir string
	// Policy names an entry of Policies (default "default").
	Policy string
	// Rate is the load in records per second over all streams (default
	// 300).
	Rate float64
	// Warmup is the load before the fault (default 5s).
	Warmup time.Duration
	// Hold is how long the long faults last (loss and jitter; default
	// 2m).
	Hold time.Duration
	// Cut is how long the short faults last (a leader cut off, a
	// coordinator down, a full disk; default 15s).
	Cut time.Duration
	// After is the load after the faults healed and every stream is open
	// (default 3s).
	After time.Duration
	// CheckTimeout bounds the linearizability check of one history
	// (default 2m).
	CheckTimeout time.Duration
	// Seed makes the delayer's drops and delays reproducible.
	Seed uint64
	// Say receives progress lines (nil: silent).
	Say func(string)
}

func (c *Config) fill() error {
	if c.Walden == "" || c.Versity == "" || c.Dir == "" {
		return fmt.Errorf("%w: the walden and versitygw binaries and a directory are required", ErrInvalid)
	}
	if c.Policy == "" {
		c.Policy = "default"
	}
	if _, ok := Policies[c.Policy]; !ok {
		return fmt.Errorf("%w: policy %q: must be default or fast", ErrInvalid, c.Policy)
	}
	if c.Rate == 0 {
		c.Rate = 300
	}
	if c.Warmup == 0 {
		c.Warmup = 5 * time.Second
	}
	if c.Hold == 0 {
		c.Hold = 2 * time.Minute
	}
	if c.Cut == 0 {
		c.Cut = 15 * time.Second
	}
	if c.After == 0 {
		c.After = 3 * time.Second
	}
	if c.CheckTimeout == 0 {
		c.CheckTimeout = 2 * time.Minute
	}
	if c.Say == nil {
		c.Say = func(string) {}
	}
	return nil
}

// FailureTimeout is the policy's failure_timeout.
func (c *Config) FailureTimeout() time.Duration { return policyFailureTimeout[c.Policy] }

// Result is one scenario's outcome.
type Result struct {
	Scenario string `json:"scenario"`
	Policy   string `json:"policy"`
	Seed     uint64 `json:"seed"`
	// Ledger check (walden verify).
	Acked      int64 `json:"acked"`
	Present    int64 `json:"present"`
	Lost       int64 `json:"lost"`
	Gaps       int64 `json:"gaps"`
	Duplicates int64 `json:"duplicates"`
	// Failovers lists the brokers failed over; FalseFailovers counts the
	// ones the scenario did not cut off, kill or stop past the timeout.
	Failovers      []string `json:"failovers"`
	FalseFailovers int      `json:"false_failovers"`
	// History checks.
	StaleWrites  int    `json:"stale_writes"`
	StaleLeases  int    `json:"stale_leases"`
	LeaseInvalid int    `json:"lease_invalid"`
	Linearizable string `json:"linearizable"`
	Appends      int    `json:"appends"`
	Reads        int    `json:"reads"`
	// MaxWaitMs is the longest time a producer waited with records
	// pending.
	MaxWaitMs int64 `json:"max_wait_ms"`
	// Broker is the kind of broker: "walden" or "automq".
	Broker string `json:"broker"`
	// Watchdog is, in the AutoMQ scenarios that cut a broker off from the
	// coordinators, when its agent's watchdog killed it and when a
	// coordinator first attested its lease expired (nil elsewhere). The
	// goal is the kill before the attestation.
	Watchdog *WatchdogTiming `json:"watchdog,omitempty"`
	// ReopenMs is the time from the fault until every stream of the
	// broker failed over was seen open on another broker (-1: no
	// broker's failover was expected or it did not happen).
	ReopenMs int64 `json:"reopen_ms"`
	// ReopenGoalMs is failure_timeout + 1.5s where that goal applies (a
	// broker cut off or killed), else 0.
	ReopenGoalMs int64 `json:"reopen_goal_ms"`
	// DecisionMs is the time from the fault until the failover decision of
	// that broker (the decision event's time; -1: none), DecisionGoalMs
	// failure_timeout + 1s where the reopen goal applies, else 0.
	DecisionMs     int64 `json:"decision_ms"`
	DecisionGoalMs int64 `json:"decision_goal_ms"`
	// HealthyLapses counts the lease lapses of brokers the scenario did
	// not act on: an agent answering "not valid" (not fenced) for an epoch
	// it had answered valid, and appends refused LEASE_INVALID.
	HealthyLapses int `json:"healthy_lease_lapses"`
	// AckedTwice counts the offsets the ledger holds two different
	// acknowledged records at.
	AckedTwice int64 `json:"acked_twice"`
	// Verdict is "pass", or "fail" with Missed naming each goal missed.
	Verdict    string   `json:"verdict"`
	Missed     []string `json:"missed"`
	Notes      []string `json:"notes"`
	DurationMs int64    `json:"duration_ms"`
	Dir        string   `json:"dir"`
	Error      string   `json:"error,omitempty"`
}

// WatchdogTiming times a watchdog's kill of a broker against the
// coordinators' attestations, in milliseconds from the fault (-1: never).
type WatchdogTiming struct {
	KillMs        int64 `json:"kill_ms"`
	FirstAttestMs int64 `json:"first_attest_ms"`
}

// Before reports whether the broker was killed, and before any
// attestation.
func (w *WatchdogTiming) Before() bool {
	return w.KillMs >= 0 && (w.FirstAttestMs < 0 || w.KillMs < w.FirstAttestMs)
}

// Harness is a topology and its firewall, shared by the scenarios of a
// run.
type Harness struct {
	cfg  Config
	topo *netns.Topology
	fw   *netfault.Firewall
}

// New builds the topology (removing what an earlier run left) and its
// firewall. Close it.
func New(ctx context.Context, cfg Config) (*Harness, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	if err := unmountStale(); err != nil {
		return nil, err
	}
	topo, err := netns.Create(ctx, Nodes, 10*time.Minute, cfg.Say)
	if err != nil {
		return nil, err
	}
	fw, err := netfault.NewFirewall(ctx, topo)
	if err != nil {
		topo.Close()
		return nil, err
	}
	return &Harness{cfg: cfg, topo: topo, fw: fw}, nil
}

// Close removes the topology (and every process left in it).
func (h *Harness) Close() error {
	return errors.Join(h.topo.Close(), unmountStale())
}

// Run runs the named scenarios one after the other (all when names is
// empty) and returns their results; a scenario that cannot run to its end
// has a result with Error set and verdict fail.
func (h *Harness) Run(ctx context.Context, names []string) ([]Result, error) {
	list, err := Select(names)
	if err != nil {
		return nil, err
	}
	var out []Result
	for i, s := range list {
		if ctx.Err() != nil {
			break
		}
		h.cfg.Say(fmt.Sprintf("==== scenario %d/%d: %s — %s", i+1, len(list), s.Name, s.Description))
		r := h.RunScenario(ctx, s)
		h.cfg.Say(fmt.Sprintf("==== %s: %s %s", s.Name, r.Verdict, strings.Join(r.Missed, "; ")))
		out = append(out, r)
	}
	return out, ctx.Err()
}

// Env is what a scenario's script acts on.
type Env struct {
	Cluster  *devcluster.Cluster
	Topo     *netns.Topology
	Firewall *netfault.Firewall
	Cfg      *Config

	rec      *history.Recorder
	mu       sync.Mutex
	faultAt  time.Time
	expected map[string]bool
	// affected are the brokers the scenario acts on (cut off, killed,
	// stopped, fenced): their leases may lapse.
	affected map[string]bool
	reopen   string // the broker whose reopen time is measured
	// reopenStreams are the streams whose reopening is measured when the
	// scenario says (ExpectFailoverOf); else the broker's configured ones.
	reopenStreams []uint64
	goal          bool
	notes         []string
	// watchdog names the broker whose watchdog must kill it before any
	// coordinator attests (AutoMQ scenarios).
	watchdog string
	// amq is what the AutoMQ observers saw.
	amq automqSeen
}

// Say prints a progress line.
func (e *Env) Say(format string, args ...any) { e.Cfg.Say(fmt.Sprintf(format, args...)) }

// Note adds a line to the scenario's result.
func (e *Env) Note(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	e.Say("note: %s", line)
	e.mu.Lock()
	e.notes = append(e.notes, line)
	e.mu.Unlock()
}

// Fault marks now as the fault's instant. The first call counts.
func (e *Env) Fault() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.faultAt.IsZero() {
		e.faultAt = time.Now()
	}
}

// ExpectFailover says the scenario cuts off, kills or stops broker past the
// failure timeout: its failover is expected, not false. With goal, the
// reopen goal (failure_timeout + 1.5s) applies to it.
func (e *Env) ExpectFailover(broker string, goal bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.expected[broker] = true
	e.affected[broker] = true
	e.reopen, e.goal = broker, goal
}

// ExpectFailoverOf is ExpectFailover of a broker that owns streams (not
// necessarily its configured ones: after a restore or a failover, brokers
// that take streams over own others): their reopening is measured.
func (e *Env) ExpectFailoverOf(broker string, streams []uint64, goal bool) {
	e.ExpectFailover(broker, goal)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reopenStreams = slices.Clone(streams)
}

// Owned returns the streams broker owns opened in the catalog now.
func (e *Env) Owned(ctx context.Context, broker string) ([]uint64, error) {
	ss, err := e.Cluster.ListStreams(ctx)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, s := range ss {
		if s.GetState() == "opened" && s.GetOwnerBrokerId() == broker {
			out = append(out, s.GetStreamId())
		}
	}
	return out, nil
}

// WaitStreamsReopened waits until every stream of streams is open on a
// broker other than broker.
func (e *Env) WaitStreamsReopened(ctx context.Context, broker string, streams []uint64, timeout time.Duration) error {
	return devcluster.Poll(ctx, timeout, fmt.Sprintf("streams %v of %s open on other brokers", streams, broker), func() error {
		ss, err := e.Cluster.ListStreams(ctx)
		if err != nil {
			return err
		}
		for _, s := range ss {
			if slices.Contains(streams, s.GetStreamId()) && (s.GetState() != "opened" || s.GetOwnerBrokerId() == broker) {
				return fmt.Errorf("stream %d %s by %s", s.GetStreamId(), s.GetState(), s.GetOwnerBrokerId())
			}
		}
		return nil
	})
}

// Affect says the scenario acts on broker (cuts it off, stops or fences
// it) without its failover being expected: its lease may lapse. The lease
// of every other broker must not.
func (e *Env) Affect(broker string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.affected[broker] = true
}

// Sleep waits d or until ctx ends.
func (e *Env) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Leader waits for the raft leader.
func (e *Env) Leader(ctx context.Context) (*devcluster.Proc, error) {
	return e.Cluster.WaitLeader(ctx, "", 60*time.Second)
}

// Others returns the names of the coordinators other than name.
func (e *Env) Others(name string) []string {
	var out []string
	for _, m := range e.Cluster.Coords {
		if m.Name != name {
			out = append(out, m.Name)
		}
	}
	return out
}

// Coordinators returns the coordinators' names.
func (e *Env) Coordinators() []string { return e.Others("") }

// Brokers returns the brokers' names other than except.
func (e *Env) Brokers(except string) []string {
	var out []string
	for _, b := range e.Cluster.Brokers {
		if b.Name != except {
			out = append(out, b.Name)
		}
	}
	return out
}

// WaitReopened waits until every stream broker owned is open on another
// broker.
func (e *Env) WaitReopened(ctx context.Context, broker string, timeout time.Duration) error {
	if e.Cluster.IsAutomq() {
		return e.waitReopenedAutomq(ctx, broker, timeout)
	}
	p := e.Cluster.Proc(broker)
	return devcluster.Poll(ctx, timeout, "the streams of "+broker+" open on other brokers", func() error {
		ss, err := e.Cluster.ListStreams(ctx)
		if err != nil {
			return err
		}
		for _, s := range ss {
			if slices.Contains(p.Streams, s.GetStreamId()) && (s.GetState() != "opened" || s.GetOwnerBrokerId() == broker) {
				return fmt.Errorf("stream %d %s by %s", s.GetStreamId(), s.GetState(), s.GetOwnerBrokerId())
			}
		}
		return nil
	})
}

// WaitRegistered waits until broker is registered, alive and not fenced
// (after a restart or a failover it came back from).
func (e *Env) WaitRegistered(ctx context.Context, broker string, timeout time.Duration) error {
	return devcluster.Poll(ctx, timeout, broker+" registered and alive", func() error {
		b, err := e.Cluster.GetBroker(ctx, broker)
		if err != nil {
			return err
		}
		if b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_ALIVE || b.GetFenced() {
			return fmt.Errorf("%s: %s, fenced %v", broker, b.GetBrokerState().Name(), b.GetFenced())
		}
		return nil
	})
}

// WaitState waits until broker's registry state is one of states.
func (e *Env) WaitState(ctx context.Context, broker string, timeout time.Duration, states ...waldenv1.BrokerState) error {
	names := make([]string, len(states))
	for i, s := range states {
		names[i] = s.Name()
	}
	return devcluster.Poll(ctx, timeout, broker+" "+strings.Join(names, " or "), func() error {
		b, err := e.Cluster.GetBroker(ctx, broker)
		if err != nil {
			return err
		}
		if !slices.Contains(states, b.GetBrokerState()) {
			return fmt.Errorf("%s is %s", broker, b.GetBrokerState().Name())
		}
		return nil
	})
}

// clusterOptions lays the scenario's cluster out on the topology.
func (h *Harness) clusterOptions(dir string, rec *history.Recorder) devcluster.Options {
	versity := h.cfg.Versity
	return devcluster.Options{
		Bin:      h.cfg.Walden,
		Dir:      dir,
		Policy:   Policies[h.cfg.Policy],
		Recovery: []string{"job_lease: 3s"},
		Listen:   func(proc, role string) string { return h.topo.IP(proc) + ":" + port(proc, role) },
		Command: func(proc string, argv []string) *exec.Cmd {
			cmd := h.topo.Command(proc, argv)
			if proc == "s3" {
				// versitygw takes its root account from the flags only.
				cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY=", "ROOT_SECRET_KEY=")
			}
			return cmd
		},
		Dial:        h.topo.Dialer("client"),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(rec.Interceptor())},
		S3Command: func(listen, dir string) ([]string, objstore.Config) {
			cfg := objstore.FakeConfig("http://"+listen, "walden")
			cfg.AccessKeyID, cfg.SecretAccessKey = "waldenchaos", "waldenchaos-secret-key"
			// A bucket of versitygw's POSIX back end is a directory.
			_ = os.MkdirAll(filepath.Join(dir, "root", cfg.Bucket), 0o755)
			_ = os.MkdirAll(filepath.Join(dir, "sidecar"), 0o755)
			return []string{versity, "--access", cfg.AccessKeyID, "--secret", cfg.SecretAccessKey, "--port", listen,
				"--quiet", "posix", "--sidecar", filepath.Join(dir, "sidecar"), filepath.Join(dir, "root")}, cfg
		},
	}
}

// ScenarioTimeout bounds one scenario, from the cluster's start to the end
// of its checks.
const ScenarioTimeout = 20 * time.Minute

// RunScenario runs one scenario on a fresh cluster and judges it.
func (h *Harness) RunScenario(ctx context.Context, s Scenario) Result {
	ctx, cancel := context.WithTimeout(ctx, ScenarioTimeout)
	defer cancel()
	start := time.Now()
	cfg := h.cfg
	res := Result{Scenario: s.Name, Policy: s.policy(cfg.Policy), Seed: cfg.Seed, ReopenMs: -1, DecisionMs: -1, Dir: filepath.Join(cfg.Dir, s.Name),
		Failovers: []string{}, Missed: []string{}, Notes: []string{}}
	err := h.runScenario(ctx, s, &res)
	res.DurationMs = time.Since(start).Milliseconds()
	if err != nil {
		res.Error = err.Error()
	}
	judge(&res)
	return res
}

func (h *Harness) runScenario(ctx context.Context, s Scenario, res *Result) error {
	cfg := &h.cfg
	dir := res.Dir
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	names := map[string]string{}
	for _, b := range Nodes {
		if strings.HasPrefix(b, "b") {
			names[h.topo.IP(b)+":"+port(b, "listen")] = b
		}
	}
	rec := history.NewRecorder(names)
	opts := h.clusterOptions(dir, rec)
	opts.Policy = Policies[res.Policy]
	if s.Automq {
		h.automqOptions(&opts, res.Policy)
	}
	if s.Options != nil {
		s.Options(&opts)
	}
	res.Broker = opts.Broker
	c, err := devcluster.New(opts)
	if err != nil {
		return err
	}
	env := &Env{Cluster: c, Topo: h.topo, Firewall: h.fw, Cfg: cfg, rec: rec, expected: map[string]bool{}, affected: map[string]bool{}}
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	cleanups = append(cleanups, func() { _ = h.fw.HealAll(context.Background()) })
	if s.Setup != nil {
		undo, err := s.Setup(ctx, env)
		if undo != nil {
			cleanups = append(cleanups, undo)
		}
		if err != nil {
			return err
		}
	}
	cleanups = append(cleanups, c.Close)
	if s.Automq {
		cfg.Say(fmt.Sprintf("starting versitygw, the AutoMQ controller, 3 coordinators and 3 AutoMQ-mode brokers beside their agents in their namespaces (logs in %s)", dir))
	} else {
		cfg.Say(fmt.Sprintf("starting versitygw, 3 coordinators and 3 brokers in their namespaces (logs in %s)", dir))
	}
	if err := c.Start(ctx, 90*time.Second); err != nil {
		return fmt.Errorf("chaos: start the cluster: %w", err)
	}

	// Load on every stream, observers of the catalog, the agents and the
	// streams' content, all from the client namespace and recorded.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	ledger := filepath.Join(dir, "ledger.jsonl")
	type loadResult struct {
		rep *loadgen.LoadReport
		err error
	}
	loadDone := make(chan loadResult, 1)
	go func() {
		rep, err := loadgen.Load(runCtx, c.LoadConfig(loadgen.LoadConfig{Streams: c.AllStreams(),
			Rate: cfg.Rate, Duration: time.Hour, PayloadBytes: 64, Ledger: ledger}))
		loadDone <- loadResult{rep, err}
	}()
	var obs sync.WaitGroup
	obsCtx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	obs.Add(1)
	go func() { defer obs.Done(); watchCatalog(obsCtx, c) }()
	obs.Add(1)
	go func() { defer obs.Done(); watchLeases(obsCtx, c, rec) }()
	if s.Automq {
		obs.Add(1)
		go func() { defer obs.Done(); env.watchAutomq(obsCtx) }()
	} else {
		for _, id := range c.AllStreams() {
			obs.Add(1)
			go func() { defer obs.Done(); readStream(obsCtx, c, id) }()
		}
	}
	stopAll := func() *loadgen.LoadReport {
		stopRun()
		lr := <-loadDone
		stopObs()
		obs.Wait()
		if lr.err != nil {
			env.Note("load: %v", lr.err)
		}
		return lr.rep
	}

	cfg.Say(fmt.Sprintf("load: %.0f records/s over %d streams; warm-up %s", cfg.Rate, len(c.AllStreams()), cfg.Warmup))
	if err := env.Sleep(ctx, cfg.Warmup); err != nil {
		stopAll()
		return err
	}
	faultOwned := map[string][]uint64{}
	for _, b := range c.Brokers {
		faultOwned[b.Name] = b.Streams
	}
	if err := s.Run(ctx, env); err != nil {
		stopAll()
		return fmt.Errorf("chaos: %s: %w", s.Name, err)
	}
	if err := h.fw.HealAll(ctx); err != nil {
		stopAll()
		return err
	}
	healedAt := time.Now()
	cfg.Say("faults healed; waiting until every stream is open")
	if err := c.WaitStreamsOpen(ctx, 2*time.Minute); err != nil {
		stopAll()
		return fmt.Errorf("chaos: after the faults: %w", err)
	}
	if err := env.Sleep(ctx, cfg.After); err != nil {
		stopAll()
		return err
	}
	rep := stopAll()
	if rep != nil {
		res.MaxWaitMs = rep.MaxUnavailableMs
		if rep.DuplicateAcks > 0 || rep.ProducerResets > 0 {
			env.Note("producers: %d records of retried appends answered as already stored, %d producer resets", rep.DuplicateAcks, rep.ProducerResets)
		}
	}

	// The ledger, read back through the brokers (recorded too: the
	// history ends with full reads of every stream).
	cfg.Say("verifying the ledger")
	twice, examples, err := ackedTwice(ledger)
	if err != nil {
		return err
	}
	res.AckedTwice = twice
	for _, ex := range examples {
		env.Note("acknowledged twice: %s", ex)
	}
	var v *loadgen.VerifyReport
	if s.Automq {
		v, err = env.verifyAutomq(ctx, ledger)
	} else {
		v, err = loadgen.Verify(ctx, loadgen.VerifyConfig{Coordinators: c.AdminAddrs(), Ledger: ledger, Wait: time.Minute, DialOptions: c.DialOptions()})
	}
	if err != nil {
		return fmt.Errorf("chaos: verify: %w", err)
	}
	res.Acked, res.Present, res.Lost, res.Gaps, res.Duplicates = v.Acked, v.Present, v.Lost, v.Gaps, v.Duplicates

	// Failovers from the replicated event log.
	evs, err := c.ListEvents(ctx)
	if err != nil {
		return fmt.Errorf("chaos: events: %w", err)
	}
	for _, e := range evs {
		if e.GetEventKind() != waldenv1.EventKind_EVENT_KIND_DECISION {
			continue
		}
		res.Failovers = append(res.Failovers, e.GetBrokerId())
		if !env.expected[e.GetBrokerId()] {
			res.FalseFailovers++
			env.Note("false failover of %s: %s", e.GetBrokerId(), e.GetMessage())
		}
	}
	for b := range env.expected {
		if !slices.Contains(res.Failovers, b) {
			env.Note("%s was not failed over", b)
		}
	}

	// The history.
	ops := rec.Ops()
	if err := history.WriteJSONL(filepath.Join(dir, "history.jsonl"), ops); err != nil {
		return err
	}
	counts := history.Count(ops)
	res.StaleWrites, res.StaleLeases, res.LeaseInvalid = counts.StaleWrites, counts.StaleLeases, counts.LeaseInvalid
	res.Appends, res.Reads = counts.Appends, counts.Reads
	for _, ex := range counts.StaleWrite {
		env.Note("stale write: %s", ex)
	}
	env.mu.Lock()
	faultAt, reopenBroker, goal := env.faultAt, env.reopen, env.goal
	if env.reopenStreams != nil {
		faultOwned[reopenBroker] = env.reopenStreams
	}
	affected := maps.Clone(env.affected)
	env.mu.Unlock()
	lapses, lapseNote := healthyLapses(ops, affected)
	res.HealthyLapses = lapses
	if lapses > 0 {
		env.Note("lease lapses of brokers the scenario did not act on: %s", lapseNote)
	}
	if s.Automq {
		env.judgeAutomq(ctx, res, evs, faultAt)
	}
	if counts.LeaseInvalid > 0 && !faultAt.IsZero() {
		env.Note("LEASE_INVALID by broker, before / during / after the faults: %s", leaseRefusals(ops, rec.At(faultAt), rec.At(healedAt)))
	}
	if reopenBroker != "" && !faultAt.IsZero() {
		if s.Automq {
			res.ReopenMs = env.reopenAfterAutomq(faultOwned[reopenBroker], faultAt)
		} else {
			res.ReopenMs = reopenAfter(ops, faultOwned[reopenBroker], reopenBroker, rec.At(faultAt))
		}
		if goal {
			res.ReopenGoalMs = (policyFailureTimeout[res.Policy] + 1500*time.Millisecond).Milliseconds()
			res.DecisionGoalMs = (policyFailureTimeout[res.Policy] + time.Second).Milliseconds()
		}
		res.DecisionMs = decisionAfter(evs, reopenBroker, faultAt)
	}
	cfg.Say(fmt.Sprintf("checking the history: %d operations (%d appends, %d reads)", len(ops), counts.Appends, counts.Reads))
	checkStart := time.Now()
	lin, err := history.Check(ops, cfg.CheckTimeout, filepath.Join(dir, "history.html"))
	res.Linearizable = lin
	if err != nil {
		env.Note("%v", err)
	}
	cfg.Say(fmt.Sprintf("linearizability: %s (checked in %s)", lin, time.Since(checkStart).Round(time.Millisecond)))
	if lin == history.NotLinearizable {
		env.Note("the history is not linearizable: see %s", filepath.Join(dir, "history.html"))
	}
	env.mu.Lock()
	res.Notes = append(res.Notes, env.notes...)
	env.mu.Unlock()
	return nil
}

// reopenAfter is the time from fault until every stream in streams was
// seen opened by a broker other than broker (-1 when some never was).
func reopenAfter(ops []history.Op, streams []uint64, broker string, fault int64) int64 {
	first := map[uint64]int64{}
	for _, op := range ops {
		if op.Kind != history.KindStream || op.Return < fault || !slices.Contains(streams, op.Stream) {
			continue
		}
		if op.State == "opened" && op.OwnerID != broker && op.OwnerID != "" {
			if t, ok := first[op.Stream]; !ok || op.Return < t {
				first[op.Stream] = op.Return
			}
		}
	}
	var worst int64
	for _, s := range streams {
		t, ok := first[s]
		if !ok {
			return -1
		}
		worst = max(worst, t-fault)
	}
	return int64(math.Round(float64(worst) / 1e6))
}

// leaseRefusals sums the LEASE_INVALID refusals per broker before the
// fault, while it lasted and after it healed, with the first and last
// refusal's time relative to the fault ("b1 0/12/0 at +2.1s…+5.0s").
func leaseRefusals(ops []history.Op, fault, healed int64) string {
	type span struct {
		n           [3]int
		first, last int64
	}
	by := map[string]*span{}
	for _, op := range ops {
		if op.Kind != history.KindAppend || op.Reason != string(refusal.LeaseInvalid) {
			continue
		}
		sp := by[op.Broker]
		if sp == nil {
			sp = &span{first: op.Return, last: op.Return}
			by[op.Broker] = sp
		}
		switch {
		case op.Return < fault:
			sp.n[0]++
		case op.Return <= healed:
			sp.n[1]++
		default:
			sp.n[2]++
		}
		sp.first, sp.last = min(sp.first, op.Return), max(sp.last, op.Return)
	}
	var names []string
	for b := range by {
		names = append(names, b)
	}
	sort.Strings(names)
	var parts []string
	for _, b := range names {
		sp := by[b]
		parts = append(parts, fmt.Sprintf("%s %d/%d/%d at %+.1fs…%+.1fs", b, sp.n[0], sp.n[1], sp.n[2],
			float64(sp.first-fault)/1e9, float64(sp.last-fault)/1e9))
	}
	return strings.Join(parts, ", ")
}

// judge sets the verdict from the goals.
func judge(r *Result) {
	miss := func(format string, args ...any) { r.Missed = append(r.Missed, fmt.Sprintf(format, args...)) }
	if r.Error != "" {
		miss("did not complete: %s", r.Error)
	}
	if r.Lost > 0 || r.Gaps > 0 {
		miss("%d acknowledged records lost, %d offsets missing", r.Lost, r.Gaps)
	}
	if r.Duplicates > 0 {
		miss("%d duplicates", r.Duplicates)
	}
	if r.StaleWrites > 0 || r.StaleLeases > 0 {
		miss("%d stale writes accepted, %d stale lease answers", r.StaleWrites, r.StaleLeases)
	}
	if r.FalseFailovers > 0 {
		miss("%d false failovers", r.FalseFailovers)
	}
	if r.Error == "" && r.Linearizable != history.Linearizable {
		miss("history linearizable: %s", r.Linearizable)
	}
	if r.ReopenGoalMs > 0 && (r.ReopenMs < 0 || r.ReopenMs > r.ReopenGoalMs) {
		miss("streams reopened after %d ms, goal %d ms", r.ReopenMs, r.ReopenGoalMs)
	}
	if r.DecisionGoalMs > 0 && (r.DecisionMs < 0 || r.DecisionMs > r.DecisionGoalMs) {
		miss("failed over (decided) after %d ms, goal %d ms", r.DecisionMs, r.DecisionGoalMs)
	}
	if r.HealthyLapses > 0 {
		miss("%d lease lapses of brokers the scenario did not act on", r.HealthyLapses)
	}
	if r.AckedTwice > 0 {
		miss("%d offsets acknowledged twice", r.AckedTwice)
	}
	if w := r.Watchdog; w != nil && !w.Before() {
		if w.KillMs < 0 {
			miss("the watchdog never killed the broker (a coordinator attested at +%d ms)", w.FirstAttestMs)
		} else {
			miss("the watchdog killed the broker at +%d ms, not before the first attestation at +%d ms", w.KillMs, w.FirstAttestMs)
		}
	}
	r.Verdict = "pass"
	if len(r.Missed) > 0 {
		r.Verdict = "fail"
	}
}

// watchCatalog reads the stream catalog and the broker registry every
// 100ms (recorded: stream and broker observations).
func watchCatalog(ctx context.Context, c *devcluster.Cluster) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		_, _ = c.ListStreams(ctx)
		_, _ = c.ListBrokers(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchLeases asks every broker's agent for its lease every 250ms.
func watchLeases(ctx context.Context, c *devcluster.Cluster, rec *history.Recorder) {
	client := c.HTTPClient(time.Second)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		for _, b := range c.Brokers {
			leaseAnswer(ctx, client, rec, b)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func leaseAnswer(ctx context.Context, client *http.Client, rec *history.Recorder, b *devcluster.Proc) {
	var body struct {
		Epoch  uint64 `json:"epoch"`
		Valid  bool   `json:"valid"`
		Fenced bool   `json:"fenced"`
	}
	call := rec.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.AgentListen+"/v1/lease", nil)
	if err != nil {
		return
	}
	resp, err := client.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if err := decodeJSON(resp, &body); err != nil {
		return
	}
	rec.Add(history.Op{Kind: history.KindLease, Call: call, Return: rec.Now(), Broker: b.Name,
		Epoch: body.Epoch, Valid: body.Valid, Fenced: body.Fenced})
}

// readStream reads the stream's recent records from its owner every 300ms
// (recorded: the owner's answer must reach the stream's end).
func readStream(ctx context.Context, c *devcluster.Cluster, id uint64) {
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	var next uint64
	for {
		if n, ok := readOnce(ctx, c, id, next); ok {
			next = n
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func readOnce(ctx context.Context, c *devcluster.Cluster, id, next uint64) (uint64, bool) {
	var d *waldenv1.DescribeStreamResponse
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		var err error
		d, err = waldenv1.NewCatalogClient(cc).DescribeStream(ctx, &waldenv1.DescribeStreamRequest{StreamId: id, FromOffset: math.MaxUint64, MaxObjects: 1})
		return err
	})
	if err != nil || d.GetStream().GetState() != "opened" {
		return 0, false
	}
	owner := c.Proc(d.GetStream().GetOwnerBrokerId())
	if owner == nil {
		return 0, false
	}
	cc, err := c.Conn(owner.Listen)
	if err != nil {
		return 0, false
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// Re-read the last few records too: a record must never change.
	from := uint64(0)
	if next > 16 {
		from = next - 16
	}
	r, err := waldenv1.NewBrokerAPIClient(cc).Read(rctx, &waldenv1.ReadRequest{StreamId: id, FromOffset: from, MaxRecords: 500})
	if err != nil {
		return 0, false
	}
	return r.GetNextOffset(), true
}

// Select returns the scenarios named (all of them for none), in the
// catalog's order.
func Select(names []string) ([]Scenario, error) {
	all := Catalog()
	if len(names) == 0 {
		return all, nil
	}
	var out []Scenario
	for _, s := range all {
		if slices.Contains(names, s.Name) {
			out = append(out, s)
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(all, func(s Scenario) bool { return s.Name == n }) {
			var known []string
			for _, s := range all {
				known = append(known, s.Name)
			}
			sort.Strings(known)
			return nil, fmt.Errorf("%w: no scenario %q (known: %s)", ErrInvalid, n, strings.Join(known, ", "))
		}
	}
	return out, nil
}

// decisionAfter is the time from fault until the first failover decision
// of broker at or after it (the decision event's time, the proposer's
// clock: every process runs on this machine), -1 when there was none.
func decisionAfter(evs []*waldenv1.Event, broker string, fault time.Time) int64 {
	if fault.IsZero() {
		return -1
	}
	from := fault.UnixMilli()
	for _, e := range evs {
		if e.GetEventKind() == waldenv1.EventKind_EVENT_KIND_DECISION && e.GetBrokerId() == broker && e.GetUnixMs() >= from {
			return e.GetUnixMs() - from
		}
	}
	return -1
}

// healthyLapses counts the lease lapses of the brokers not in affected: an
// agent's answer "not valid" (and not fenced) for an epoch it answered
// valid before, and each append refused LEASE_INVALID. A broker's new epoch
// is not valid until granted: that is no lapse.
func healthyLapses(ops []history.Op, affected map[string]bool) (int, string) {
	sorted := slices.Clone(ops)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Return < sorted[j].Return })
	type key struct {
		broker string
		epoch  uint64
	}
	valid := map[key]bool{}
	count := map[string]int{}
	for _, op := range sorted {
		if affected[op.Broker] || op.Broker == "" {
			continue
		}
		switch {
		case op.Kind == history.KindLease && op.Valid:
			valid[key{op.Broker, op.Epoch}] = true
		case op.Kind == history.KindLease && !op.Fenced && valid[key{op.Broker, op.Epoch}]:
			valid[key{op.Broker, op.Epoch}] = false
			count[op.Broker+" (agent answered not valid)"]++
		case op.Kind == history.KindAppend && op.Reason == string(refusal.LeaseInvalid):
			count[op.Broker+" (append refused LEASE_INVALID)"]++
		}
	}
	n := 0
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		n += count[k]
		parts = append(parts, fmt.Sprintf("%s %d", k, count[k]))
	}
	return n, strings.Join(parts, ", ")
}

// ackedTwice counts the offsets the ledger holds two different
// acknowledged records at, with a few examples.
func ackedTwice(path string) (int64, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, fmt.Errorf("chaos: ledger: %w", err)
	}
	defer f.Close()
	type at struct{ stream, offset uint64 }
	seen := map[at]string{}
	var n int64
	var examples []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e loadgen.LedgerEntry
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.ID == "" {
			continue
		}
		k := at{e.Stream, e.Offset}
		if prev, ok := seen[k]; ok && prev != e.ID {
			n++
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("stream %d offset %d (%s and %s)", e.Stream, e.Offset, prev, e.ID))
			}
			continue
		}
		seen[k] = e.ID
	}
	return n, examples, sc.Err()
}
