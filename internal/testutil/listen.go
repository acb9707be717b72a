package testutil

import (
	"net"
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

// Addrs returns n different addresses of host for a child process, which
// binds them itself. All n ports are held open until every one is picked,
// so no two are the same; a process of another program may still take one
// before the child binds it, which is why process tests use a loopback
// address of their own (127.0.x.y) where they can. Code that runs in the
// test's own process takes listeners (Listen) instead.
func Addrs(t testing.TB, host string, n int) []string {
	t.Helper()
	out := make([]string, 0, n)
	held := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("listen on %s:0 (is the loopback address configured?): %v", host, err)
		}
		held = append(held, l)
		out = append(out, l.Addr().String())
	}
	return out
}

// Addr is Addrs(t, host, 1)[0]. Several calls may return the same port:
// take several addresses of one process with Addrs.
func Addr(t testing.TB, host string) string {
	t.Helper()
	return Addrs(t, host, 1)[0]
}
