// Package chaos is walden's Jepsen-style harness: it runs a real cluster
// (versitygw as S3, three coordinators, three brokers) with every process in
// a network namespace of its own (package netns), puts load on every stream
// from a client namespace while recording each client operation (package
// history), injects one scenario's faults — links cut silently by
// nftables, loss and jitter from an NFQUEUE delayer (package netfault),
// SIGKILL, SIGSTOP and SIGCONT, S3 out of reach, a full disk — and then
// judges the run: `walden verify`'s ledger check (acknowledged, present,
// lost, duplicates), the history's linearizability (Porcupine), stale
// writes, false failovers, refusals for lack of lease, the longest wait of
// a producer and, for a broker cut off or killed, the time from the fault
// until its streams were open on other brokers.
//
// It reports what it measured and never bends a measure to a goal: a
// scenario's verdict lists every goal it missed. It owns the processes,
// namespaces, rules and file systems it creates, and removes them all at
// the end of each scenario, on failure and on SIGINT or SIGTERM.
package chaos
