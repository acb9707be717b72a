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
