// Package coordclient is how walden's clients reach the coordinator cluster,
// and the wire form of the leader hint that the coordinators send back.
//
// What it owns:
//   - Client: sending one call to the coordinators in turn — the member that
//     answered last first, then each configured endpoint — with a deadline
//     per attempt, moving on while a member answers Unavailable or times
//     out, and following the leader hint of a not-leader answer first;
//   - Conns: a set of client connections by address, dialled on first use;
//   - the leader hint: NotLeader writes it (an Unavailable status with an
//     errdetails.ErrorInfo of reason NOT_LEADER, and the walden-leader-id /
//     walden-leader-addr trailers), LeaderHint and LeaderAddr read it.
//
// What it must never do: decide anything for its callers (which codes are
// final, what a refusal means, how errors read to a user), keep state across
// calls other than the member that answered last, or import the server,
// the state machine or any feature package: agent, broker, loadgen,
// waldenctl and the server all depend on it.
package coordclient
