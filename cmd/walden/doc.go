// Command walden runs every walden process — the coordinator (server), a
// broker's agent and its watchdog (agent), the reference broker (broker),
// the development S3 server (s3) and cluster-in-a-box (dev) — and the tools
// around them: certs, snapshot, wal, load and verify, automq (failover by
// hand, object inspection, the development AutoMQ controller), version.
// Each subcommand lives in its own file and registers itself on rootCmd in
// an init function.
package main
