package connlimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// GRPC bounds one gRPC listener. Zero values are not defaults: a
// configuration starts from Defaults and Validate refuses what is out of
// bounds.
type GRPC struct {
	// MaxConns bounds the connections open at once: once reached, the
	// listener accepts no more until one closes (the next ones wait in the
	// kernel's accept queue).
	MaxConns int `yaml:"max_conns"`
	// MaxConnsPerSource bounds the connections open at once from one
	// source address; further ones are closed at once.
	MaxConnsPerSource int `yaml:"max_conns_per_source"`
	// HandshakeTimeout bounds the TLS handshake and the HTTP/2 preface of
	// a new connection; a connection that has not finished them by then is
	// closed.
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// MaxConcurrentStreams bounds the calls in flight on one connection;
	// a client waits for a slot beyond it.
	MaxConcurrentStreams uint32 `yaml:"max_concurrent_streams"`
	// KeepaliveMinTime is the shortest interval between a client's
	// keepalive pings; a client that pings more often is disconnected
	// (GOAWAY "too_many_pings").
	KeepaliveMinTime time.Duration `yaml:"keepalive_min_time"`
	// MaxConnectionIdle closes a connection without a call for that long
	// (0: never).
	MaxConnectionIdle time.Duration `yaml:"max_connection_idle"`
}

// The listeners whose defaults Defaults knows.
const (
	// Admin is a coordinator's admin listener (listen.admin): agents,
	// brokers, operators and the other members' forwarded calls.
	Admin = "admin"
	// Raft is a coordinator's raft listener (listen.raft): the other
	// members only.
	Raft = "raft"
	// BrokerAPI is a broker's data API (walden broker's listen): producers
	// and readers.
	BrokerAPI = "broker_api"
)

// Defaults returns the safe defaults of a listener: thousands of agents
// and brokers on the admin listener (hundreds of them may share a host),
// a handful of peers on the raft listener.
func Defaults(listener string) GRPC {
	switch listener {
	case Raft:
		return GRPC{MaxConns: 256, MaxConnsPerSource: 32, HandshakeTimeout: 10 * time.Second, MaxConcurrentStreams: 100,
			KeepaliveMinTime: 5 * time.Second}
	default:
		return GRPC{MaxConns: 4096, MaxConnsPerSource: 512, HandshakeTimeout: 10 * time.Second, MaxConcurrentStreams: 1000,
			KeepaliveMinTime: 30 * time.Second, MaxConnectionIdle: 30 * time.Minute}
	}
}

// Upper bounds of the keys.
const (
	MaxConnsLimit       = 1_000_000
	MaxHandshakeTimeout = 5 * time.Minute
	MaxStreamsLimit     = 100_000
	MaxKeepaliveMinTime = time.Hour
)

// KeyError names the key of a GRPC that is out of bounds.
type KeyError struct {
	Key    string
	Reason string
}

func (e *KeyError) Error() string { return e.Key + ": " + e.Reason }

// Validate reports the first key out of bounds as a *KeyError.
func (g GRPC) Validate() error {
	if err := CheckConns(g.MaxConns, g.MaxConnsPerSource); err != nil {
		return err
	}
	switch {
	case g.HandshakeTimeout < 100*time.Millisecond || g.HandshakeTimeout > MaxHandshakeTimeout:
		return &KeyError{"handshake_timeout", fmt.Sprintf("must be from 100ms to %s, got %s", MaxHandshakeTimeout, g.HandshakeTimeout)}
	case g.MaxConcurrentStreams < 1 || g.MaxConcurrentStreams > MaxStreamsLimit:
		return &KeyError{"max_concurrent_streams", fmt.Sprintf("must be from 1 to %d, got %d", MaxStreamsLimit, g.MaxConcurrentStreams)}
	case g.KeepaliveMinTime < time.Second || g.KeepaliveMinTime > MaxKeepaliveMinTime:
		return &KeyError{"keepalive_min_time", fmt.Sprintf("must be from 1s to %s, got %s", MaxKeepaliveMinTime, g.KeepaliveMinTime)}
	case g.MaxConnectionIdle != 0 && (g.MaxConnectionIdle < time.Second || g.MaxConnectionIdle > 30*24*time.Hour):
		return &KeyError{"max_connection_idle", fmt.Sprintf("must be 0 (never) or from 1s to 720h, got %s", g.MaxConnectionIdle)}
	}
	return nil
}

