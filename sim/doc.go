// Package sim is a deterministic simulation of walden's lease and failover
// decision protocol: coordinators, agents and an abstract raft group on
// simulated time, driven by one seeded random source, with leader changes,
// message delay and loss, link cuts, policy changes, clock-rate differences,
// host suspends, process stalls and restarts, replacements, a restore from
// a backup and a lost quorum forced into a new cluster. It runs the project's own
// state machine (package fsm), decision function and lease logic, and checks
// at every step that no agent holds a valid lease after the recovery may read
// its WAL, that no entry decided in one term is applied in another, that
// epochs only grow, and that no lease lapses while a majority of
// coordinators is healthy and reachable. A run is reproduced from its seed.
//
// It owns nothing outside the simulation: it never opens a socket or a
// file, and never reads the wall clock.
package sim
