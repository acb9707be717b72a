package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Decisions are the series of the lease protocol and of the failover
// decision on a coordinator:
//
//	walden_lease_renewals_total{result}         renewals answered by this member (granted, refused)
//	walden_lease_refusals_total{reason}         refused renewals by reason
//	walden_lease_renewal_streams{transport}     agents' renewal connections open on this member (frames, stream)
//	walden_failover_decisions_total{outcome,reason}
//	walden_failover_holds{gate}                 suspect brokers the leader holds back, by the gate that holds them
//	walden_failover_frozen                      1 while automatic failover is frozen
//
// Its methods do nothing on a nil *Decisions.
type Decisions struct {
	renewals  *prometheus.CounterVec
	refusals  *prometheus.CounterVec
	streams   *prometheus.GaugeVec
	decisions *prometheus.CounterVec
	holds     *prometheus.GaugeVec
	frozen    prometheus.Gauge
}

// NewDecisions creates the series, every label value present at zero.
func NewDecisions() *Decisions {
	d := &Decisions{
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_lease_renewals_total",
			Help: "Lease renewals this coordinator answered, by result (granted, refused): calls, streamed and framed renewals alike.",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_lease_refusals_total",
			Help: "Lease renewals this coordinator refused, by reason: node_fenced, epoch_expired, unknown_node (the epoch is gone for good), lease_attested (this coordinator attested that its grant ran out), failover_requested, unavailable (no policy yet, not a voter, the quiet period after a start, not caught up), invalid_argument.",
		}, []string{"reason"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "walden_lease_renewal_streams",
			Help: "Agents' lease renewal connections open on this coordinator, one per agent of this walden or later, by transport: frames (a connection of their own on the admin port, renewals.frames) or stream (the gRPC stream Agent.RenewLeases). Agents of an older walden, or set to renewals.transport call, renew with one call each and are not counted.",
		}, []string{"transport"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_failover_decisions_total",
			Help: "Failover decisions this coordinator proposed as leader, by outcome (failed_over, dry_run, refused by the state machine) and reason (automatic, manual).",
		}, []string{"outcome", "reason"}),
		holds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "walden_failover_holds",
			Help: "Suspect brokers the leader holds back from a failover at its last round, by the gate that holds each: quorum, timeout, lease (not attested expired by a majority), frozen, max_concurrent_recoveries, cooldown, dry_run_done. 0 on other members.",
		}, []string{"gate"}),
		frozen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "walden_failover_frozen",
			Help: "1 while automatic failover is frozen (more than max_failed_fraction of the brokers look failed at once), else 0. Set by the leader.",
		}),
	}
	for _, r := range LeaseResults {
		d.renewals.WithLabelValues(r)
	}
	for _, tr := range RenewalTransports {
		d.streams.WithLabelValues(tr)
	}
	for _, r := range append(LeaseRefusalReasons, other) {
		d.refusals.WithLabelValues(r)
	}
	for _, o := range DecisionOutcomes {
		for _, r := range DecisionReasons {
			d.decisions.WithLabelValues(o, r)
		}
	}
	for _, g := range HoldGates {
		d.holds.WithLabelValues(g)
	}
	return d
}

// Collectors are the series to register.
func (d *Decisions) Collectors() []prometheus.Collector {
	return []prometheus.Collector{d.renewals, d.refusals, d.streams, d.decisions, d.holds, d.frozen}
}

// RenewalGranted counts a granted renewal.
func (d *Decisions) RenewalGranted() {
	if d != nil {
		d.renewals.WithLabelValues("granted").Inc()
	}
}

// RenewalRefused counts a refused renewal with its reason (one of
// LeaseRefusalReasons).
func (d *Decisions) RenewalRefused(reason string) {
	if d != nil {
		d.renewals.WithLabelValues("refused").Inc()
		d.refusals.WithLabelValues(bounded(reason, LeaseRefusalReasons)).Inc()
	}
}

// RenewalStreams adds delta (1 or -1) to the agents' renewal connections
// open over transport (one of RenewalTransports).
func (d *Decisions) RenewalStreams(transport string, delta int) {
	if d != nil {
		d.streams.WithLabelValues(bounded(transport, RenewalTransports)).Add(float64(delta))
	}
}

// Decided counts a decision (outcome in DecisionOutcomes, reason in
// DecisionReasons).
func (d *Decisions) Decided(outcome, reason string) {
	if d != nil {
		d.decisions.WithLabelValues(bounded(outcome, DecisionOutcomes), bounded(reason, DecisionReasons)).Inc()
	}
}

// SetHolds sets the number of brokers held by each gate (gates absent from
// held are 0). A member that stops leading calls SetHolds(nil).
func (d *Decisions) SetHolds(held map[string]int) {
	if d == nil {
		return
	}
	counts := map[string]int{}
	for g, n := range held {
		counts[bounded(g, HoldGates)] += n
	}
	for _, g := range HoldGates {
		d.holds.WithLabelValues(g).Set(float64(counts[g]))
	}
	if n, ok := counts[other]; ok {
		d.holds.WithLabelValues(other).Set(float64(n))
	}
}

// SetFrozen records whether automatic failover is frozen.
func (d *Decisions) SetFrozen(frozen bool) {
	if d == nil {
		return
	}
	v := 0.0
	if frozen {
		v = 1
	}
	d.frozen.Set(v)
}
