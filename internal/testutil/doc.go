// Package testutil is what walden's tests share: listeners bound on port 0
// and handed over whole (Listen: no port is guessed and freed, so none can
// be taken between the test's choice and its use), and for a child process
// that must bind its own address, ports checked free below the kernel's
// ephemeral range, which no port-0 bind or outgoing connection takes
// (Addrs); waits with a deadline instead of single-instant assertions;
// floods of idle connections held by helper processes (the test binary run
// again: see NewFlood); copies of data directories (CopyTree); checks of a
// generated region of a page; a check that every goroutine a test started
// has ended with it (GoroutinesEnd). It imports nothing of walden's, so the
// tests of every package can use it; certificates of a test CA are in the
// sub-package testpki.
//
// Only tests import it.
package testutil
