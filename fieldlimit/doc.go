// Package fieldlimit bounds the size of every string, repeated field and
// map of every request a coordinator accepts, before a handler sees it: a
// 3 MB wal.path would otherwise be stored in the replicated state and make
// every later answer that carries it too large to send (ResourceExhausted
// for everyone who lists brokers or jobs). It also bounds every duration
// and count of a request before any arithmetic is done with it: Millis and
// Count are the one helper every handler uses, and the interceptors refuse
// a duration (a field ending in _ms) that is negative or longer than 30
// days whatever the handler would do with it.
//
// What it owns: the limits (one default per kind, a few by field name)
// and a walk over any protobuf message that names the first field over
// its limit, as "wal.path" or "object.ranges[3].stream_id"; the gRPC
// interceptors that refuse such a request with InvalidArgument naming the
// field.
//
// What it must never do: import the server, or limit bytes fields (raft
// frames, records): the gRPC message size bounds those.
package fieldlimit
