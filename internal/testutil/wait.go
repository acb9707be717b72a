package testutil

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Poll is how often Eventually and EventuallyTrue check their condition.
const Poll = 10 * time.Millisecond

// Slack is the factor every wait of this package stretches its deadline by:
// 4 under the race detector, else 1; WALDEN_TEST_SLACK (a number) replaces
// it, for machines slower still. A condition that holds returns at once
// whatever the deadline, so slack costs only failing tests time.
func Slack() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("WALDEN_TEST_SLACK"), 64); err == nil && v > 0 {
		return v
	}
	return raceSlack
}

// Deadline is d stretched by Slack.
func Deadline(d time.Duration) time.Duration {
	return time.Duration(float64(d) * Slack())
}

// Eventually checks cond every Poll until it returns nil, and fails the
// test with what and cond's last error when d (stretched by Slack) has
// passed first. Give generous deadlines: a loaded 2-core machine may take
// many times the usual delay, and a condition that holds returns at once.
func Eventually(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Wait(d, cond); err != nil {
		t.Fatalf("%s: not within %s: %v", what, Deadline(d), err)
	}
}

// EventuallyTrue is Eventually for a condition without an explanation.
func EventuallyTrue(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !WaitTrue(d, cond) {
		t.Fatalf("%s: not within %s", what, Deadline(d))
	}
}

// Wait checks cond every Poll until it returns nil (Wait returns nil) or d
// has passed (Wait returns cond's last error); d is stretched by Slack. It
// is Eventually for code that cannot fail the test itself, such as a helper
// goroutine.
func Wait(d time.Duration, cond func() error) error {
	end := time.Now().Add(Deadline(d))
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
	end := time.Now().Add(Deadline(d))
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(Poll)
	}
	return true
}
