// Package metrics defines the Prometheus series that explain failovers, on
// coordinators, agents and brokers: their names, units, help texts and
// labels, in one place, so that the dashboards and alert rules under deploy/
// and docs/operating.md can be checked against it.
//
// The series come in three kinds:
//   - collected at scrape time from what a process already knows (the
//     replicated state of a coordinator, an agent's lease, a broker's status,
//     the raft node's view of its members): ClusterCollector,
//     AgentCollector, BrokerCollector;
//   - observed when something finishes (a failover's phases, a recovery
//     step, an upload): FailoverWatcher, Recovery;
//   - counted by the lease protocol and the failover decision: Decisions
//     (nil-safe methods, so that a component without metrics passes nil).
//
// Every label takes its values from a fixed list (states, steps, phases,
// gates, reasons, results) or names a coordinator; an unexpected value is
// counted as "other". Names follow Prometheus' conventions: a walden_
// prefix, base units (seconds, bytes), _total on counters.
//
// What it must never do: import server or cmd, change what it reads, or
// block the code it observes (every method returns at once).
package metrics
