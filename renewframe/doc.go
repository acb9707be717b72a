// Package renewframe is the wire format of renewals over their own
// connection: an agent that keeps one connection per coordinator for its
// lease renewals, and nothing else on it, sends each renewal as one frame
// and gets each answer as one frame, without the per-message work of a
// gRPC stream (HTTP/2 framing, flow control, three goroutines a
// connection on the coordinator).
//
// The connection is the admin listener's: under TLS the agent asks for
// the application protocol ALPN in its handshake (a coordinator that does
// not know it refuses the handshake, and the agent renews over gRPC);
// without TLS it opens the connection with Preface, which no HTTP/2
// client sends. Then each side writes frames: a 4-byte big-endian length
// and that many bytes of one protobuf message — walden.v1.RenewLeasesRequest
// from the agent (at most MaxRequest bytes), walden.v1.RenewLeasesResponse
// from the coordinator (at most MaxResponse), in the order of the
// requests. The messages and what they mean are those of the
// walden.v1.Agent/RenewLeases stream (docs/agent.md); the lease argument
// does not depend on the transport (docs/safety.md).
//
// A frame above its side's limit, a frame cut short, or bytes that are not
// the message end the connection: the reader reports them and reads
// nothing after them.
package renewframe
