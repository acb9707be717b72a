package sim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// event is one scheduled action of the world.
type event struct {
	at  int64 // real time, ns
	seq uint64
	fn  func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// host is the machine a simulated process runs on: its clocks and whether it
// runs. Clocks are affine in real time with a rate within the configured
// bound; the boot clock keeps running through a host suspend, the
// process-monotonic clock (Go's time.Now) stops.
type host struct {
	name string
	rate float64 // local seconds per real second
	base int64   // local boot-clock reading at real time 0

	// suspendedSince is the real time a host suspend began; -1 when the
	// host runs.
	suspendedSince int64
	// suspendedTotal is the real time spent suspended before now.
	suspendedTotal int64
	// stalledUntil is the end of a process stall (a GC pause or SIGSTOP:
	// the clocks run, the process does nothing); 0 when not stalled.
	stalledUntil int64
	// down is set while the process is crashed.
	down bool
	// lastResume is the real time the host last resumed or restarted;
	// lastTrouble the end of its last stall or restart.
	lastResume, lastTrouble int64
	// incarnation counts restarts: callbacks of an earlier incarnation are
	// dropped.
	incarnation int
}

// boot returns the host's boot clock (CLOCK_BOOTTIME) at real time t.
func (h *host) boot(t int64) int64 { return h.base + int64(float64(t)*h.rate) }

// mono returns the host's process-monotonic clock at real time t: it does
// not advance while the host is suspended.
func (h *host) mono(t int64) int64 {
	s := h.suspendedTotal
	if h.suspendedSince >= 0 {
		s += t - h.suspendedSince
	}
	return h.base + int64(float64(t-s)*h.rate)
}

// runnable reports whether the process can act at real time t.
func (h *host) runnable(t int64) bool {
	return !h.down && h.suspendedSince < 0 && t >= h.stalledUntil
}

// link is the network path from one host to another.
type link struct {
	cut      bool    // every packet dropped
	loss     float64 // probability a message is dropped
	minDelay int64
	jitter   int64 // uniform extra delay in [0, jitter]
	// badSince is the real time since which the link has not been perfect
	// (cut, lossy or slow); -1 while perfect. goodSince is when it last
	// became perfect.
	goodSince int64
}

func (l *link) perfect() bool {
	return !l.cut && l.loss == 0 && l.jitter <= goodJitter
}

// goodJitter is the largest jitter a link may have and still count as
// healthy for the liveness check.
const goodJitter = int64(20 * time.Millisecond)

// World is one deterministic simulation: hosts, links, a raft model and the
// protocol under test, driven by a seeded random source and an event queue on
// simulated real time.
type World struct {
	cfg  Config
	seed uint64
	rng  *rand.Rand
	now  int64
	seq  uint64
	q    eventQueue

	hosts []*host
	links [][]*link

	coords []*Coord
	agents []*Agent
	raft   *raftModel
	check  *checker

	trace    []string
	traceCap int
	// timers holds, per suspended host, what runs when it resumes.
	timers map[int]*hostTimerSet

	// lastPolicyChange is the real time of the last policy change.
	lastPolicyChange int64
	// replacing is set while a coordinator is being replaced (one at a
	// time, as the runbook says).
	replacing bool
	// failoverRequestedAt is the real time of the last manual failover
	// request per broker.
	failoverRequestedAt map[string]int64
	// jobEpoch is the epoch each recovery job fenced.
	jobEpoch map[string]uint64
	// objects are the records of every object uploaded, by object id (the
	// simulation's S3); nextValue numbers the records written.
	objects   map[string][]simRec
	nextValue uint64
	// restored is set once the cluster was restored from a backup.
	restored bool
	// quorumLost is set from the loss of two coordinators to the force of
	// the survivor into a new cluster; forceFullLog is the committed log
	// before the loss (what the survivor may have missed).
	quorumLost   bool
	forceFullLog []*entry
}

// Config sizes a simulation run.
type Config struct {
	// Coordinators is the number of coordinators (voters). Default 3.
	Coordinators int
	// Agents is the number of brokers' agents. Default 3.
	Agents int
	// Duration is the simulated real time of one run. Default 10m.
	Duration time.Duration
	// RateBound is the documented bound on a clock's rate error (|rate-1|).
	RateBound float64
	// Faults enables each kind of fault.
	Faults Faults
	// Mutations reintroduce fixed defects (tests of the checks).
	Mutations Mutations
	// Trace keeps the last Trace lines of the run's trace (0: 2000).
	Trace int
}

// Faults selects the faults a run injects.
type Faults struct {
	LeaderChanges   bool
	NetworkFaults   bool
	PolicyChanges   bool
	ConfigDrift     bool // members' config files differ
	Suspends        bool // agent hosts suspend
	Stalls          bool // coordinator processes stall
	Restarts        bool // coordinators crash and restart
	ManualFailovers bool
	// Replacements replace a coordinator under its name with an empty data
	// dir and a config file whose lease_ttl is the default (the runbook's
	// replacement: remove, add as a learner, promote once the spacing of
	// voter changes allows).
	Replacements bool
	// Restore takes a backup of the leader's state, loses every coordinator
	// a moment later, and founds a new cluster from the backup, which
	// reconciles with the objects and WALs written after it (restore.go).
	Restore bool
	// ReplacementScript runs, once, the replacement issue 21 found unsafe:
	// the cluster's lease_ttl is raised to 12s; b1 loses its links to c2,
	// then to c1 and c3 as c3 (a follower) is replaced under its name; an
	// operator requests b1's failover. The replacement must not attest
	// while the grants c1 and the old c3 made before still run at b1.
	ReplacementScript bool
	// ForceNewCluster loses two coordinators for good under load — the
	// survivor, in half the runs, cut off first so that it misses the last
	// commits — forces the survivor into a new cluster as
	// `walden server --force-new-cluster` does, and adds the two back with
	// empty data dirs (forcenew.go).
	ForceNewCluster bool
}

// Mutations put back, in the simulation only, defects the project fixed, to
// show that the checks catch them (TestSimulationCatchesMutations).
type Mutations struct {
	// QuietFromConfigFile: a member's quiet period comes from its own config
	// file, not the cluster's lease horizon (issue 21, finding 2).
	QuietFromConfigFile bool
	// NoVoterChangeSpacing: the learner is promoted right after the removal
	// (issue 21, finding 3).
	NoVoterChangeSpacing bool
	// RecoveryReadsNoWAL: a recovery job commits nothing from the WAL, as if
	// every failed epoch had acknowledged nothing.
	RecoveryReadsNoWAL bool
	// ForceNewClusterNoEntry: the force into a new cluster only removes the
	// other members, without the force_new_cluster entry: no broker epoch
	// revoked, the fencing token and the stream epochs not moved past what
	// the lost log may have issued (issue 21, finding 4).
	ForceNewClusterNoEntry bool
}

// AllFaults turns every fault on.
func AllFaults() Faults {
	return Faults{LeaderChanges: true, NetworkFaults: true, PolicyChanges: true, ConfigDrift: true,
		Suspends: true, Stalls: true, Restarts: true, ManualFailovers: true, Replacements: true}
}

func (c *Config) defaults() {
	if c.Coordinators <= 0 {
		c.Coordinators = 3
	}
	if c.Agents <= 0 {
		c.Agents = 3
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Minute
	}
	if c.Trace <= 0 {
		c.Trace = 2000
	}
}

// NewWorld builds a world for seed.
func NewWorld(seed uint64, cfg Config) *World {
	cfg.defaults()
	w := &World{cfg: cfg, seed: seed, failoverRequestedAt: map[string]int64{}, jobEpoch: map[string]uint64{}, objects: map[string][]simRec{}, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), traceCap: cfg.Trace}
	w.check = newChecker(w)
	n := cfg.Coordinators + cfg.Agents
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("c%d", i+1)
		if i >= cfg.Coordinators {
			name = fmt.Sprintf("b%d", i-cfg.Coordinators+1)
		}
		rate := 1.0
		if cfg.RateBound > 0 {
			rate = 1 + (2*w.rng.Float64()-1)*cfg.RateBound
		}
		w.hosts = append(w.hosts, &host{name: name, rate: rate, base: w.rng.Int64N(int64(time.Hour)), suspendedSince: -1})
	}
	w.links = make([][]*link, n)
	for i := range w.links {
		w.links[i] = make([]*link, n)
		for j := range w.links[i] {
			w.links[i][j] = &link{minDelay: int64(200 * time.Microsecond), jitter: int64(2 * time.Millisecond), goodSince: 0}
		}
	}
	w.raft = newRaftModel(w)
	for i := 0; i < cfg.Coordinators; i++ {
		w.coords = append(w.coords, newCoord(w, i))
	}
	for i := 0; i < cfg.Agents; i++ {
		w.agents = append(w.agents, newAgent(w, cfg.Coordinators+i))
	}
	return w
}

