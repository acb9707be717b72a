package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"

	"walden/authz"
)

// Errors of a handshake, told as who refused whom.
var (
	// ErrPeerRefused means this side refused the other side's certificate
	// (matched by *PeerError).
	ErrPeerRefused = errors.New("certificate refused")
	// ErrRefusedByPeer means the other side refused this side's
	// certificate, or the lack of one (matched by *PeerError).
	ErrRefusedByPeer = errors.New("certificate refused by the peer")
)

// PeerError says which side of a TLS handshake refused whom, and why, in
// the terms of the person who reads it: "this client refused the
// coordinator at 10.0.0.5:7001: its certificate was not signed by the CA
// this client trusts (tls.ca_file)".
type PeerError struct {
	// Sentence is the whole message.
	Sentence string
	// Reason names the refusal for programs and metrics: unknown_ca,
	// host_name, expired, wrong_role, no_certificate, not_tls, timeout,
	// bad_certificate or unverified.
	Reason string
	// ByPeer is set when the other side refused this one.
	ByPeer bool
	// Err is what TLS said.
	Err error
}

func (e *PeerError) Error() string {
	if e.Err == nil {
		return e.Sentence
	}
	return e.Sentence + tlsSaid + e.Err.Error()
}

// tlsSaid separates a PeerError's sentence from what TLS said.
const tlsSaid = "; TLS said: "

// HandshakeSentence finds, in a message that carries a *PeerError's text
// (a gRPC status message, a log line), the sentence saying who refused
// whom and why, without TLS's own words.
func HandshakeSentence(msg string) (string, bool) {
	i := strings.Index(msg, "this client refused ")
	if j := strings.Index(msg, " refused this client"); j >= 0 && (i < 0 || j < i) {
		i = -1
		for _, who := range []string{"the coordinator at ", "the broker at ", "the server at "} {
			if k := strings.LastIndex(msg[:j], who); k >= 0 && k > i {
				i = k
			}
		}
	}
	if i < 0 {
		return "", false
	}
	s := strings.ReplaceAll(msg[i:], `\"`, `"`) // gRPC quotes a transport error's text
	if k := strings.Index(s, tlsSaid); k >= 0 {
		s = s[:k]
	}
	return strings.TrimRight(s, `" `), true
}

func (e *PeerError) Unwrap() error { return e.Err }

// RefusalReason is Reason (package connlimit counts refused handshakes by
// it without importing this package).
func (e *PeerError) RefusalReason() string { return e.Reason }

// Is makes errors.Is(err, ErrPeerRefused) or ErrRefusedByPeer true.
func (e *PeerError) Is(target error) bool {
	return (target == ErrRefusedByPeer && e.ByPeer) || (target == ErrPeerRefused && !e.ByPeer)
}

// roleMismatch is the error of RequireServerRole.
type roleMismatch struct {
	got    authz.Identity
	reason string // when the certificate carries no identity
	want   []authz.Role
}

func (e *roleMismatch) Error() string {
	want := make([]string, len(e.want))
	for i, r := range e.want {
		want[i] = string(r)
	}
	roles := strings.Join(want, " or ")
	if e.reason != "" {
		return fmt.Sprintf("its certificate %q carries no walden identity (%s), and only a %s certificate may answer here", e.got.Name, e.reason, roles)
	}
	return fmt.Sprintf("its certificate is %s, not a %s's: only a %s certificate may answer here (walden certs issue --role %s)",
		e.got, roles, roles, want[0])
}

// RequireServerRole is the VerifyConnection of a client's TLS
// configuration: once Go has verified the server's chain against the CA
// and the address dialed, the server's certificate must carry one of
// roles. Every broker certificate is valid for localhost, so without it
// any broker of a shared host could pose as a coordinator to the agents
// and operators there.
func RequireServerRole(roles ...authz.Role) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return &roleMismatch{want: roles, reason: "it presented none"}
		}
		id, err := authz.FromCertificate(cs.PeerCertificates[0])
		if err != nil {
			var ie *authz.IdentityError
			if errors.As(err, &ie) {
				return &roleMismatch{got: id, want: roles, reason: ie.Reason}
			}
			return err
		}
		if !slices.Contains(roles, id.Role) {
			return &roleMismatch{got: id, want: roles}
		}
		return nil
	}
}

