// Package brokertest runs an in-process stand-in for the walden
// coordinators for tests of brokers, load and verify: one gRPC server with
// the Agent, Catalog and Brokers services over a package fsm state applied
// directly (no raft), plus hooks to fence a broker, finish its recovery and
// refuse lease renewals.
//
// It must never be used outside tests: it has no replication and no
// failure detection.
package brokertest
