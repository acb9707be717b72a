package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux configuration Go supports).
const clockTick = 10 * time.Millisecond

// procSample is what /proc says of one process at one instant.
type procSample struct {
	at       time.Time
	cpu      time.Duration // user + system
	rss, hwm int64         // bytes
}

// readProc samples process pid.
func readProc(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	cpu, err := parseStatCPU(b)
	if err != nil {
		return s, err
	}
	s.cpu = cpu
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	s.rss, s.hwm = parseStatusKB(st, "VmRSS:")*1024, parseStatusKB(st, "VmHWM:")*1024
	return s, nil
}

// parseStatCPU returns utime + stime of a /proc/PID/stat line. The command
// name (field 2) is in parentheses and may hold spaces: fields are counted
// from the last ')'.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("scale: /proc stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state is field 3, so utime (14) and stime (15) are at
	// indexes 11 and 12.
	if len(f) < 13 {
		return 0, fmt.Errorf("scale: /proc stat: %d fields", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("scale: /proc stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(u+s) * clockTick, nil
}

func parseStatusKB(b []byte, key string) int64 {
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

// schedSample is how long a process's threads ran and waited runnable for a
// CPU (/proc/PID/task/*/schedstat), summed over the threads alive now.
type schedSample struct {
	run, wait time.Duration
}

// readSched samples the scheduler statistics of process pid.
func readSched(pid int) schedSample {
	var s schedSample
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		run, _ := strconv.ParseInt(f[0], 10, 64)
		wait, _ := strconv.ParseInt(f[1], 10, 64)
		s.run += time.Duration(run)
		s.wait += time.Duration(wait)
	}
	return s
}

// waitPerRun is how long the process waited for a CPU per second it ran
// between two samples: above 1, it wanted the CPU more than it got it.
func waitPerRun(a, b schedSample) float64 {
	if b.run <= a.run {
		return 0
	}
	return float64(b.wait-a.wait) / float64(b.run-a.run)
}

// cores is the CPU used between two samples, in cores.
func cores(a, b procSample) float64 {
	wall := b.at.Sub(a.at)
	if wall <= 0 {
		return 0
	}
	return float64(b.cpu-a.cpu) / float64(wall)
}

// loadavg returns the 1-minute load average.
func loadavg() string {
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

// scrapeGauge reads one sample from a Prometheus text endpoint: name is the
// metric with its labels as the endpoint writes them, e.g.
// `walden_gossip_members{role="agent",state="alive"}`.
func scrapeGauge(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, fmt.Errorf("scale: %s: no %s", url, name)
}