// ForServerRole returns a copy of the client configuration c that
// requires the server's certificate to carry one of roles (the broker's
// data API: authz.RoleBroker) instead; nil stays nil (TLS off).
func ForServerRole(c *tls.Config, roles ...authz.Role) *tls.Config {
	if c == nil {
		return nil
	}
	c = c.Clone()
	c.VerifyConnection = RequireServerRole(roles...)
	return c
}

// peerName names the server of role at addr for people.
func peerName(role authz.Role, addr string) string {
	if role == "" {
		return "the server at " + addr
	}
	return fmt.Sprintf("the %s at %s", role, addr)
}

// explainClient turns the error of a client's handshake with the server
// at addr (whose certificate should carry role) into a *PeerError saying
// who refused whom and why; other errors are returned as they are.
// hasCert says whether the client has a certificate to present.
func explainClient(err error, role authz.Role, addr string, hasCert bool) error {
	if err == nil {
		return nil
	}
	var pe *PeerError
	if errors.As(err, &pe) {
		return err
	}
	peer := peerName(role, addr)
	refused := func(reason, format string, args ...any) error {
		return &PeerError{Sentence: "this client refused " + peer + ": " + fmt.Sprintf(format, args...), Reason: reason, Err: err}
	}
	var (
		rm  *roleMismatch
		ua  x509.UnknownAuthorityError
		he  x509.HostnameError
		ci  x509.CertificateInvalidError
		cve *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &rm):
		return &PeerError{Sentence: "this client refused " + peer + ": " + rm.Error(), Reason: "wrong_role"}
	case errors.As(err, &ua):
		return refused("unknown_ca", "its certificate was not signed by the CA this client trusts (tls.ca_file, or --cacert): it belongs to another cluster, or the CA file is another cluster's")
	case errors.As(err, &he):
		return refused("host_name", "its certificate is not valid for the address dialed (%s); issue one for it with walden certs issue --host", he.Host)
	case errors.As(err, &ci) && ci.Reason == x509.Expired:
		return refused("expired", "its certificate has expired or is not valid yet (check the clocks, or issue a new one)")
	case errors.As(err, &cve):
		return refused("unverified", "its certificate could not be verified")
	}
	if alert, ok := remoteAlert(err); ok {
		byPeer := func(reason, format string, args ...any) error {
			return &PeerError{Sentence: peer + " refused " + fmt.Sprintf(format, args...), Reason: reason, ByPeer: true, Err: err}
		}
		switch alert {
		case "tls: unknown certificate authority":
			return byPeer("unknown_ca", "this client's certificate: it was not signed by the CA %s trusts (tls.ca_file there): is this client's certificate (tls.cert_file, or --cert) one of this cluster's?", pronoun(role))
		case "tls: certificate required":
			if hasCert {
				// A client offers only a certificate of a CA the server
				// names as one it trusts.
				return byPeer("unknown_ca", "this client's certificate: it was not signed by the CA %s trusts (tls.ca_file there): is this client's certificate (tls.cert_file, or --cert) one of this cluster's?", pronoun(role))
			}
			return byPeer("no_certificate", "this client: it requires a client certificate signed by the cluster's CA (tls.cert_file and tls.key_file, or --cert and --key)")
		case "tls: expired certificate":
			return byPeer("expired", "this client's certificate: it has expired (or is not valid yet); issue a new one")
		case "tls: bad certificate", "tls: unsupported certificate", "tls: certificate revoked", "tls: unknown certificate":
			return byPeer("bad_certificate", "this client's certificate (%s)", strings.TrimPrefix(alert, "tls: "))
		}
	}
	return err
}

func pronoun(role authz.Role) string {
	if role == "" {
		return "the server"
	}
	return "the " + string(role)
}

// remoteAlert returns the text of the TLS alert the other side sent
// ("tls: unknown certificate authority"), if err is one.
func remoteAlert(err error) (string, bool) {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil {
		return op.Err.Error(), true
	}
	return "", false
}

