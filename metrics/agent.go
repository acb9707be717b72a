package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AgentLease is an agent's lease as it sees it at one instant (agent.Lease).
type AgentLease struct {
	Epoch     uint64
	Valid     bool
	Remaining time.Duration
	Fenced    bool
}

// AgentCollector reports an agent's lease at every scrape, labelled with
// its broker_id:
//
//	walden_agent_lease_valid              1 while the broker may acknowledge writes
//	walden_agent_lease_remaining_seconds  how long the lease stays valid without another renewal, as the agent sees it
//	walden_agent_epoch                    the broker's current fencing token (0 before the first registration)
//	walden_agent_fenced                   1 once the cluster refused the epoch (failed over), until it registers again
type AgentCollector struct {
	lease                           func() AgentLease
	valid, remaining, epoch, fenced *prometheus.Desc
}

// NewAgentCollector returns the collector of the agent of brokerID whose
// lease lease returns.
func NewAgentCollector(brokerID string, lease func() AgentLease) *AgentCollector {
	l := prometheus.Labels{"broker_id": brokerID}
	return &AgentCollector{
		lease: lease,
		valid: prometheus.NewDesc("walden_agent_lease_valid",
			"1 while the agent's lease is valid (the broker may acknowledge writes), else 0.", nil, l),
		remaining: prometheus.NewDesc("walden_agent_lease_remaining_seconds",
			"How long the broker's lease stays valid without another renewal, as the agent sees it on its monotonic clock (safety margin deducted); 0 when not valid.", nil, l),
		epoch: prometheus.NewDesc("walden_agent_epoch",
			"The broker's current epoch (fencing token); 0 before the first registration.", nil, l),
		fenced: prometheus.NewDesc("walden_agent_fenced",
			"1 once the cluster refused the broker's epoch (it was failed over), until the agent has registered again.", nil, l),
	}
}

// Describe implements prometheus.Collector.
func (c *AgentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.valid
	ch <- c.remaining
	ch <- c.epoch
	ch <- c.fenced
}

// Collect implements prometheus.Collector.
func (c *AgentCollector) Collect(ch chan<- prometheus.Metric) {
	l := c.lease()
	ch <- prometheus.MustNewConstMetric(c.valid, prometheus.GaugeValue, b2f(l.Valid))
	ch <- prometheus.MustNewConstMetric(c.remaining, prometheus.GaugeValue, max(l.Remaining, 0).Seconds())
	ch <- prometheus.MustNewConstMetric(c.epoch, prometheus.GaugeValue, float64(l.Epoch))
	ch <- prometheus.MustNewConstMetric(c.fenced, prometheus.GaugeValue, b2f(l.Fenced))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// AgentRenewals counts an agent's renewals:
//
//	walden_agent_lease_renewals_total{result}  granted, refused, failed: one renewal with one coordinator
//
// Its methods do nothing on a nil *AgentRenewals.
type AgentRenewals struct {
	rounds *prometheus.CounterVec
}

// NewAgentRenewals creates the series for the agent of brokerID.
func NewAgentRenewals(brokerID string) *AgentRenewals {
	r := &AgentRenewals{rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "walden_agent_lease_renewals_total",
		Help:        "Lease renewals of the agent with one coordinator each, by result: granted, refused (the coordinator answered with a refusal), failed (no answer in time). The lease is valid while a majority of the voters' grants are.",
		ConstLabels: prometheus.Labels{"broker_id": brokerID},
	}, []string{"result"})}
	for _, res := range AgentRenewalResults {
		r.rounds.WithLabelValues(res)
	}
	return r
}

// Collectors are the series to register.
func (r *AgentRenewals) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.rounds}
}

// Renewal counts one renewal with its result (AgentRenewalResults).
func (r *AgentRenewals) Renewal(result string) {
	if r != nil {
		r.rounds.WithLabelValues(bounded(result, AgentRenewalResults)).Inc()
	}
}

