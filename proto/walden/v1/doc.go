// Package waldenv1 is walden's wire and storage vocabulary: the messages of
// the gRPC API (cluster, agent, brokers, catalog, jobs, failovers,
// maintenance, watch, the brokers' data API), of the raft entries and of
// the replicated state's snapshots, generated from the .proto files beside
// this one by `make proto` (buf; proto-check fails on drift), and three
// hand-written files: names.go (the name people read of each named value of
// types.proto, defined once), legacy.go (the one conversion between those
// enums and the deprecated strings an older walden wrote and reads) and
// json.go (the JSON that waldenctl -o json and the web view print).
//
// It must never hold a decision or a default that belongs to a package that
// uses the messages, and a field, once released, is never renumbered or
// given another meaning: raft logs, snapshots and backups keep them.
package waldenv1
