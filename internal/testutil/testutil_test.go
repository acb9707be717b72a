package testutil_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"walden/internal/testutil"
)

func TestListenHoldsThePort(t *testing.T) {
	l := testutil.Listen(t, "127.0.0.1")
	if _, err := net.Listen("tcp", l.Addr().String()); err == nil {
		t.Fatal("a second listener bound the port Listen holds")
	}
}

func TestAddrsAreDifferent(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range testutil.Addrs(t, "127.0.0.1", 50) {
		if seen[a] {
			t.Fatalf("%s returned twice", a)
		}
		seen[a] = true
	}
}

func TestWait(t *testing.T) {
	n := 0
	if err := testutil.Wait(5*time.Second, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Fatalf("Wait = %v after %d checks, want nil after 3", err, n)
	}
	last := errors.New("still not")
	if err := testutil.Wait(30*time.Millisecond, func() error { return last }); err != last {
		t.Fatalf("Wait past its deadline = %v, want the condition's last error", err)
	}
	if testutil.WaitTrue(30*time.Millisecond, func() bool { return false }) {
		t.Fatal("WaitTrue of a condition that never holds returned true")
	}
}
