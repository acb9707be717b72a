package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Flood is a set of idle TCP connections held against a listener, as an
// attacker without a certificate would: connected, never speaking. They are
// held by helper processes (the test binary run again, up to 10,000
// connections each, fewer when RLIMIT_NOFILE is lower), so that the test process's own file descriptor limit
// is left to the listener under test: a flood of 20,000 needs no raised
// RLIMIT_NOFILE.
type Flood struct {
	procs []*floodProc
	// Held is the number of connections opened.
	Held int
	// Failed counts the connections that could not be opened (the
	// listener's kernel queue was full, or the attempt timed out).
	Failed int
	// Took is how long opening them took.
	Took time.Duration
	once sync.Once
}

type floodProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// floodPerProcess bounds the connections one helper process holds: at
// most 10,000, and below the RLIMIT_NOFILE the helpers inherit.
func floodPerProcess() int {
	per := 10_000
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err == nil && r.Cur < uint64(per)+256 {
		per = max(int(r.Cur)-256, 64)
	}
	return per
}

// floodEnv makes the test binary a flood helper (see init).
const floodEnv = "WALDEN_TESTUTIL_FLOOD"

func init() {
	if spec := os.Getenv(floodEnv); spec != "" {
		os.Exit(runFloodHelper(spec))
	}
}

// NewFlood opens n connections to addr from the loopback address src
// (127.0.0.2 and up, so that the test's own clients on 127.0.0.1 are
// another source), giving up after within, and holds them until Close (the
// test's cleanup closes them too).
func NewFlood(t testing.TB, addr, src string, n int, within time.Duration) *Flood {
	t.Helper()
	SkipFloodUnderRace(t)
	f, err := StartFlood(addr, src, n, within)
	t.Cleanup(f.Close)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// SkipFloodUnderRace skips a flood test under the race detector: tens of
// thousands of connections accepted and closed take minutes there, and a
// flood tests bounds, not data races (package connlimit's own tests run
// under it).
func SkipFloodUnderRace(t testing.TB) {
	t.Helper()
	if Race {
		t.Skip("a flood of idle connections under the race detector takes minutes; go test without -race runs it")
	}
}

// StartFlood is NewFlood for another goroutine than the test's: the caller
// closes the flood (also after an error).
func StartFlood(addr, src string, n int, within time.Duration) (*Flood, error) {
	f := &Flood{}
	start := time.Now()
	type report struct {
		held, failed int
		err          error
	}
	per := floodPerProcess()
	reports := make(chan report, n/per+1)
	for left := n; left > 0; left -= per {
		share := min(left, per)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%d,%d", floodEnv, addr, src, share, within.Milliseconds()))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return f, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return f, err
		}
		if err := cmd.Start(); err != nil {
			return f, fmt.Errorf("flood helper: %w", err)
		}
		f.procs = append(f.procs, &floodProc{cmd: cmd, stdin: stdin})
		go func() {
			line, err := bufio.NewReader(stdout).ReadString('\n')
			var r report
			if err == nil {
				_, err = fmt.Sscanf(line, "held %d failed %d", &r.held, &r.failed)
			}
			r.err = err
			reports <- r
		}()
	}
	timeout := time.After(within + 10*time.Second)
	for range f.procs {
		select {
		case r := <-reports:
			if r.err != nil {
				return f, fmt.Errorf("flood helper: %w", r.err)
			}
			f.Held += r.held
			f.Failed += r.failed
		case <-timeout:
			return f, fmt.Errorf("flood helpers did not report within %s", within)
		}
	}
	f.Took = time.Since(start)
	return f, nil
}

// Close ends the helpers, which close every connection.
func (f *Flood) Close() {
	f.once.Do(func() {
		for _, p := range f.procs {
			p.stdin.Close()
		}
		for _, p := range f.procs {
			done := make(chan struct{})
			go func() { _ = p.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = p.cmd.Process.Kill()
				<-done
			}
		}
	})
}

// ipBindAddressNoPort is Linux's IP_BIND_ADDRESS_NO_PORT: a socket bound
// to a source address gets its port when it connects (a search of the
// 4-tuples) rather than when it binds (a scan of every port in use, which
// slows each of 20,000 binds to a crawl).
const ipBindAddressNoPort = 24

func bindAddressNoPort(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	})
	if err != nil {
		return err
	}
	_ = serr // not Linux, or an old kernel: bind as usual
	return nil
}

// runFloodHelper opens the connections spec asks for
// ("addr,src,n,within_ms"), eight at a time, prints "held N failed M",
// and holds them until its stdin closes.
func runFloodHelper(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 4 {
		fmt.Fprintf(os.Stderr, "flood helper: bad spec %q\n", spec)
		return 2
	}
	addr, src := parts[0], parts[1]
	n, err1 := strconv.Atoi(parts[2])
	ms, err2 := strconv.Atoi(parts[3])
	if err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "flood helper: bad spec %q\n", spec)
		return 2
	}
	deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
	var mu sync.Mutex
	var conns []net.Conn
	failed := 0
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second, Control: bindAddressNoPort}
			for range next {
				var c net.Conn
				err := fmt.Errorf("out of time")
				if time.Now().Before(deadline) {
					c, err = d.Dial("tcp", addr)
				}
				mu.Lock()
				if err != nil {
					failed++
				} else {
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	fmt.Printf("held %d failed %d\n", len(conns), failed)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test ends the flood
	for _, c := range conns {
		c.Close()
	}
	return 0
}
