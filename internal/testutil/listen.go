package testutil

import (
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Listen binds host:0 (host is a loopback address) and returns the
// listener; it is closed when the test ends unless it was closed before.
// Hand it to the code under test instead of an address: the port stays the
// test's from the moment the kernel picked it.
func Listen(t testing.TB, host string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("listen on %s:0 (is the loopback address configured?): %v", host, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Addrs returns n different addresses of host for code that binds them
// itself (a child process, or memberlist, which binds UDP and TCP on one
// port). The ports are taken below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), which the kernel never hands to a bind
// of port 0 or to an outgoing connection: a port picked by binding port 0
// and closing it was taken again by another test's connection before the
// code bound it ("address already in use"). Each port is checked free for
// TCP and UDP and held until all n are picked, so no two are the same.
// Code that takes a listener takes Listen instead.
func Addrs(t testing.TB, host string, n int) []string {
	t.Helper()
	out := make([]string, 0, n)
	var held []io.Closer
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	low := ephemeralLow()
	for len(out) < n {
		addr, closers, err := pickPort(host, low)
		if err != nil {
			t.Fatalf("no free port on %s below %d (is the loopback address configured?): %v", host, low, err)
		}
		held = append(held, closers...)
		out = append(out, addr)
	}
	return out
}

// pickPort tries random ports below low until one binds for TCP and UDP on
// host; it returns the address and the sockets holding it.
func pickPort(host string, low int) (string, []io.Closer, error) {
	const attempts = 500
	floor := max(1024, low-12000)
	var last error
	for range attempts {
		addr := net.JoinHostPort(host, strconv.Itoa(floor+rand.IntN(low-floor)))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			last = err
			continue
		}
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			_ = l.Close()
			last = err
			continue
		}
		return addr, []io.Closer{l, pc}, nil
	}
	return "", nil, last
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 when
// it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= 2048 {
		return 32768
	}
	return low
}

// Addr is Addrs(t, host, 1)[0]. Several calls may return the same port:
// take several addresses of one process with Addrs.
func Addr(t testing.TB, host string) string {
	t.Helper()
	return Addrs(t, host, 1)[0]
}
