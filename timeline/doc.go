// Package timeline tells a failover as a sequence of phases: what each
// coordinator observed before the decision, the decision and its evidence,
// the fencing, the wait for the broker's lease, every step of the recovery
// job, and the reopening of the broker's streams on other brokers, each with
// its start, end and duration.
//
// It owns the derivation of a waldenv1.Failover from the replicated state
// (a recovery job, the event log of its broker) and nothing else: the web
// view draws the result as SVG and waldenctl prints it. It reads the
// events' typed fields (Event.detail); an event an older walden recorded
// without them is read from its message.
//
// It must never do I/O, read a clock (the caller passes "now" for phases
// still going on) or change what it is given; its times are the proposers'
// wall clocks, for display only — decisions never compare them.
package timeline
