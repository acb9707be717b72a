package metrics

import (
	"hash/fnv"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// ClusterSource is what a coordinator knows that the ClusterCollector
// reports at every scrape. Nil functions report nothing.
type ClusterSource struct {
	// NodeID is this member's id (its own observations are counted).
	NodeID string
	// Brokers returns copies of the registered brokers (fsm.State.Brokers).
	Brokers func() []*waldenv1.Broker
	// Jobs returns copies of the recovery jobs (fsm.State.Jobs with no
	// filter).
	Jobs func() []*waldenv1.Job
	// Raft is this member's view of the raft group.
	Raft func() RaftView
	// Gossip lists the members of this member's gossip pool (nil when
	// gossip is off).
	Gossip func() []GossipMember
	// Policy is the policy: section of this member's configuration file.
	Policy func() *waldenv1.Policy
}

// RaftView is a member's view of its raft group.
type RaftView struct {
	// Leader says this member leads.
	Leader bool
	// Voters is the number of voters in the configuration; Reachable how
	// many of them this member reaches (itself included).
	Voters, Reachable int
}

// GossipMember is one member of a gossip pool.
type GossipMember struct {
	// Role is "coordinator" or "agent"; State "alive", "dead" or "left".
	Role, State string
}

// ClusterCollector reports, at every scrape, what the replicated state and
// this member's views say:
//
//	walden_brokers{state}                 registered brokers by state (the same on every member)
//	walden_brokers_cooldown_blocked       brokers whose next failover waits for an operator ack
//	walden_failovers_total                failover decisions applied (replicated state)
//	walden_recovery_jobs{state}           recovery jobs by state (replicated state)
//	walden_observations{state}            this member's observations of the brokers, by state
//	walden_gossip_members{role,state}     members of this member's gossip pool
//	walden_raft_is_leader                 1 on the leader
//	walden_raft_voters                    voters in the configuration
//	walden_raft_voters_reachable          voters this member reaches, itself included
//	walden_policy_fingerprint             identifies the policy: section of this member's file (members that differ have drifted)
type ClusterCollector struct {
	src ClusterSource

	brokers, cooldown, failovers, jobs, observations, gossip *prometheus.Desc
	isLeader, voters, reachable, fingerprint                 *prometheus.Desc
}

// NewClusterCollector returns the collector of src.
func NewClusterCollector(src ClusterSource) *ClusterCollector {
	return &ClusterCollector{
		src: src,
		brokers: prometheus.NewDesc("walden_brokers",
			"Registered brokers by state (alive, suspect, failed, recovering, recovered, maintenance), from the replicated state: the same on every member.",
			[]string{"state"}, nil),
		cooldown: prometheus.NewDesc("walden_brokers_cooldown_blocked",
			"Brokers that looked failed again within the cooldown after a recovery: their automatic failover waits for `waldenctl ack`.", nil, nil),
		failovers: prometheus.NewDesc("walden_failovers_total",
			"Failover decisions applied to brokers (automatic and manual), from the replicated state: the same on every member.", nil, nil),
		jobs: prometheus.NewDesc("walden_recovery_jobs",
			"Recovery jobs by state (pending, running, succeeded, failed, cancelled, blocked), from the replicated state: the same on every member.",
			[]string{"state"}, nil),
		observations: prometheus.NewDesc("walden_observations",
			"This member's current observations of the registered brokers, by state (alive, suspect, dead).",
			[]string{"state"}, nil),
		gossip: prometheus.NewDesc("walden_gossip_members",
			"Members of this member's gossip pool by role (coordinator, agent) and state (alive, dead, left), itself included.",
			[]string{"role", "state"}, nil),
		isLeader: prometheus.NewDesc("walden_raft_is_leader",
			"1 while this member is the raft leader, else 0.", nil, nil),
		voters: prometheus.NewDesc("walden_raft_voters",
			"Voters in the raft configuration as this member knows it.", nil, nil),
		reachable: prometheus.NewDesc("walden_raft_voters_reachable",
			"Voters this member's raft transport reaches, itself included. A quorum needs more than half of walden_raft_voters.", nil, nil),
		fingerprint: prometheus.NewDesc("walden_policy_fingerprint",
			"A number that identifies the policy: section of this member's configuration file. Members that show different values have configuration drift (waldenctl policy get shows the policy the cluster runs).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ClusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.brokers, c.cooldown, c.failovers, c.jobs, c.observations, c.gossip,
		c.isLeader, c.voters, c.reachable, c.fingerprint} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *ClusterCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if c.src.Brokers != nil {
		brokers := c.src.Brokers()
		byState := zeroCounts(BrokerStates)
		obs := zeroCounts(ObservationStates)
		var cooldown, failovers float64
		for _, b := range brokers {
			byState[bounded(b.GetBrokerState().Name(), BrokerStates)]++
			if b.GetCooldownBlocked() {
				cooldown++
			}
			failovers += float64(b.GetFailovers())
			for _, o := range b.GetObservations() {
				// Observations of an earlier epoch, or of a broker failed
				// over (fenced) since, are history, not a current view:
				// counted, a failed-over broker stayed "suspect" for good.
				if o.GetObserverId() == c.src.NodeID && o.GetEpoch() == b.GetEpoch() && !b.GetFenced() {
					obs[bounded(o.GetObservationState().Name(), ObservationStates)]++
				}
			}
		}
		emit(byState, func(s string, v float64) { gauge(c.brokers, v, s) })
		emit(obs, func(s string, v float64) { gauge(c.observations, v, s) })
		gauge(c.cooldown, cooldown)
		ch <- prometheus.MustNewConstMetric(c.failovers, prometheus.CounterValue, failovers)
	}
	if c.src.Jobs != nil {
		byState := zeroCounts(JobStates)
		for _, j := range c.src.Jobs() {
			byState[bounded(j.GetJobState().Name(), JobStates)]++
		}
		emit(byState, func(s string, v float64) { gauge(c.jobs, v, s) })
	}
	if c.src.Gossip != nil {
		counts := map[[2]string]float64{}
		for _, r := range GossipRoles {
			for _, s := range GossipStates {
				counts[[2]string{r, s}] = 0
			}
		}
		for _, m := range c.src.Gossip() {
			counts[[2]string{bounded(m.Role, GossipRoles), bounded(m.State, GossipStates)}]++
		}
		for k, v := range counts {
			gauge(c.gossip, v, k[0], k[1])
		}
	}
	if c.src.Raft != nil {
		r := c.src.Raft()
		leader := 0.0
		if r.Leader {
			leader = 1
		}
		gauge(c.isLeader, leader)
		gauge(c.voters, float64(r.Voters))
		gauge(c.reachable, float64(r.Reachable))
	}
	if c.src.Policy != nil {
		gauge(c.fingerprint, PolicyFingerprint(c.src.Policy()))
	}
}

// PolicyFingerprint is a number (below 2^52, exact as a float) that
// identifies p: equal policies give equal numbers.
func PolicyFingerprint(p *waldenv1.Policy) float64 {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	h := fnv.New64a()
	_, _ = h.Write(b)
	return float64(h.Sum64() & (1<<52 - 1))
}

func zeroCounts(values []string) map[string]float64 {
	m := make(map[string]float64, len(values)+1)
	for _, v := range values {
		m[v] = 0
	}
	return m
}

// emit reports counts, dropping "other" when it is zero.
func emit(counts map[string]float64, f func(string, float64)) {
	for k, v := range counts {
		if k == other && v == 0 {
			continue
		}
		f(k, v)
	}
}
