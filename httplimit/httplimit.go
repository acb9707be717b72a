package httplimit

import (
	"log"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits of one HTTP listener. Zero values take the defaults.
type Limits struct {
	// MaxConns bounds the connections open at once; further connections
	// wait in the kernel's accept queue until one closes. Default 1024.
	MaxConns int
	// ReadHeaderTimeout bounds how long a client may take to send a
	// request's headers. Default 5s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request. Default 30s.
	ReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle for this long.
	// Default 60s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers; larger ones are answered
	// 431. Default 64 KiB.
	MaxHeaderBytes int
}

// Defaults of Limits.
const (
	DefaultMaxConns          = 1024
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
)

func (l Limits) filled() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
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

// Listener bounds the connections of ln open at once to l.MaxConns.
func Listener(ln net.Listener, l Limits) net.Listener {
	return netutil.LimitListener(ln, l.filled().MaxConns)
}
