// Package testutil is what walden's tests share: listeners bound on port 0
// and handed over whole (no port is ever guessed and freed, so none can be
// taken between the test's choice and its use), waits with a deadline
// instead of single-instant assertions, floods of idle connections held by
// helper processes (the test binary run again: see NewFlood). It imports
// nothing of walden's, so
// the tests of every package can use it; certificates of a test CA are in
// the sub-package testpki.
//
// Only tests import it.
package testutil
