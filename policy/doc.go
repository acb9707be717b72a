// Package policy owns walden's failover policy keys: their defaults, their
// config syntax (parse and format one key), the validation of a whole policy
// (with the key and the reason of every refusal), and the effective policy
// as defaults, then the config file, then the runtime overrides made through
// raft.
//
// It is pure: it must never read a clock, do I/O, or decide anything about a
// broker; it only says what the policy is.
package policy
