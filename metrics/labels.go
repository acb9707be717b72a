package metrics

import (
	"slices"

	waldenv1 "walden/proto/walden/v1"
)

// Label values. Each list is the complete set a label takes (plus "other").
var (
	// BrokerStates are the broker states of the API.
	BrokerStates = waldenv1.Names[waldenv1.BrokerState]()
	// JobStates are the recovery job states of the API.
	JobStates = waldenv1.Names[waldenv1.JobState]()
	// ObservationStates are a coordinator's views of a broker.
	ObservationStates = waldenv1.Names[waldenv1.ObservationState]()
	// GossipStates are the states of a gossip member.
	GossipStates = []string{"alive", "dead", "left"}
	// GossipRoles are the roles of gossip members.
	GossipRoles = []string{"coordinator", "agent"}
	// RecoverySteps are the executor's steps.
	RecoverySteps = waldenv1.Names[waldenv1.JobStep]()
	// StepResults are the outcomes of one run of a step.
	StepResults = []string{"ok", "error"}
	// FailoverPhases are the phases of a failover, in order: detect (from
	// the first coordinator's suspicion to the decision), fence, lease_wait
	// (for the broker's lease to run out), the recovery's steps, and reopen
	// (until the closed streams are open on other brokers).
	FailoverPhases = []string{"detect", "fence", "lease_wait", "attach", "read", "upload", "commit", "close", "detach", "reopen"}

	// LeaseResults are the answers to a lease renewal.
	LeaseResults = []string{"granted", "refused"}
	// LeaseRefusalReasons say why a coordinator refused a renewal: the
	// refusal's reason in lower case (node_fenced, epoch_expired,
	// unknown_node: the epoch is gone for good; lease_attested: this
	// coordinator attested the grant ran out; failover_requested;
	// lease_not_granted: not a voter, the quiet period after a start, the
	// lease state cannot be saved; policy_not_seeded), or unavailable (not
	// caught up).
	LeaseRefusalReasons = []string{"node_fenced", "epoch_expired", "unknown_node", "lease_attested", "failover_requested", "lease_not_granted", "policy_not_seeded", "unavailable", "invalid_argument"}
	// RenewalTransports are what an agent's renewal connection to a
	// coordinator travels over (the agents' renewals.transport values that
	// hold one open): frames, a connection of its own on the admin port;
	// stream, the gRPC stream Agent.RenewLeases.
	RenewalTransports = []string{"frames", "stream"}
	// AgentRenewalResults are the outcomes of one renewal with one
	// coordinator as the agent sees them: granted, refused (the coordinator
	// answered no) or failed (no answer in time).
	AgentRenewalResults = []string{"granted", "refused", "failed"}
	// DecisionOutcomes are what a failover decision the leader proposed
	// became: applied (failed_over), recorded only (dry_run), or refused by
	// the state machine (another term, not attested by a majority...).
	DecisionOutcomes = []string{"failed_over", "dry_run", "refused"}
	// DecisionReasons say why a decision was made.
	DecisionReasons = []string{"automatic", "manual"}
	// HoldGates are the conditions that hold a suspect broker back from a
	// failover (the decider's hold reasons).
	HoldGates = []string{"quorum", "timeout", "lease", "frozen", "max_concurrent_recoveries", "cooldown", "dry_run_done"}
)

// other is the label value of anything outside a list.
const other = "other"

// bounded returns v when it is in allowed, else "other".
func bounded(v string, allowed []string) string {
	if slices.Contains(allowed, v) {
		return v
	}
	return other
}
