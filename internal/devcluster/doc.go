// Package devcluster runs walden as real processes on loopback: an S3 server
// (versitygw in the tests, `walden s3` in `walden dev`), three coordinators
// (`walden server`) and brokers (`walden broker`), each a child process of
// the walden binary with its own config file and log file. Cluster starts,
// watches and kills them. `walden dev` is built on it, and so are the
// end-to-end tests in package e2e (kill -9 a broker under load, a SIGSTOPped
// zombie broker, killing the recovery's executor and the raft leader,
// restarting the killed broker) and the chaos harness. Options' Listen,
// Command, Dial and S3Command hooks let another harness place the same
// processes elsewhere (the chaos harness puts each in a network namespace
// of its own, with versitygw as the S3 child). With Options.Broker
// BrokerAutomq the brokers are AutoMQ-mode brokers, each started by its
// `walden agent` in watchdog mode (the agent is the child; it starts the
// broker), beside the development AutoMQ controller (`walden automq
// dev-controller`, the child "amq"), and the coordinators recover with
// recovery.action automq: `walden dev --broker automq`, the AutoMQ
// end-to-end tests and chaos scenarios.
//
// It owns the processes it starts and nothing else: it never edits a data
// directory or a WAL behind a process's back, never judges outcomes by
// timings (it measures them; the tests assert outcomes), and it kills every
// child it started when the cluster is closed (and, on Linux, when the parent
// dies).
package devcluster