// CheckConns checks a listener's max_conns and max_conns_per_source.
func CheckConns(maxConns, perSource int) error {
	switch {
	case maxConns < 1 || maxConns > MaxConnsLimit:
		return &KeyError{"max_conns", fmt.Sprintf("must be from 1 to %d, got %d", MaxConnsLimit, maxConns)}
	case perSource < 1 || perSource > maxConns:
		return &KeyError{"max_conns_per_source", fmt.Sprintf("must be from 1 to max_conns (%d), got %d", maxConns, perSource)}
	}
	return nil
}

// Metrics counts what the listeners of one process refused. A nil
// *Metrics counts nothing.
type Metrics struct {
	open      *prometheus.GaugeVec
	accepted  *prometheus.CounterVec
	refused   *prometheus.CounterVec
	full      *prometheus.CounterVec
	handshake *prometheus.CounterVec
	calls     *prometheus.GaugeVec
}

// NewMetrics returns the listeners' series; register Collectors.
func NewMetrics() *Metrics {
	return &Metrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walden_listener_connections",
			Help: "Connections open on the listener (the connection limits bound them)."}, []string{"listener"}),
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walden_listener_accepted_connections_total",
			Help: "Connections the listener accepted and handed to its server."}, []string{"listener"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walden_listener_refused_connections_total",
			Help: "Connections the listener closed at once: from a source address that already had max_conns_per_source open."}, []string{"listener", "reason"}),
		full: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walden_listener_full_total",
			Help: "Times the listener had max_conns connections open and stopped accepting until one closed (the next ones waited in the kernel's accept queue)."}, []string{"listener"}),
		handshake: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walden_listener_handshake_failures_total",
			Help: "TLS handshakes the listener's server refused, by reason (timeout: not finished within handshake_timeout; no_certificate, unknown_ca, expired, not_tls, ...)."}, []string{"listener", "reason"}),
		calls: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walden_listener_calls_in_flight",
			Help: "gRPC calls in flight on the listener (max_concurrent_streams bounds them per connection)."}, []string{"listener"}),
	}
}

// Collectors are the series to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.open, m.accepted, m.refused, m.full, m.handshake, m.calls}
}

// Open returns the connections open on listener now (for tests and
// status).
func (m *Metrics) Open(listener string) float64 {
	if m == nil {
		return 0
	}
	return gaugeValue(m.open.WithLabelValues(listener))
}

// Accepted returns the connections listener accepted so far.
func (m *Metrics) Accepted(listener string) float64 {
	if m == nil {
		return 0
	}
	return counterValue(m.accepted.WithLabelValues(listener))
}

// Refused returns the connections listener refused for reason so far.
func (m *Metrics) Refused(listener, reason string) float64 {
	if m == nil {
		return 0
	}
	return counterValue(m.refused.WithLabelValues(listener, reason))
}

// HandshakeFailures returns the handshakes listener's server refused for
// reason so far.
func (m *Metrics) HandshakeFailures(listener, reason string) float64 {
	if m == nil {
		return 0
	}
	return counterValue(m.handshake.WithLabelValues(listener, reason))
}

// Listener bounds ln: at most maxConns connections open at once (Accept
// waits for one to close beyond it, the next connections waiting in the
// kernel's accept queue), and at most perSource from one source address
// (further ones are closed at once). listener names it in the metrics.
func (m *Metrics) Listener(ln net.Listener, listener string, maxConns, perSource int) net.Listener {
	return &boundedListener{Listener: ln, m: m, name: listener, slots: make(chan struct{}, maxConns), perSource: perSource,
		bySource: map[string]int{}, done: make(chan struct{})}
}

type boundedListener struct {
	net.Listener
	m         *Metrics
	name      string
	slots     chan struct{}
	perSource int
	mu        sync.Mutex
	bySource  map[string]int
	closeOnce sync.Once
	done      chan struct{}
}

