package metrics

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	waldenv1 "walden/proto/walden/v1"
)

// allCollectors registers every collector of the package on a pedantic
// registry (which checks descriptions and consistency at every gather).
func allCollectors(t *testing.T, src *fakeState) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewDecisions().Collectors()...)
	reg.MustRegister(NewRecovery().Collectors()...)
	reg.MustRegister(NewFailoverWatcher(src, func() bool { return true }).Collectors()...)
	reg.MustRegister(NewClusterCollector(src.clusterSource()))
	reg.MustRegister(NewAgentCollector("b1", func() AgentLease { return AgentLease{Epoch: 3, Valid: true, Remaining: 1500 * time.Millisecond} }))
	reg.MustRegister(NewAgentRenewals("b1").Collectors()...)
	reg.MustRegister(NewBrokerCollector("b1", func() BrokerStatus { return BrokerStatus{Serving: true, Uploads: 7, WALPendingBytes: 4096, Streams: 2} }))
	return reg
}

func TestSeriesFollowPrometheusConventions(t *testing.T) {
	reg := allCollectors(t, newFakeState())
	problems, err := promlint.NewWithMetricFamilies(gather(t, reg)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	for _, mf := range gather(t, reg) {
		if !strings.HasPrefix(mf.GetName(), "walden_") {
			t.Errorf("%s: no walden_ prefix", mf.GetName())
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s: no help", mf.GetName())
		}
	}
}

func gather(t *testing.T, reg *prometheus.Registry) []*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

func TestDecisionsBoundLabels(t *testing.T) {
	d := NewDecisions()
	d.RenewalGranted()
	d.RenewalRefused("node_fenced")
	d.RenewalRefused("a reason nobody listed")
	d.Decided("failed_over", "automatic")
	d.Decided("exploded", "cosmic rays")
	d.SetHolds(map[string]int{"quorum": 2, "lease": 1, "a gate nobody listed": 1})
	d.SetFrozen(true)
	d.RenewalStreams("frames", 1)
	d.RenewalStreams("frames", 1)
	d.RenewalStreams("stream", 1)
	d.RenewalStreams("frames", -1)
	d.RenewalStreams("carrier pigeon", 1)
	for tr, want := range map[string]float64{"frames": 1, "stream": 1, "other": 1} {
		if got := testutil.ToFloat64(d.streams.WithLabelValues(tr)); got != want {
			t.Fatalf("renewal connections over %s = %v, want %v", tr, got, want)
		}
	}
	if got := testutil.ToFloat64(d.renewals.WithLabelValues("refused")); got != 2 {
		t.Fatalf("refused renewals = %v", got)
	}
	if got := testutil.ToFloat64(d.refusals.WithLabelValues("other")); got != 1 {
		t.Fatalf("other refusals = %v", got)
	}
	if got := testutil.ToFloat64(d.decisions.WithLabelValues("other", "other")); got != 1 {
		t.Fatalf("other decisions = %v", got)
	}
	if n := testutil.CollectAndCount(d.decisions); n != len(DecisionOutcomes)*len(DecisionReasons)+1 {
		t.Fatalf("%d decision series", n)
	}
	if got := testutil.ToFloat64(d.holds.WithLabelValues("quorum")); got != 2 {
		t.Fatalf("quorum holds = %v", got)
	}
	d.SetHolds(nil)
	if got := testutil.ToFloat64(d.holds.WithLabelValues("quorum")); got != 0 {
		t.Fatalf("quorum holds after reset = %v", got)
	}
	if testutil.ToFloat64(d.frozen) != 1 {
		t.Fatal("not frozen")
	}
	var none *Decisions
	none.RenewalGranted()
	none.RenewalRefused("fenced")
	none.Decided("dry_run", "manual")
	none.SetHolds(map[string]int{"quorum": 1})
	none.SetFrozen(true)
	none.RenewalStreams("frames", 1)
	var noRecovery *Recovery
	noRecovery.StepRun(waldenv1.JobStep_JOB_STEP_READ, time.Second, false)
	noRecovery.Uploaded(10)
	var noRenewals *AgentRenewals
	noRenewals.Renewal("granted")
}

// fakeState is a FailoverSource and the source of a ClusterCollector.
type fakeState struct {
	mu      sync.Mutex
	jobs    []*waldenv1.Job
	events  []*waldenv1.Event
	brokers []*waldenv1.Broker
	changed chan struct{}
}

func newFakeState() *fakeState { return &fakeState{changed: make(chan struct{})} }

func (f *fakeState) Jobs(string, waldenv1.JobState) []*waldenv1.Job {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneAll(f.jobs)
}

func (f *fakeState) Events(brokerID string, _ int) []*waldenv1.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*waldenv1.Event
	for _, e := range f.events {
		if e.GetBrokerId() == brokerID {
			out = append(out, e)
		}
	}
	return out
}

