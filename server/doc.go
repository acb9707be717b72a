// Package server wires one walden coordinator member together: it opens the
// raft log in data_dir (package raftlog: segment files and raft.db), builds
// the state machine and the raft node with its gRPC peer transport, and
// serves the admin gRPC API and HTTP (/metrics, /healthz, /readyz, the web
// view), with mutual TLS on every listener and client when the config asks
// for it.
//
// Where things are, by concern:
//   - server.go, options.go: New (options: listeners handed over, test
//     hooks), Run and Stop; lifecycle.go: leadership hand-off and reload.
//   - *_service.go: the gRPC services and nothing else — Cluster, Agent
//     (agent_renewals_service.go: the agents' renewal streams), Brokers,
//     Catalog, Jobs, Failovers, Maintenance, Watch.
//   - agent_renewal_frames.go: the agents' renewals over their own
//     connection on the admin port (renewframe), dispatched from the
//     listener's TLS handshake and answered as on the stream.
//   - services.go: serviceDeps, what the services share (the node, the
//     state, the lease grantor, the decider, the config's policy).
//   - forward.go: every call a follower forwards to the leader, and the
//     not-leader answer with its hint (Consul's ForwardRPC).
//   - errors.go: how node errors and refusals become gRPC statuses (the
//     refusal table itself is package rpcerr).
//   - consistency.go: linearizable and serializable reads.
//   - detection.go: failure detection's wiring (grantor, gossip, observer,
//     decider); recovery.go: the recovery runner's wiring.
//   - node.go: what the services need of the raft node (ClusterNode);
//     force_new_cluster.go: `walden server --force-new-cluster`, offline.
//   - grpc.go, http.go, tls.go, logger.go, metrics.go: transports, logs and
//     series; holds.go, failover_preview.go, webui_source.go,
//     maintenance_ttl.go: helpers of one service each.
//
// It never touches data_dir before the configuration has been validated,
// never interprets raft entries (that is the state machine's job) and is
// imported by nothing but cmd.
package server