// tracef records one line of the run's trace.
func (w *World) tracef(format string, args ...any) {
	line := fmt.Sprintf("%9.3fs ", float64(w.now)/1e9) + fmt.Sprintf(format, args...)
	if len(w.trace) >= w.traceCap {
		copy(w.trace, w.trace[1:])
		w.trace = w.trace[:len(w.trace)-1]
	}
	w.trace = append(w.trace, line)
}

// Trace returns the last lines of the run's trace.
func (w *World) Trace() string { return strings.Join(w.trace, "\n") }

// at schedules fn at real time t.
func (w *World) at(t int64, fn func()) {
	if t < w.now {
		t = w.now
	}
	w.seq++
	heap.Push(&w.q, &event{at: t, seq: w.seq, fn: fn})
}

// after schedules fn after real duration d.
func (w *World) after(d int64, fn func()) { w.at(w.now+d, fn) }

// onHost schedules fn on host h after local duration d (its monotonic
// timer): fn runs only in the same incarnation, and waits while the host is
// suspended or the process stalls. A host suspend stops the timer (Go's
// timers follow the monotonic clock).
func (w *World) onHost(h int, d time.Duration, fn func()) {
	hh := w.hosts[h]
	inc := hh.incarnation
	dueMono := hh.mono(w.now) + int64(d)
	var try func()
	try = func() {
		if hh.down || hh.incarnation != inc {
			return
		}
		if hh.suspendedSince >= 0 {
			w.hostTimers(h).add(try) // the monotonic clock stands still
			return
		}
		if m := hh.mono(w.now); m < dueMono {
			w.after(int64(math.Ceil(float64(dueMono-m)/hh.rate)), try)
			return
		}
		if !hh.runnable(w.now) {
			w.deferRun(h, try)
			return
		}
		fn()
	}
	w.after(int64(math.Ceil(float64(d)/hh.rate)), try)
}

