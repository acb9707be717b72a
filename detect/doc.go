// Package detect decides when a broker has really failed. It owns the
// pieces of detection that run beside the replicated state, each described
// in docs/detection.md, with the invariants in DESIGN.md beside this file:
//
//   - Observer (every coordinator): probes each registered broker's agent,
//     folds in gossip's dead/left verdicts (SetGossip) and the lease
//     renewals its grantor heard, and proposes an ObserveBroker entry (alive,
//     suspect or dead, the silence, the attestation) only when its view
//     differs from its committed observation. It also carries this
//     coordinator's part of the quorum lease: once its grant for a broker
//     epoch is over, it promises durably (lease.Grantor) to grant that epoch
//     nothing more and attests lease_expired; it withdraws the attestation
//     when the broker renews with it again. Its probe history (record) is
//     kept apart from the pure judgement of a broker (judge: a list of rules
//     in order of precedence, so a new detection input is one rule and the
//     config key it reads).
//   - Grant and GrantAt (every voter): a coordinator's answer to a lease
//     renewal, from its applied state and its lease.Grantor only.
//   - Decide and Decider (the leader): Decide is a pure function of the
//     committed brokers and their observations, the policy, the voters and
//     what the leader remembers (Memory: when it first saw each committed
//     observation, the freeze); Decider is the thin loop that feeds it every
//     tick, seeds the policy of a new cluster, and proposes its DeclareFailed
//     and RecordEvent entries in its term. Decide runs three named steps:
//     the per-broker gates (gateBroker), the freeze (nextFreeze) and
//     admission (admit).
//
// It must never fence or change state by itself: every decision is a raft
// entry applied by package fsm, which checks the term and the attestations
// again and applies a DeclareFailed at most once per broker epoch. Silences,
// grants and attestations are durations on one process's boot clock, never
// wall-clock timestamps of two machines (the cooldown alone compares the
// leader's wall clock with recovery times carried in entries: minutes, so
// a skew of seconds is harmless). Gossip suggests; the leader decides from a
// quorum of observations and a majority of attestations.
package detect
