// Package procstat samples what Linux's /proc says of a process: its CPU
// time (utime + stime), its resident memory, and how long its threads ran
// and waited runnable for a CPU. The benchmarks of this module measure
// their child processes with it.
package procstat

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux configuration Go supports).
const clockTick = 10 * time.Millisecond

// Sample is what /proc says of one process at one instant.
type Sample struct {
	At       time.Time
	CPU      time.Duration // user + system
	RSS, HWM int64         // bytes
}

// Read samples process pid.
func Read(pid int) (Sample, error) {
	s := Sample{At: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	cpu, err := ParseStatCPU(b)
	if err != nil {
		return s, err
	}
	s.CPU = cpu
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	s.RSS, s.HWM = ParseStatusKB(st, "VmRSS:")*1024, ParseStatusKB(st, "VmHWM:")*1024
	return s, nil
}

// ParseStatCPU returns utime + stime of a /proc/PID/stat line. The command
// name (field 2) is in parentheses and may hold spaces: fields are counted
// from the last ')'.
func ParseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state is field 3, so utime (14) and stime (15) are at
	// indexes 11 and 12.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(u+s) * clockTick, nil
}

// ParseStatusKB returns the value in kB of the line of /proc/PID/status
// that starts with key (e.g. "VmRSS:"), 0 if there is none.
func ParseStatusKB(b []byte, key string) int64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				v, _ := strconv.ParseInt(f[0], 10, 64)
				return v
			}
		}
	}
	return 0
}

// Sched is how long a process's threads ran and waited runnable for a CPU
// and how many times they were put on one (their time slices: a thread
// that wakes, runs and sleeps again is one), from
// /proc/PID/task/*/schedstat, summed over the threads alive now.
type Sched struct {
	Run, Wait time.Duration
	Slices    int64
}

// ReadSched samples the scheduler statistics of process pid.
func ReadSched(pid int) Sched {
	var s Sched
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			continue
		}
		run, _ := strconv.ParseInt(f[0], 10, 64)
		wait, _ := strconv.ParseInt(f[1], 10, 64)
		slices, _ := strconv.ParseInt(f[2], 10, 64)
		s.Run += time.Duration(run)
		s.Wait += time.Duration(wait)
		s.Slices += slices
	}
	return s
}

// WaitPerRun is how long the process waited for a CPU per second it ran
// between two samples: above 1, it wanted the CPU more than it got it.
func WaitPerRun(a, b Sched) float64 {
	if b.Run <= a.Run {
		return 0
	}
	return float64(b.Wait-a.Wait) / float64(b.Run-a.Run)
}

// Cores is the CPU used between two samples, in cores.
func Cores(a, b Sample) float64 {
	wall := b.At.Sub(a.At)
	if wall <= 0 {
		return 0
	}
	return float64(b.CPU-a.CPU) / float64(wall)
}

// Loadavg returns the 1-minute load average, "n/a" if it cannot be read.
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "n/a"
	}
	return f[0]
}

// IO is what a process read and wrote through system calls
// (/proc/PID/io): the bytes (rchar, wchar, whatever the file: sockets,
// pipes, disks) and the number of read and write calls (syscr, syscw).
type IO struct {
	ReadBytes, WriteBytes int64
	ReadCalls, WriteCalls int64
}

// ReadIO samples the I/O counters of process pid.
func ReadIO(pid int) (IO, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return IO{}, err
	}
	return ParseIO(b)
}

// ParseIO parses the text of /proc/PID/io.
func ParseIO(b []byte) (IO, error) {
	var s IO
	fields := map[string]*int64{"rchar": &s.ReadBytes, "wchar": &s.WriteBytes, "syscr": &s.ReadCalls, "syscw": &s.WriteCalls}
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		p := fields[k]
		if !ok || p == nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return s, fmt.Errorf("/proc io: %s: %q is not a number", k, strings.TrimSpace(v))
		}
		*p = n
		seen++
	}
	if seen < len(fields) {
		return s, fmt.Errorf("/proc io: %d of the fields rchar, wchar, syscr, syscw", seen)
	}
	return s, nil
}
