package mtls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"walden/authz"
)

// ErrNoApplicationProtocol means the server refused the TLS handshake
// because it serves none of the application protocols the client asked
// for (its no_application_protocol alert).
var ErrNoApplicationProtocol = errors.New("the server does not serve the application protocol asked for")

// Client runs the TLS handshake of tc over raw, a connection dialled to a
// server of role at addr, bounded by ctx (tc.ServerName defaults to
// addr's host, as gRPC's credentials do). Its errors say who refused whom
// and why (*PeerError), as the gRPC credentials' do; a server that serves
// none of tc.NextProtos is ErrNoApplicationProtocol. The connection it
// returns explains the errors of its reads too: a TLS 1.3 server refuses
// the client's certificate only after the client's handshake is done, and
// the refusal arrives with the first read. On error raw is closed.
func Client(ctx context.Context, raw net.Conn, tc *tls.Config, role authz.Role, addr string) (net.Conn, tls.ConnectionState, error) {
	if tc.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		tc = tc.Clone()
		tc.ServerName = host
	}
	hasCert := len(tc.Certificates) > 0 || tc.GetClientCertificate != nil
	conn := tls.Client(raw, tc)
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		if alert, ok := remoteAlert(err); ok && alert == "tls: no application protocol" {
			return nil, tls.ConnectionState{}, fmt.Errorf("%s: %w", peerName(role, addr), ErrNoApplicationProtocol)
		}
		return nil, tls.ConnectionState{}, explainClient(err, role, addr, hasCert)
	}
	return &explainingConn{Conn: conn, role: role, addr: addr, hasCert: hasCert}, conn.ConnectionState(), nil
}

// explainingConn is a client's TLS connection whose read errors say who
// refused whom and why.
type explainingConn struct {
	net.Conn
	role    authz.Role
	addr    string
	hasCert bool
}

func (c *explainingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		if _, ok := remoteAlert(err); ok {
			err = explainClient(err, c.role, c.addr, c.hasCert)
		}
	}
	return n, err
}
