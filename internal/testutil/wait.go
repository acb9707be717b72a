package testutil

import (
	"testing"
	"time"
)

// Poll is how often Eventually and EventuallyTrue check their condition.
const Poll = 10 * time.Millisecond

// Eventually checks cond every Poll until it returns nil, and fails the
// test with what and cond's last error when d has passed first. Deadlines
// are generous on purpose: a loaded 2-core machine may take many times the
// usual delay, and a condition that holds returns at once anyway.
func Eventually(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Wait(d, cond); err != nil {
		t.Fatalf("%s: not within %s: %v", what, d, err)
	}
}

// EventuallyTrue is Eventually for a condition without an explanation.
func EventuallyTrue(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !WaitTrue(d, cond) {
		t.Fatalf("%s: not within %s", what, d)
	}
}

// Wait checks cond every Poll until it returns nil (Wait returns nil) or d
// has passed (Wait returns cond's last error). It is Eventually for code
// that cannot fail the test itself, such as a helper goroutine.
func Wait(d time.Duration, cond func() error) error {
	end := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(end) {
			return err
		}
		time.Sleep(Poll)
	}
}

// WaitTrue is Wait for a condition without an explanation.
func WaitTrue(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(Poll)
	}
	return true
}
