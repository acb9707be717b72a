package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// procInfo is what /proc says about one process.
type procInfo struct {
	// state is the one-letter state of /proc/PID/stat ('R', 'S', 'D',
	// 'T', 'Z', ...).
	state byte
	// pgid is its process group.
	pgid int
	// start is its start time in clock ticks since boot: with the pid, it
	// names one process (a pid is reused, never with the same start time).
	start uint64
}

// dead reports whether the process no longer runs any code: it exited
// and waits to be reaped (zombie) or is being torn down.
func (p procInfo) dead() bool { return p.state == 'Z' || p.state == 'X' || p.state == 'x' }

// errNoProcess means the pid names no process (any more).
var errNoProcess = errors.New("no such process")

// readProc reads /proc/PID/stat.
func readProc(pid int) (procInfo, error) {
	if pid <= 0 {
		return procInfo{}, errNoProcess
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return procInfo{}, errNoProcess
	}
	if err != nil {
		return procInfo{}, err
	}
	return parseProcStat(b)
}

// parseProcStat parses the content of /proc/PID/stat: "pid (comm) state
// ppid pgrp ..."; the command name may hold spaces and parentheses, so the
// fields are counted after the last ')'.
func parseProcStat(b []byte) (procInfo, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procInfo{}, fmt.Errorf("malformed /proc stat %q", b)
	}
	f := strings.Fields(string(b[i+2:]))
	// f[0] is field 3 (state), f[2] field 5 (pgrp), f[19] field 22
	// (starttime).
	if len(f) < 20 || len(f[0]) != 1 {
		return procInfo{}, fmt.Errorf("malformed /proc stat %q", b)
	}
	pgid, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procInfo{}, fmt.Errorf("malformed /proc stat %q", b)
	}
	return procInfo{state: f[0][0], pgid: pgid, start: start}, nil
}

// sameProcess reports whether pid still names the process that started at
// start and has not exited.
func sameProcess(pid int, start uint64) (bool, error) {
	p, err := readProc(pid)
	if errors.Is(err, errNoProcess) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return p.start == start && !p.dead(), nil
}

// killTarget sends sig to the broker: to its process group when it leads
// one that is neither ours nor our parent's (killing those would kill the
// agent), else to its pid alone. It says what it signalled.
func killTarget(pid, pgid int, sig unix.Signal) (string, error) {
	if pgid > 1 && pgid != unix.Getpgrp() && pgid != parentPgid() {
		if err := unix.Kill(-pgid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Sprintf("process group %d", pgid), err
		}
		return fmt.Sprintf("process group %d", pgid), nil
	}
	if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Sprintf("process %d", pid), err
	}
	return fmt.Sprintf("process %d", pid), nil
}

// parentPgid is the process group of our parent (0 when unknown).
func parentPgid() int {
	g, err := unix.Getpgid(unix.Getppid())
	if err != nil {
		return 0
	}
	return g
}

// waitExit waits until pid, which started at start, has exited (a zombie
// or gone), up to timeout, polling /proc. It reports whether it did.
func waitExit(pid int, start uint64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		alive, err := sameProcess(pid, start)
		if err == nil && !alive {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// readPIDFile reads a pid file: one positive decimal number, surrounding
// white space allowed.
func readPIDFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s does not hold a pid: %q", path, s)
	}
	return pid, nil
}