func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		select {
		case l.slots <- struct{}{}:
		default:
			if l.m != nil {
				l.m.full.WithLabelValues(l.name).Inc()
			}
			select {
			case l.slots <- struct{}{}:
			case <-l.done:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		src := sourceOf(c.RemoteAddr())
		l.mu.Lock()
		if l.bySource[src] >= l.perSource {
			l.mu.Unlock()
			c.Close()
			<-l.slots
			if l.m != nil {
				l.m.refused.WithLabelValues(l.name, "max_conns_per_source").Inc()
			}
			continue
		}
		l.bySource[src]++
		l.mu.Unlock()
		if l.m != nil {
			l.m.open.WithLabelValues(l.name).Inc()
			l.m.accepted.WithLabelValues(l.name).Inc()
		}
		return &boundedConn{Conn: c, l: l, src: src}, nil
	}
}

func (l *boundedListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

func (l *boundedListener) release(src string) {
	l.mu.Lock()
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
	l.mu.Unlock()
	<-l.slots
	if l.m != nil {
		l.m.open.WithLabelValues(l.name).Dec()
	}
}

// sourceOf is the source address a connection counts against: its IP.
func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

type boundedConn struct {
	net.Conn
	l      *boundedListener
	src    string
	closed atomic.Bool
}

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.l.release(c.src)
	}
	return err
}

// ServerOptions are the options of a gRPC server of listener bounded by g:
// the handshake timeout, the streams per connection, keepalive
// enforcement and the idle limit, and the count of calls in flight.
func (m *Metrics) ServerOptions(listener string, g GRPC) []grpc.ServerOption {
	kp := keepalive.ServerParameters{}
	if g.MaxConnectionIdle > 0 {
		kp.MaxConnectionIdle = g.MaxConnectionIdle
	}
	opts := []grpc.ServerOption{
		grpc.ConnectionTimeout(g.HandshakeTimeout),
		grpc.MaxConcurrentStreams(g.MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: g.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(kp),
	}
	if m != nil {
		calls := m.calls.WithLabelValues(listener)
		opts = append(opts,
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				calls.Inc()
				defer calls.Dec()
				return h(ctx, req)
			}),
			grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				calls.Inc()
				defer calls.Dec()
				return h(srv, ss)
			}))
	}
	return opts
}

// Creds wraps the server credentials of listener: a refused TLS handshake
// is counted by its reason and logged, at most one line a second per
// listener (with how many were not logged since), so that a flood of
// connections without a certificate cannot flood the log.
func (m *Metrics) Creds(listener string, c credentials.TransportCredentials, logger *slog.Logger) credentials.TransportCredentials {
	if c.Info().SecurityProtocol != "tls" {
		return c
	}
	return &countingCreds{TransportCredentials: c, m: m, name: listener, log: NewRateLog(logger)}
}

type countingCreds struct {
	credentials.TransportCredentials
	m    *Metrics
	name string
	log  *RateLog
}

// RateLog writes warnings at most one line a second, saying how many it
// left out (not_logged_since), so that a flood of bad connections cannot
// flood the log.
type RateLog struct {
	log    *slog.Logger
	mu     sync.Mutex
	last   time.Time
	muted  int
	inited bool
}

func (c *countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		reason := refusalReason(err)
		if c.m != nil {
			c.m.handshake.WithLabelValues(c.name, reason).Inc()
		}
		c.log.Warn("TLS handshake refused", "listener", c.name, "reason", reason, "err", err)
	}
	return conn, info, err
}

func (c *countingCreds) Clone() credentials.TransportCredentials {
	return &countingCreds{TransportCredentials: c.TransportCredentials.Clone(), m: c.m, name: c.name, log: c.log}
}

// refusalReason names why a handshake failed, for the metrics.
func refusalReason(err error) string {
	var named interface{ RefusalReason() string } // *mtls.PeerError
	var ne net.Error
	switch {
	case errors.As(err, &named) && named.RefusalReason() != "":
		return named.RefusalReason()
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "other"
}

// NewRateLog writes to logger (nil discards).
func NewRateLog(logger *slog.Logger) *RateLog {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &RateLog{log: logger}
}

// Warn writes msg with args at warn, unless a line was written less than a
// second ago.
func (r *RateLog) Warn(msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if r.inited && now.Sub(r.last) < time.Second {
		r.muted++
		r.mu.Unlock()
		return
	}
	r.last, r.inited = now, true
	muted := r.muted
	r.muted = 0
	r.mu.Unlock()
	r.log.Warn(msg, append(args, "not_logged_since", muted)...)
}