func (f *fakeState) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *fakeState) set(fn func()) {
	f.mu.Lock()
	fn()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeState) clusterSource() ClusterSource {
	return ClusterSource{
		NodeID: "c1",
		Brokers: func() []*waldenv1.Broker {
			f.mu.Lock()
			defer f.mu.Unlock()
			return cloneAll(f.brokers)
		},
		Jobs: func() []*waldenv1.Job { return f.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED) },
		Raft: func() RaftView { return RaftView{Leader: true, Voters: 3, Reachable: 2} },
		Gossip: func() []GossipMember {
			return []GossipMember{{"coordinator", "alive"}, {"agent", "alive"}, {"agent", "dead"}}
		},
		Policy: func() *waldenv1.Policy { return &waldenv1.Policy{FailureTimeoutMs: 5000} },
	}
}

func cloneAll[T any](in []T) []T {
	return append([]T(nil), in...)
}

func TestClusterCollector(t *testing.T) {
	f := newFakeState()
	f.brokers = []*waldenv1.Broker{
		{BrokerId: "b1", BrokerState: waldenv1.BrokerState_BROKER_STATE_ALIVE, Observations: []*waldenv1.Observation{{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_ALIVE}, {ObserverId: "c2", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD}}},
		{BrokerId: "b2", BrokerState: waldenv1.BrokerState_BROKER_STATE_FAILED, Failovers: 2, CooldownBlocked: true, Observations: []*waldenv1.Observation{{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD}}},
		// Failed over and fenced: c1's suspicion of its old epoch is not
		// counted (it stayed "suspect" for good).
		{BrokerId: "b3", BrokerState: waldenv1.BrokerState_BROKER_STATE_RECOVERED, Epoch: 5, Fenced: true, Observations: []*waldenv1.Observation{{ObserverId: "c1", Epoch: 4, ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT}}},
		{BrokerId: "b3", BrokerState: waldenv1.BrokerState_BROKER_STATE_RECOVERED, Failovers: 1},
	}
	f.jobs = []*waldenv1.Job{{JobId: "j1", JobState: waldenv1.JobState_JOB_STATE_RUNNING}, {JobId: "j2", JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED}}
	c := NewClusterCollector(f.clusterSource())
	want := `
# HELP walden_brokers Registered brokers by state (alive, suspect, failed, recovering, recovered, maintenance), from the replicated state: the same on every member.
# TYPE walden_brokers gauge
walden_brokers{state="alive"} 1
walden_brokers{state="failed"} 1
walden_brokers{state="maintenance"} 0
walden_brokers{state="recovered"} 2
walden_brokers{state="recovering"} 0
walden_brokers{state="suspect"} 0
# HELP walden_failovers_total Failover decisions applied to brokers (automatic and manual), from the replicated state: the same on every member.
# TYPE walden_failovers_total counter
walden_failovers_total 3
# HELP walden_observations This member's current observations of the registered brokers, by state (alive, suspect, dead).
# TYPE walden_observations gauge
walden_observations{state="alive"} 1
walden_observations{state="dead"} 1
walden_observations{state="suspect"} 0
# HELP walden_recovery_jobs Recovery jobs by state (pending, running, succeeded, failed, cancelled, blocked), from the replicated state: the same on every member.
# TYPE walden_recovery_jobs gauge
walden_recovery_jobs{state="blocked"} 0
walden_recovery_jobs{state="cancelled"} 0
walden_recovery_jobs{state="failed"} 0
walden_recovery_jobs{state="pending"} 0
walden_recovery_jobs{state="running"} 1
walden_recovery_jobs{state="succeeded"} 1
# HELP walden_raft_voters_reachable Voters this member's raft transport reaches, itself included. A quorum needs more than half of walden_raft_voters.
# TYPE walden_raft_voters_reachable gauge
walden_raft_voters_reachable 2
# HELP walden_brokers_cooldown_blocked Brokers that looked failed again within the cooldown after a recovery: their automatic failover waits for ` + "`waldenctl ack`" + `.
# TYPE walden_brokers_cooldown_blocked gauge
walden_brokers_cooldown_blocked 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "walden_brokers", "walden_failovers_total", "walden_observations",
		"walden_recovery_jobs", "walden_raft_voters_reachable", "walden_brokers_cooldown_blocked"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c, "walden_gossip_members"); n != len(GossipRoles)*len(GossipStates) {
		t.Fatalf("%d gossip series", n)
	}
	a := PolicyFingerprint(&waldenv1.Policy{FailureTimeoutMs: 5000})
	b := PolicyFingerprint(&waldenv1.Policy{FailureTimeoutMs: 6000})
	if a == b || a != PolicyFingerprint(&waldenv1.Policy{FailureTimeoutMs: 5000}) || a >= 1<<52 {
		t.Fatalf("fingerprints %v %v", a, b)
	}
}

// failedOver returns a succeeded job of broker b1 and its decision event:
// suspected at t0, decided at t0+5s, fence +0.1s, lease wait 2s, attach
// +0.2s, read +1s, upload +3s, commit +0.5s, close +0.3s, detach +0.1s,
// reopened 4s after the close.
func failedOver(t0 int64, reopened bool) (*waldenv1.Job, *waldenv1.Event) {
	d := t0 + 5000
	steps := []struct {
		step string
		at   int64
	}{{"fence", d + 2100}, {"attach", d + 2300}, {"read", d + 3300}, {"upload", d + 6300}, {"commit", d + 6800}, {"close", d + 7100}, {"detach", d + 7200}}
	j := &waldenv1.Job{JobId: "j1", BrokerId: "b1", JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED, Attempt: 1, AssigneeId: "c2", CreatedUnixMs: d,
		FinishedUnixMs: d + 7200, LeaseWaitMs: 2000, StreamsTotal: 2, StreamsClosed: 2}
	for _, s := range steps {
		step, _ := waldenv1.Parse[waldenv1.JobStep](s.step)
		j.Checkpoints = append(j.Checkpoints, &waldenv1.Checkpoint{JobStep: step, Attempt: 1, UnixMs: s.at})
	}
	if reopened {
		j.StreamsReopened, j.FirstReopenedUnixMs, j.ReopenedUnixMs = 2, d+9000, d+11100
	}
	ev := &waldenv1.Event{Index: 10, UnixMs: d, EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", JobId: "j1", Actor: "c1",
		Evidence: &waldenv1.Evidence{Observations: []*waldenv1.Observation{
			{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD, SinceUnixMs: t0 + 500}, {ObserverId: "c2", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, SinceUnixMs: t0}}}}
	return j, ev
}

func TestFailoverWatcherObservesCompletedFailovers(t *testing.T) {
	f := newFakeState()
	// A failover that completed before the watcher started is not observed.
	old, oldEv := failedOver(1_000_000, true)
	old.JobId, oldEv.JobId = "j0", "j0"
	f.jobs, f.events = []*waldenv1.Job{old}, []*waldenv1.Event{oldEv}
	w := NewFailoverWatcher(f, func() bool { return true })
	now := time.Unix(100, 0)
	w.now = func() time.Time { return now }
	w.Scan()
	if n := histCount(t, w.phases, "detect"); n != 0 {
		t.Fatalf("history observed: %d", n)
	}

	// A new job runs: it is active; the stalled gauge grows until it moves.
	j, ev := failedOver(2_000_000, false)
	running := &waldenv1.Job{JobId: "j1", BrokerId: "b1", JobState: waldenv1.JobState_JOB_STATE_RUNNING, JobStep: waldenv1.JobStep_JOB_STEP_READ, Attempt: 1}
	f.set(func() { f.jobs = append(f.jobs, running) })
	w.Scan()
	now = now.Add(90 * time.Second)
	if got := testutil.ToFloat64(w.stalled); got != 90 {
		t.Fatalf("stalled = %v, want 90", got)
	}
	f.set(func() { running.BytesUploaded = 100 })
	w.Scan()
	if got := testutil.ToFloat64(w.stalled); got != 0 {
		t.Fatalf("stalled after progress = %v, want 0", got)
	}

	// It succeeds: every phase up to detach is observed once; reopen waits.
	f.set(func() { f.jobs[1], f.events = j, append(f.events, ev) })
	w.Scan()
	w.Scan()
	want := map[string]float64{"detect": 5, "fence": 0.1, "lease_wait": 2, "attach": 0.2, "read": 1, "upload": 3, "commit": 0.5, "close": 0.3, "detach": 0.1}
	for phase, sum := range want {
		if n, s := histCountSum(t, w.phases, phase); n != 1 || !near(s, sum) {
			t.Errorf("phase %s: %d observations summing %v, want 1 of %v", phase, n, s, sum)
		}
	}
	if n := histCount(t, w.phases, "reopen"); n != 0 {
		t.Fatalf("reopen observed before the streams reopened")
	}
	if testutil.ToFloat64(w.stalled) != 0 {
		t.Fatal("a finished job counts as stalled")
	}

	// The streams reopen: reopen and the whole failover are observed.
	f.set(func() {
		f.jobs[1].StreamsReopened, f.jobs[1].FirstReopenedUnixMs, f.jobs[1].ReopenedUnixMs = 2, 2_005_000+9000, 2_005_000+11100
	})
	w.Scan()
	w.Scan()
	if n, s := histCountSum(t, w.phases, "reopen"); n != 1 || !near(s, 4) {
		t.Fatalf("reopen: %d observations summing %v, want 1 of 4", n, s)
	}
	m := &dto.Metric{}
	if err := w.total.Write(m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h.GetSampleCount() != 1 || !near(h.GetSampleSum(), 16.1) {
		t.Fatalf("failover duration: %d samples summing %v, want 1 of 16.1", h.GetSampleCount(), h.GetSampleSum())
	}
	if n := histCount(t, w.phases, "detect"); n != 1 {
		t.Fatalf("detect observed %d times", n)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func histCount(t *testing.T, h *prometheus.HistogramVec, phase string) uint64 {
	n, _ := histCountSum(t, h, phase)
	return n
}

func histCountSum(t *testing.T, h *prometheus.HistogramVec, phase string) (uint64, float64) {
	t.Helper()
	m := &dto.Metric{}
	if err := h.WithLabelValues(phase).(prometheus.Histogram).Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func TestAgentAndBrokerCollectors(t *testing.T) {
	reg := allCollectors(t, newFakeState())
	want := `
# HELP walden_agent_lease_remaining_seconds How long the broker's lease stays valid without another renewal, as the agent sees it on its monotonic clock (safety margin deducted); 0 when not valid.
# TYPE walden_agent_lease_remaining_seconds gauge
walden_agent_lease_remaining_seconds{broker_id="b1"} 1.5
# HELP walden_broker_wal_pending_bytes Record payload bytes in the broker's WAL that are not yet uploaded: what a failover would recover if the broker died now.
# TYPE walden_broker_wal_pending_bytes gauge
walden_broker_wal_pending_bytes{broker_id="b1"} 4096
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "walden_agent_lease_remaining_seconds", "walden_broker_wal_pending_bytes"); err != nil {
		t.Fatal(err)
	}
}
