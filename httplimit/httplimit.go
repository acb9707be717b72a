package httplimit

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"walden/connlimit"
)

// Limits of one HTTP listener. Zero values take the defaults.
type Limits struct {
	// MaxConns bounds the connections open at once; further connections
	// wait in the kernel's accept queue until one closes. Default 1024.
	MaxConns int `yaml:"max_conns"`
	// MaxConnsPerSource bounds the connections open at once from one
	// source address; further ones are closed at once. Default 256 (at
	// most MaxConns).
	MaxConnsPerSource int `yaml:"max_conns_per_source"`
	// ReadHeaderTimeout bounds how long a client may take to send a
	// request's headers, and its TLS handshake before them. Default 5s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds reading a whole request. Default 30s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// IdleTimeout closes a keep-alive connection idle for this long.
	// Default 60s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes bounds a request's headers; larger ones are answered
	// 431. Default 64 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
}

// Defaults of Limits.
const (
	DefaultMaxConns          = 1024
	DefaultMaxConnsPerSource = 256
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
)

// Defaults are the limits of a coordinator's HTTP listeners, every key
// set.
func Defaults() Limits { return Limits{}.filled() }

// AgentDefaults are the limits of an agent's endpoint: its clients are one
// broker and the coordinators' probes, which send their headers at once and
// ask every second, so a few hundred connections, a short header time and a
// short idle time are plenty. A flood of connections then holds at most
// MaxConns file descriptors, each for a few seconds.
func AgentDefaults() Limits {
	return Limits{MaxConns: 256, MaxConnsPerSource: 64, ReadHeaderTimeout: 2 * time.Second, ReadTimeout: DefaultReadTimeout,
		IdleTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10}
}

// Validate reports the first key out of bounds as a *connlimit.KeyError
// (zero values take the defaults).
func (l Limits) Validate() error {
	f := l.filled()
	if err := connlimit.CheckConns(f.MaxConns, f.MaxConnsPerSource); err != nil {
		return err
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"read_header_timeout", l.ReadHeaderTimeout}, {"read_timeout", l.ReadTimeout}, {"idle_timeout", l.IdleTimeout}} {
		if d.v < 0 || d.v > connlimit.MaxHandshakeTimeout {
			return &connlimit.KeyError{Key: d.key, Reason: fmt.Sprintf("must be from 0 (the default) to %s, got %s", connlimit.MaxHandshakeTimeout, d.v)}
		}
	}
	if l.MaxHeaderBytes < 0 || l.MaxHeaderBytes > 1<<20 {
		return &connlimit.KeyError{Key: "max_header_bytes", Reason: fmt.Sprintf("must be from 0 (the default) to 1 MiB, got %d", l.MaxHeaderBytes)}
	}
	return nil
}

func (l Limits) filled() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxConnsPerSource <= 0 {
		l.MaxConnsPerSource = min(DefaultMaxConnsPerSource, l.MaxConns)
	}
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = DefaultReadTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return l
}

// Server returns an http.Server serving h within l; errorLog receives the
// server's own errors (nil: the standard logger).
func Server(h http.Handler, l Limits, errorLog *log.Logger) *http.Server {
	l = l.filled()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ErrorLog:          errorLog,
	}
}

// Listener bounds the connections of ln open at once to l.MaxConns, and
// from one source address to l.MaxConnsPerSource.
func Listener(ln net.Listener, l Limits) net.Listener {
	return ListenerWith(nil, "http", ln, l)
}

// ListenerWith is Listener counting in m (nil: nowhere) under the
// listener's name.
func ListenerWith(m *connlimit.Metrics, name string, ln net.Listener, l Limits) net.Listener {
	l = l.filled()
	return m.Listener(ln, name, l.MaxConns, l.MaxConnsPerSource)
}
