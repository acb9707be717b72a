package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// The metadata a coordinator sets when it forwards a call to the leader:
// who the original caller is. Only a coordinator peer is believed.
const (
	MetadataCallerName     = "walden-caller-name"
	MetadataCallerRole     = "walden-caller-role"
	MetadataCallerBrokerID = "walden-caller-broker-id"
)

// Authorizer enforces the table on one gRPC server.
type Authorizer struct {
	// Secure is set when the server requires verified client certificates
	// (TLS on). Without it every caller is Anonymous and allowed.
	Secure bool
	// Logger receives one line per refusal; nil discards.
	Logger *slog.Logger
}

func (a *Authorizer) logger() *slog.Logger {
	if a.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Logger
}

// brokerScoped is a request that names the broker it acts for.
type brokerScoped interface{ GetBrokerId() string }

// Authorize decides whether the caller of ctx may call method with req (nil
// for a stream before its first message) and returns its identity, or a
// PermissionDenied (Unauthenticated without a verified certificate) status
// error naming the method and the identity.
func (a *Authorizer) Authorize(ctx context.Context, method string, req any) (Identity, error) {
	if !a.Secure {
		return Anonymous, nil
	}
	id, certified, err := identify(ctx)
	if err != nil {
		a.logger().WarnContext(ctx, "call refused: no usable identity", "method", method, "identity", id.Name, "peer", peerAddr(ctx), "err", err)
		reason := refusal.PermissionDenied
		if !certified {
			reason = refusal.Unauthenticated // no certificate at all
		}
		return id, refused(reason, id, method, fmt.Sprintf("%s; it may not call %s", err, method))
	}
	rule, ok := Lookup(method)
	if !ok {
		return id, a.refuse(ctx, id, method, fmt.Sprintf("%s may not call %s: the method is not in the authorization table (refused to everyone)", id, method))
	}
	if !rule.Allows(id.Role) {
		return id, a.refuse(ctx, id, method, fmt.Sprintf("%s may not call %s: it needs the role %s", id, method, roleList(rule.Roles)))
	}
	if req != nil {
		if err := a.checkBroker(ctx, id, method, rule, req); err != nil {
			return id, err
		}
		if err := a.checkFailover(ctx, id, method, req); err != nil {
			return id, err
		}
	}
	return id, nil
}

// failoverScoped is a request that may carry a recovery job's failover
// context (CommitObject, CloseStream, GetOpeningStreams).
type failoverScoped interface {
	GetFailover() *waldenv1.FailoverContext
}

// checkFailover refuses a failover context from anyone but a coordinator
// acting for itself: the context's token is the broker's epoch, which
// anyone who reads the registry knows, and its job id is predictable, so
// a fenced broker could otherwise commit or close its own streams in
// failover mode while its recovery runs. A coordinator's recovery proposes
// through raft and never sends one over the API.
func (a *Authorizer) checkFailover(ctx context.Context, id Identity, method string, req any) error {
	m, ok := req.(failoverScoped)
	if !ok || m.GetFailover() == nil || (id.Role == RoleCoordinator && id.Via == "") {
		return nil
	}
	return a.refuse(ctx, id, method, fmt.Sprintf("%s may not call %s with a failover context: only a coordinator's recovery job commits, closes or reads in failover mode", id, method))
}

// checkBroker refuses a request of a broker-bound identity for another
// broker.
func (a *Authorizer) checkBroker(ctx context.Context, id Identity, method string, rule Rule, req any) error {
	if !rule.BrokerBound || !id.Role.BrokerBound() {
		return nil
	}
	m, ok := req.(brokerScoped)
	if !ok {
		return a.refuse(ctx, id, method, fmt.Sprintf("%s may not call %s: its request names no broker id", id, method))
	}
	if got := m.GetBrokerId(); got != id.BrokerID {
		return a.refuse(ctx, id, method, fmt.Sprintf("%s may not call %s for broker %q: it acts for broker %s only", id, method, got, id.BrokerID))
	}
	return nil
}

func (a *Authorizer) refuse(ctx context.Context, id Identity, method, msg string) error {
	a.logger().WarnContext(ctx, "call refused", "method", method, "identity", id.Name, "role", string(id.Role),
		"broker_id", id.BrokerID, "via", id.Via, "peer", peerAddr(ctx))
	return refused(refusal.PermissionDenied, id, method, msg)
}

// refused is the PermissionDenied (or, without any certificate,
// Unauthenticated) status of a call: "permission denied: " and msg, with
// the method and the identity in its ErrorInfo.
func refused(reason refusal.Reason, id Identity, method, msg string) error {
	md := map[string]string{"method": method, "identity": id.Name, "role": string(id.Role)}
	if id.BrokerID != "" {
		md["broker_id"] = id.BrokerID
	}
	if id.Via != "" {
		md["via"] = id.Via
	}
	return rpcerr.NewPlain(reason, "permission denied: "+msg, md)
}

