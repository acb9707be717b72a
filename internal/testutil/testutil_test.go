package testutil_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
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

// cleanupTB records what GoroutinesEnd registers and reports, so a test
// can run the cleanup itself and see whether it failed.
type cleanupTB struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (c *cleanupTB) Helper()          {}
func (c *cleanupTB) Cleanup(f func()) { c.cleanups = append(c.cleanups, f) }
func (c *cleanupTB) Errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// parked blocks until release is closed; its name is what a report of a
// goroutine left running must show.
func parked(release chan struct{}, done chan struct{}) {
	defer close(done)
	<-release
}

func TestGoroutinesEnd(t *testing.T) {
	// A goroutine started before the call is not the test's.
	release, done := make(chan struct{}), make(chan struct{})
	go parked(release, done)
	defer func() { close(release); <-done }()
	tb := &cleanupTB{TB: t}
	testutil.GoroutinesEnd(tb, 50*time.Millisecond)
	tb.cleanups[0]()
	if len(tb.errs) != 0 {
		t.Fatalf("a goroutine started before the call reported: %s", tb.errs)
	}

	// One started after it and still running is reported, with its stack.
	tb = &cleanupTB{TB: t}
	testutil.GoroutinesEnd(tb, 50*time.Millisecond)
	release2, done2 := make(chan struct{}), make(chan struct{})
	go parked(release2, done2)
	defer func() { close(release2); <-done2 }()
	tb.cleanups[0]()
	if len(tb.errs) != 1 || !strings.Contains(tb.errs[0], "testutil_test.parked(") {
		t.Fatalf("a goroutine left running: reported %q", tb.errs)
	}

	// One that ends within the deadline is not.
	tb = &cleanupTB{TB: t}
	testutil.GoroutinesEnd(tb, 5*time.Second)
	release3, done3 := make(chan struct{}), make(chan struct{})
	go parked(release3, done3)
	time.AfterFunc(50*time.Millisecond, func() { close(release3) })
	tb.cleanups[0]()
	if len(tb.errs) != 0 {
		t.Fatalf("a goroutine that ended in time reported: %s", tb.errs)
	}
	<-done3
}