// AgentBroker reports the supervision of an agent's broker (the broker and
// watchdog sections of its configuration), labelled with its broker_id:
//
//	walden_agent_broker_state{state}                 1 for the broker's current state, 0 for the others
//	walden_agent_broker_check_failures_total{check}  failed checks of the broker: tcp, exec
//	walden_agent_watchdog_armed                      1 while the watchdog holds a deadline for a live broker
//	walden_agent_watchdog_kills_total{reason}        kills of the broker by the watchdog, by reason
//	walden_agent_watchdog_kill_latency_seconds       from a kill to the broker's confirmed exit
//	walden_agent_watchdog_kill_lead_seconds          for kills as the lease ran out: how long before the end of the lease's validity the broker was confirmed dead (negative: after)
//
// Its methods do nothing on a nil *AgentBroker.
type AgentBroker struct {
	states           []string
	state, armed     *prometheus.GaugeVec
	checks, kills    *prometheus.CounterVec
	reasons, checkNs []string
	latency, lead    prometheus.Histogram
}

// NewAgentBroker creates the series for the agent of brokerID; states,
// reasons and checks are every value of their labels.
func NewAgentBroker(brokerID string, states, reasons, checks []string) *AgentBroker {
	l := prometheus.Labels{"broker_id": brokerID}
	m := &AgentBroker{
		states: states, reasons: reasons, checkNs: checks,
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walden_agent_broker_state",
			Help: "1 for the state the agent sees its broker in (waiting, starting, up, down, stopped), 0 for the others. Down: its process exited or its checks failed; the agent renews its lease no more.", ConstLabels: l}, []string{"state"}),
		armed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walden_agent_watchdog_armed",
			Help: "1 while the watchdog holds a deadline for a live broker: it kills the broker that long before the lease's validity ends.", ConstLabels: l}, nil),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walden_agent_broker_check_failures_total",
			Help: "Failed checks of the broker by the agent, by check: tcp (a connect to broker.kafka_addr), exec (broker.health_command).", ConstLabels: l}, []string{"check"}),
		kills: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walden_agent_watchdog_kills_total",
			Help: "Kills of the broker by its watchdog, by reason: lease (its lease was about to run out), no_lease, fenced, health, stop, agent_gone, watchdog_gap (the agent's own backstop).", ConstLabels: l}, []string{"reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "walden_agent_watchdog_kill_latency_seconds",
			Help: "From the watchdog's kill to the broker's confirmed exit.", ConstLabels: l,
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
		lead: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "walden_agent_watchdog_kill_lead_seconds",
			Help: "For kills as the lease ran out: how long before the end of the lease's validity the broker was confirmed dead; negative when after it (watchdog.kill_margin too small for this host).", ConstLabels: l,
			Buckets: []float64{-1, -.25, 0, .05, .1, .25, .5, 1, 2.5}}),
	}
	for _, s := range states {
		m.state.WithLabelValues(s)
	}
	for _, r := range reasons {
		m.kills.WithLabelValues(r)
	}
	for _, c := range checks {
		m.checks.WithLabelValues(c)
	}
	m.armed.WithLabelValues()
	return m
}

// Collectors are the series to register.
func (m *AgentBroker) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.state, m.armed, m.checks, m.kills, m.latency, m.lead}
}

// State records the broker's current state.
func (m *AgentBroker) State(state string) {
	if m == nil {
		return
	}
	for _, s := range m.states {
		m.state.WithLabelValues(s).Set(b2f(s == state))
	}
}

// Armed records whether the watchdog is armed.
func (m *AgentBroker) Armed(armed bool) {
	if m != nil {
		m.armed.WithLabelValues().Set(b2f(armed))
	}
}

// Kill records one confirmed kill: its latency, and for a lease kill how
// long before the lease's end the broker was dead.
func (m *AgentBroker) Kill(reason string, latency, lead time.Duration, leaseKill bool) {
	if m == nil {
		return
	}
	m.kills.WithLabelValues(bounded(reason, m.reasons)).Inc()
	m.latency.Observe(latency.Seconds())
	if leaseKill {
		m.lead.Observe(lead.Seconds())
	}
}

// CheckFailed counts one failed check.
func (m *AgentBroker) CheckFailed(check string) {
	if m != nil {
		m.checks.WithLabelValues(bounded(check, m.checkNs)).Inc()
	}
}
