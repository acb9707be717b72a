// Package authz decides who may call what on a coordinator: the identities
// that mutual-TLS certificates carry (a name, one role, and for the agent
// and broker roles one broker id), the one table that says which roles may
// call each gRPC method, and the unary and stream server interceptors that
// enforce it.
//
// What it owns:
//   - the roles (coordinator, admin, operator, reader, agent, broker) and how
//     an identity is written into a certificate's subject and read back;
//   - the authorization table, keyed by full gRPC method name, default deny;
//   - the binding of agent and broker identities to their broker id (a
//     request's broker_id field must be theirs);
//   - the forwarded-caller metadata: a coordinator that forwards a call to
//     the leader names the original caller, and only a coordinator peer is
//     believed when it does;
//   - the identity in a handler's context, which events record as the actor.
//
// What it must never do: import the server, read files, or authorize
// anything from a value the peer chose (a header, a request field) unless
// the peer's certificate says it may. With TLS off there is no identity:
// every caller is Anonymous and allowed (that is what insecure means).
package authz
