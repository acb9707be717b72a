// Package server wires one walden coordinator member together: it opens the
// raft storage in data_dir (segment files and raft.db), builds the state
// machine and the raft node with its gRPC peer transport, and serves the
// admin gRPC API (walden.v1.Cluster, the gRPC health service, reflection)
// and HTTP (/metrics, /healthz, /readyz), with mutual TLS on every listener
// and client when the config asks for it.
//
// It owns the translation of node errors to gRPC codes and the forwarding of
// leader-only requests to the leader. It never touches data_dir before the
// configuration has been validated, never interprets raft entries (that is
// the state machine's job) and is imported by nothing but cmd.
package server
