package mtls

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/credentials"

	"walden/authz"
	"walden/config"
)

// ErrReloadToggle refuses a reload that would turn TLS on or off: the
// listeners and peers of a running process cannot change that.
var ErrReloadToggle = errors.New("turning TLS on or off needs a restart")

// Reloader serves the TLS settings of its last successful load to every new
// connection, so that a process can replace its certificate, key and CA
// file (rotation) without restarting its listeners. A reload that fails
// keeps the previous settings; connections already established keep the
// settings they were made with.
//
// It wraps whatever its load function builds (normally Load of the
// process's tls section), so every check that function sets up applies to
// the reloaded settings as well.
type Reloader struct {
	load func() (Configs, error)
	cur  atomic.Pointer[Configs]
}

// NewReloader loads the settings once. With TLS off (load returns empty
// Configs) every connection is plain.
func NewReloader(load func() (Configs, error)) (*Reloader, error) {
	r := &Reloader{load: load}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload loads the settings again; on success every new connection uses
// them. On an error nothing changes.
func (r *Reloader) Reload() error {
	c, err := r.load()
	if err != nil {
		return err
	}
	if old := r.cur.Load(); old != nil && (old.Server == nil) != (c.Server == nil) {
		return ErrReloadToggle
	}
	r.cur.Store(&c)
	return nil
}

// Files is the Reloader of a process's tls section, for a process that
// reads its configuration file again at SIGHUP (certificate rotation):
// ReloadFiles takes the section of the new file and reads the files it
// names; every new connection then uses them. A reload that fails changes
// nothing: the files in use stay, and so does the section they came from.
// Coordinators and agents hold one each.
type Files struct {
	*Reloader
	mu      sync.Mutex
	section config.TLS // what the Reloader's loads read
}

// LoadFiles reads the files c names (every connection plain when TLS is
// off).
func LoadFiles(c config.TLS) (*Files, error) {
	f := &Files{section: c}
	r, err := NewReloader(func() (Configs, error) { return Load(f.Section()) })
	if err != nil {
		return nil, err
	}
	f.Reloader = r
	return f, nil
}

// ReloadFiles reads the files c names; on success every new connection
// uses them. On an error nothing changes.
func (f *Files) ReloadFiles(c config.TLS) error {
	f.mu.Lock()
	old := f.section
	f.section = c
	f.mu.Unlock()
	if err := f.Reload(); err != nil {
		f.mu.Lock()
		f.section = old
		f.mu.Unlock()
		return err
	}
	return nil
}

// Section is the tls section of the files in use (after a successful
// load), or of the files being read (during one).
func (f *Files) Section() config.TLS {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.section
}

// Enabled reports whether TLS is on.
func (r *Reloader) Enabled() bool { return r.cur.Load().Server != nil }

// Current returns the settings in use now (nil fields when TLS is off).
func (r *Reloader) Current() Configs { return *r.cur.Load() }

// ServerConfig returns the configuration of a TLS listener that is not
// gRPC (tls.NewListener), nil when TLS is off. Each handshake gets a copy of
// the current server settings with nextProtos as its ALPN protocols.
func (r *Reloader) ServerConfig(nextProtos ...string) *tls.Config {
	if !r.Enabled() {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := r.cur.Load().Server.Clone()
			c.NextProtos = nextProtos
			return c, nil
		},
	}
}

// ServerCreds are the gRPC credentials of a listener: each handshake uses
// the current server settings; plain when TLS is off.
func (r *Reloader) ServerCreds() credentials.TransportCredentials {
	return r.ServerCredsWith()
}

// ServerCredsWith are ServerCreds whose handshakes offer the application
// protocols alpn besides gRPC's "h2", which comes first (a client that
// offers both speaks gRPC). The caller serves a connection that
// negotiated one of them (credentials.TLSInfo's NegotiatedProtocol).
func (r *Reloader) ServerCredsWith(alpn ...string) credentials.TransportCredentials {
	if !r.Enabled() {
		return Creds(nil)
	}
	if len(alpn) == 0 {
		return &reloadingCreds{r: r, side: func(c *Configs) *tls.Config { return c.Server }}
	}
	protos := append([]string{"h2"}, alpn...)
	return &reloadingCreds{r: r, side: func(c *Configs) *tls.Config {
		tc := c.Server.Clone()
		tc.NextProtos = protos
		return tc
	}}
}

// ClientCreds are the gRPC credentials of connections to other members:
// each handshake presents the current certificate and checks the server
// against the current CA pool and its role (coordinator); plain when TLS
// is off.
func (r *Reloader) ClientCreds() credentials.TransportCredentials {
	if !r.Enabled() {
		return Creds(nil)
	}
	return &reloadingCreds{r: r, side: func(c *Configs) *tls.Config { return c.Client }}
}

// reloadingCreds hands every handshake to gRPC's TLS credentials built from
// the Reloader's current settings.
type reloadingCreds struct {
	r          *Reloader
	side       func(*Configs) *tls.Config
	serverName string // OverrideServerName
}

func (c *reloadingCreds) now() credentials.TransportCredentials {
	tc := c.side(c.r.cur.Load())
	if c.serverName != "" {
		tc = tc.Clone()
		tc.ServerName = c.serverName
	}
	return explaining(tc, authz.RoleCoordinator)
}

func (c *reloadingCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.now().ClientHandshake(ctx, authority, conn)
}

func (c *reloadingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.now().ServerHandshake(conn)
}

func (c *reloadingCreds) Info() credentials.ProtocolInfo { return c.now().Info() }

func (c *reloadingCreds) Clone() credentials.TransportCredentials {
	cc := *c
	return &cc
}

// OverrideServerName is deprecated in gRPC but part of the interface.
func (c *reloadingCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