func roleList(roles []Role) string {
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = string(r)
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// identify reads the identity of the peer's verified certificate; a
// coordinator peer that names a forwarded caller stands for that caller.
// certified says whether the peer presented a verified certificate at all.
func identify(ctx context.Context) (_ Identity, certified bool, _ error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, false, errors.New("the caller is unknown")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return Identity{}, false, errors.New("the caller presented no verified client certificate")
	}
	id, err := FromCertificate(ti.State.VerifiedChains[0][0])
	if err != nil {
		var ie *IdentityError
		if errors.As(err, &ie) {
			err = fmt.Errorf("the certificate %q carries no walden identity: %s", ie.Name, ie.Reason)
			if ie.Name == "" {
				err = fmt.Errorf("the certificate has no common name (CN), which names a walden identity: %s", ie.Reason)
			}
		}
		return Identity{Name: id.Name}, true, err
	}
	if id.Role != RoleCoordinator {
		return id, true, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	name := md.Get(MetadataCallerName)
	if len(name) == 0 {
		return id, true, nil
	}
	caller := Identity{Name: name[0], Via: id.Name}
	if r := md.Get(MetadataCallerRole); len(r) > 0 {
		caller.Role = Role(r[0])
	}
	if b := md.Get(MetadataCallerBrokerID); len(b) > 0 {
		caller.BrokerID = b[0]
	}
	if err := caller.Validate(); err != nil {
		return Identity{Name: id.Name, Role: id.Role}, true, fmt.Errorf("coordinator %q forwarded a call of an invalid caller %q (%v)", id.Name, caller.Name, err)
	}
	return caller, true, nil
}

// UnaryInterceptor authorizes every unary call and puts the caller's
// identity into the handler's context.
func (a *Authorizer) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		id, err := a.Authorize(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		return handler(NewContext(ctx, id), req)
	}
}

// StreamInterceptor authorizes every stream when it opens, and each
// message a broker-bound identity sends on a broker-bound method; the
// stream's context carries the caller's identity.
func (a *Authorizer) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		id, err := a.Authorize(ctx, info.FullMethod, nil)
		if err != nil {
			return err
		}
		rule, _ := Lookup(info.FullMethod)
		return handler(srv, &authorizedStream{ServerStream: ss, ctx: NewContext(ctx, id), a: a, id: id, method: info.FullMethod, rule: rule})
	}
}

type authorizedStream struct {
	grpc.ServerStream
	ctx    context.Context
	a      *Authorizer
	id     Identity
	method string
	rule   Rule
}

func (s *authorizedStream) Context() context.Context { return s.ctx }

func (s *authorizedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !s.a.Secure {
		return nil
	}
	if err := s.a.checkBroker(s.ctx, s.id, s.method, s.rule, m); err != nil {
		return err
	}
	return s.a.checkFailover(s.ctx, s.id, s.method, m)
}

type ctxKey struct{}

// NewContext returns ctx carrying id.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity an interceptor put into ctx.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// Actor is the name events record for the caller of ctx: the identity's
// name, "anonymous" without TLS, "" when no interceptor ran.
func Actor(ctx context.Context) string {
	id, _ := FromContext(ctx)
	return id.Name
}

// CheckMember refuses a raft frame whose claimed sender is not the member
// whose certificate opened the stream (ctx is the stream's). Without TLS
// there is no certificate to compare with.
func CheckMember(ctx context.Context, memberID string) error {
	id, ok := FromContext(ctx)
	if !ok || id.IsAnonymous() {
		return nil
	}
	if id.Role != RoleCoordinator || id.Via != "" || id.Name != memberID {
		return refused(refusal.PermissionDenied, id, waldenv1.Raft_Stream_FullMethodName,
			fmt.Sprintf("%s may not send raft frames on %s as member %q: a member sends only as the id of its own certificate",
				id, waldenv1.Raft_Stream_FullMethodName, memberID))
	}
	return nil
}

// forward adds the caller of ctx to the outgoing metadata.
func forward(ctx context.Context) context.Context {
	id, ok := FromContext(ctx)
	if !ok || id.IsAnonymous() {
		return ctx
	}
	kv := []string{MetadataCallerName, id.Name, MetadataCallerRole, string(id.Role)}
	if id.BrokerID != "" {
		kv = append(kv, MetadataCallerBrokerID, id.BrokerID)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// ForwardUnary is the client interceptor of a coordinator's connections to
// the leader: a call made in the handler of another call names that call's
// caller, so that the leader authorizes the original caller and not the
// forwarding coordinator.
func ForwardUnary() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(forward(ctx), method, req, reply, cc, opts...)
	}
}

// ForwardStream is ForwardUnary for streams.
func ForwardStream() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(forward(ctx), desc, cc, method, opts...)
	}
}