// explainServer turns the error of a server's handshake with the client at
// addr into a *PeerError saying why this server refused it; other errors
// are returned as they are.
func explainServer(err error, addr string) error {
	if err == nil {
		return nil
	}
	client := "the client at " + addr
	refused := func(reason, format string, args ...any) error {
		return &PeerError{Sentence: "this server refused " + client + ": " + fmt.Sprintf(format, args...), Reason: reason, Err: err}
	}
	var (
		ua  x509.UnknownAuthorityError
		ci  x509.CertificateInvalidError
		rh  tls.RecordHeaderError
		cve *tls.CertificateVerificationError
		ne  net.Error
	)
	msg := err.Error()
	switch {
	case errors.As(err, &ua):
		return refused("unknown_ca", "its certificate was not signed by this cluster's CA (tls.ca_file)")
	case errors.As(err, &ci) && ci.Reason == x509.Expired:
		return refused("expired", "its certificate has expired or is not valid yet")
	case errors.As(err, &cve):
		return refused("unverified", "its certificate could not be verified")
	case strings.Contains(msg, "client didn't provide a certificate"):
		return refused("no_certificate", "it presented no certificate signed by this cluster's CA (tls.ca_file): none at all, or one of another CA, which a client does not offer")
	case errors.As(err, &rh):
		return refused("not_tls", "it does not speak TLS")
	case errors.As(err, &ne) && ne.Timeout():
		return refused("timeout", "it did not finish its TLS handshake in time")
	}
	if alert, ok := remoteAlert(err); ok {
		return &PeerError{Sentence: client + " refused this server's certificate (" + strings.TrimPrefix(alert, "tls: ") + ")", Reason: "bad_certificate", ByPeer: true, Err: err}
	}
	return err
}

// serverFirstWait bounds how long a client waits, after its TLS 1.3
// handshake, for the server's first bytes (a gRPC server sends its HTTP/2
// settings at once) before it hands the connection on.
const serverFirstWait = 3 * time.Second

// explainingCreds are the gRPC credentials of a client of a role's servers:
// a handshake error says who refused whom and why. With TLS 1.3 a server
// refuses the client's certificate only after the client's handshake is
// done, which gRPC then reported as "broken pipe" or "EOF": the client
// waits for the server's first bytes (at most serverFirstWait) so that
// such a refusal is a handshake error too.
type explainingCreds struct {
	credentials.TransportCredentials
	role    authz.Role
	hasCert bool
}

// explaining are the gRPC credentials of tc whose handshake errors say who
// refused whom and why; as a client's, they dial the servers of role
// (authz.RoleCoordinator, or RoleBroker for the data API).
func explaining(tc *tls.Config, role authz.Role) credentials.TransportCredentials {
	return &explainingCreds{TransportCredentials: credentials.NewTLS(tc), role: role,
		hasCert: len(tc.Certificates) > 0 || tc.GetClientCertificate != nil}
}

func (c *explainingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	addr := authority
	if raw.RemoteAddr() != nil {
		addr = raw.RemoteAddr().String()
	}
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, explainClient(err, c.role, addr, c.hasCert)
	}
	if ti, ok := info.(credentials.TLSInfo); ok && ti.State.Version == tls.VersionTLS13 {
		conn, err = awaitServer(ctx, conn)
		if err != nil {
			return nil, nil, explainClient(err, c.role, addr, c.hasCert)
		}
	}
	return conn, info, nil
}

func (c *explainingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		addr := ""
		if raw.RemoteAddr() != nil {
			addr = raw.RemoteAddr().String()
		}
		return nil, nil, explainServer(err, addr)
	}
	return conn, info, nil
}

func (c *explainingCreds) Clone() credentials.TransportCredentials {
	return &explainingCreds{TransportCredentials: c.TransportCredentials.Clone(), role: c.role, hasCert: c.hasCert}
}

// awaitServer reads the server's first byte (its refusal of this client's
// certificate arrives as an alert instead) and hands it on with the
// connection. When nothing comes within serverFirstWait, the connection
// is handed on as it is.
func awaitServer(ctx context.Context, conn net.Conn) (net.Conn, error) {
	deadline := time.Now().Add(serverFirstWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := conn.SetReadDeadline(deadline); err != nil {
		return conn, nil
	}
	var b [1]byte
	n, err := conn.Read(b[:])
	if rerr := conn.SetReadDeadline(time.Time{}); rerr != nil && err == nil {
		err = rerr
	}
	var ne net.Error
	switch {
	case n == 1:
		return &firstByteConn{Conn: conn, first: b[0], has: true}, nil
	case err == nil, errors.As(err, &ne) && ne.Timeout():
		return conn, nil
	}
	conn.Close()
	return nil, err
}

// firstByteConn gives back the byte awaitServer read before the rest.
type firstByteConn struct {
	net.Conn
	first byte
	has   bool
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	if c.has && len(p) > 0 {
		p[0], c.has = c.first, false
		return 1, nil
	}
	return c.Conn.Read(p)
}
