// Package detect decides when a broker has really failed: it owns the three
// pieces of DESIGN.md steps 1–3 that run beside the replicated state.
//
//   - Observer (every coordinator): derives alive / suspect / dead for each
//     registered broker from its own direct probe of the broker's agent and
//     from gossip's dead/left verdicts, and proposes an ObserveBroker entry
//     only when its view differs from its committed observation.
//   - LeaseTable (leader memory): when each broker's agent last renewed its
//     lease, on the leader's monotonic clock. A new leader grants every lease
//     a full TTL from its election.
//   - Decide and Decider (leader only): Decide is a pure function of the
//     committed brokers, the lease table, the policy and what the leader
//     remembers (when it saw each suspicion quorum form); Decider is the thin
//     loop that feeds it and proposes its DeclareFailed and RecordEvent
//     entries.
//
// It must never fence or change state by itself: every decision is a raft
// entry applied by package fsm, which applies a DeclareFailed at most once per
// broker epoch. It never compares wall-clock timestamps of two machines:
// durations are measured on one process's monotonic clock (time.Time values
// carrying their monotonic reading). Gossip suggests; the leader decides
// from a quorum of observations.
package detect
