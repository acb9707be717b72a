package testutil

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// GoroutinesEnd fails t unless every goroutine started after the call has
// ended within d (stretched by Slack) of the test's end. Call it before the
// test starts anything: its cleanup then runs after every cleanup
// registered later (servers, agents and floods stopped), and it reports the
// stack of each goroutine still running. Not for parallel tests: the
// goroutines of a test running beside it would count as its own.
func GoroutinesEnd(t testing.TB, d time.Duration) {
	t.Helper()
	before := map[int]bool{}
	for _, g := range goroutines() {
		before[g.id] = true
	}
	t.Cleanup(func() {
		var left []string
		_ = Wait(d, func() error {
			left = left[:0]
			for _, g := range goroutines() {
				if !before[g.id] {
					left = append(left, g.stack)
				}
			}
			if len(left) > 0 {
				return fmt.Errorf("%d goroutines running", len(left))
			}
			return nil
		})
		if len(left) > 0 {
			t.Errorf("%d goroutines the test started still run %s after it ended:\n\n%s",
				len(left), Deadline(d), strings.Join(left, "\n\n"))
		}
	})
}

type goroutine struct {
	id    int
	stack string
}

// goroutines returns every goroutine's id and stack.
func goroutines() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	for _, s := range bytes.Split(buf, []byte("\n\n")) {
		// "goroutine 35 [select]:"
		f := strings.Fields(string(s))
		if len(f) < 2 || f[0] != "goroutine" {
			continue
		}
		id, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		out = append(out, goroutine{id: id, stack: string(s)})
	}
	return out
}