// deferRun runs fn once host h can run again.
func (w *World) deferRun(h int, fn func()) {
	hh := w.hosts[h]
	switch {
	case hh.down:
	case hh.suspendedSince >= 0:
		w.hostTimers(h).add(fn)
	default:
		w.at(hh.stalledUntil, fn)
	}
}

// send delivers msg from host from to host to after the link's delay,
// unless the link drops it. deliver runs on the receiving host when it can
// run; a crashed receiver loses it.
func (w *World) send(from, to int, deliver func()) bool {
	if from == to {
		w.after(0, func() { w.runOn(to, deliver) })
		return true
	}
	l := w.links[from][to]
	if l.cut || (l.loss > 0 && w.rng.Float64() < l.loss) {
		return false
	}
	d := l.minDelay
	if l.jitter > 0 {
		d += w.rng.Int64N(l.jitter + 1)
	}
	inc := w.hosts[to].incarnation
	w.after(d, func() {
		if w.hosts[to].incarnation != inc {
			return
		}
		w.runOn(to, deliver)
	})
	return true
}

// runOn runs fn on host h now, or when it can run again.
func (w *World) runOn(h int, fn func()) {
	hh := w.hosts[h]
	if hh.down {
		return
	}
	if !hh.runnable(w.now) {
		w.deferRun(h, fn)
		return
	}
	fn()
}

// call is a request/response exchange from host from to host to with a
// timeout on the caller's monotonic clock: handle runs on the receiver and
// answers through reply; done runs once on the caller, with the answer or
// with timedOut set.
func (w *World) call(from, to int, timeout time.Duration, handle func(reply func(resp any)), done func(resp any, timedOut bool)) {
	finished := false
	inc := w.hosts[from].incarnation
	finish := func(resp any, timedOut bool) {
		if finished || w.hosts[from].incarnation != inc {
			return
		}
		finished = true
		done(resp, timedOut)
	}
	w.onHost(from, timeout, func() { finish(nil, true) })
	w.send(from, to, func() {
		handle(func(resp any) {
			w.send(to, from, func() { finish(resp, false) })
		})
	})
}

// Run runs the world until its duration and returns the violations found.
func (w *World) Run() []Violation {
	w.startFaults()
	for _, c := range w.coords {
		c.start()
	}
	for _, a := range w.agents {
		a.start()
	}
	w.check.start()
	end := int64(w.cfg.Duration)
	for w.q.Len() > 0 && len(w.check.violations) == 0 {
		e := heap.Pop(&w.q).(*event)
		if e.at > end {
			break
		}
		w.now = e.at
		e.fn()
	}
	return w.check.violations
}

// hostTimerSet holds functions to run when a suspended host resumes.
type hostTimerSet struct{ fns []func() }

func (s *hostTimerSet) add(fn func()) { s.fns = append(s.fns, fn) }

func (w *World) hostTimers(h int) *hostTimerSet {
	if w.timers == nil {
		w.timers = map[int]*hostTimerSet{}
	}
	s := w.timers[h]
	if s == nil {
		s = &hostTimerSet{}
		w.timers[h] = s
	}
	return s
}
