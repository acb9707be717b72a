package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// errUsage marks a bad command line.
var errUsage = errors.New("raftcompare: usage")

// options are the command-line flags.
type options struct {
	Duration    time.Duration
	Count       int
	Rounds      int
	Warmup      time.Duration
	Concurrency []int
	Payload     int
	Systems     []string
	Format      string
	Dir         string
	OpTimeout   time.Duration
	CPUProfile  string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("raftcompare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.Duration, "duration", 3*time.Second, "time bound of one round of one cell")
	fs.IntVar(&o.Count, "count", 20000, "operation bound of one round of one cell")
	fs.IntVar(&o.Rounds, "rounds", 3, "measured rounds per cell; the table shows the median")
	fs.DurationVar(&o.Warmup, "warmup", time.Second, "unmeasured warm-up per cell and system (bounded by -count too)")
	conc := fs.String("concurrency", "1,16,256", "comma-separated numbers of concurrent proposers")
	fs.IntVar(&o.Payload, "payload", 256, "payload size in bytes")
	systems := fs.String("systems", "walden,etcd", "comma-separated systems to run: walden, etcd")
	fs.StringVar(&o.Format, "o", "table", "output: table (aligned columns, for people), markdown, or json (rows for scripts)")
	fs.StringVar(&o.Format, "format", "table", "the same as -o (text is table)")
	fs.StringVar(&o.Dir, "dir", "", "parent of the temporary data directories (default: the OS temp dir)")
	fs.DurationVar(&o.OpTimeout, "op-timeout", 10*time.Second, "deadline of one proposal")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the measured rounds (both systems) to this file")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	if o.Format == "text" {
		o.Format = "table"
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	for _, f := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 4096 {
			return o, fmt.Errorf("%w: -concurrency: %q is not a number in 1..4096", errUsage, f)
		}
		o.Concurrency = append(o.Concurrency, n)
	}
	for _, s := range strings.Split(*systems, ",") {
		s = strings.TrimSpace(s)
		if s != "walden" && s != "etcd" {
			return o, fmt.Errorf("%w: -systems: unknown system %q (want walden, etcd)", errUsage, s)
		}
		o.Systems = append(o.Systems, s)
	}
	switch {
	case o.Duration <= 0:
		return o, fmt.Errorf("%w: -duration must be positive", errUsage)
	case o.Count < 1:
		return o, fmt.Errorf("%w: -count must be at least 1", errUsage)
	case o.Rounds < 1:
		return o, fmt.Errorf("%w: -rounds must be at least 1", errUsage)
	case o.Warmup < 0:
		return o, fmt.Errorf("%w: -warmup must not be negative", errUsage)
	case o.Payload < 1 || o.Payload > 1<<20:
		return o, fmt.Errorf("%w: -payload must be in 1..1048576", errUsage)
	case o.Format != "table" && o.Format != "text" && o.Format != "markdown" && o.Format != "json":
		return o, fmt.Errorf("%w: -o must be table, markdown or json", errUsage)
	case o.OpTimeout <= 0:
		return o, fmt.Errorf("%w: -op-timeout must be positive", errUsage)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(o.Dir, "raftcompare-")
	if err != nil {
		return fmt.Errorf("raftcompare: temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)

	maxWorkers := 0
	for _, c := range o.Concurrency {
		maxWorkers = max(maxWorkers, c)
	}
	var systems []system
	defer func() {
		for _, s := range systems {
			_ = s.Close()
		}
	}()
	for _, name := range o.Systems {
		t0 := time.Now()
		s, err := startSystem(ctx, name, tmp, maxWorkers)
		if err != nil {
			return err
		}
		systems = append(systems, s)
		fmt.Fprintf(stderr, "%s: 3 members up with a leader in %s\n", name, time.Since(t0).Round(time.Millisecond))
	}

	loadBefore := loadAverage()
	payload := make([]byte, o.Payload)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	results := make(map[string][]cellResult, len(systems))
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return fmt.Errorf("raftcompare: cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("raftcompare: cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	started := time.Now()
	for _, conc := range o.Concurrency {
		cfg := loadConfig{Concurrency: conc, Duration: o.Duration, MaxOps: o.Count, Payload: payload, OpTimeout: o.OpTimeout}
		if o.Warmup > 0 {
			warm := cfg
			warm.Duration = o.Warmup
			for _, s := range systems {
				if err := s.FindLeader(ctx); err != nil {
					return err
				}
				runRound(ctx, s, warm)
			}
		}
		rounds := make([][]roundResult, len(systems))
		for r := range o.Rounds {
			// Alternate which system goes first, so that neither always
			// runs right after the other's load.
			for k := range systems {
				i := k
				if r%2 == 1 {
					i = len(systems) - 1 - k
				}
				s := systems[i]
				if err := s.FindLeader(ctx); err != nil {
					return err
				}
				runtime.GC()
				res := runRound(ctx, s, cfg)
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("raftcompare: interrupted: %w", err)
				}
				rounds[i] = append(rounds[i], res)
				fmt.Fprintf(stderr, "%-6s c=%-4d round %d/%d: %6d ops in %5.2fs = %8.0f/s  mean %s  p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  errors %d\n",
					s.Name(), conc, r+1, o.Rounds, res.Ops, res.Elapsed.Seconds(), res.OpsPerSec(),
					fmtMs(res.Mean), fmtMs(res.P50), fmtMs(res.P90), fmtMs(res.P99), fmtMs(res.P999), fmtMs(res.Max), res.Errors)
			}
		}
		for i, s := range systems {
			results[s.Name()] = append(results[s.Name()], summarize(rounds[i]))
		}
	}
	fmt.Fprintf(stderr, "measured in %s, ending %s; 1-min load average %s before, %s after\n",
		time.Since(started).Round(time.Second), time.Now().UTC().Format("2006-01-02 15:04 UTC"), loadBefore, loadAverage())

	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.Name()
	}
	return printTable(stdout, o, names, results, loadBefore, loadAverage())
}

// startSystem starts the named 3-member cluster under dir.
func startSystem(ctx context.Context, name, dir string, maxWorkers int) (system, error) {
	switch name {
	case "walden":
		return startWalden(ctx, dir+"/walden", 3)
	case "etcd":
		return startEtcd(ctx, dir+"/etcd", 3, maxWorkers)
	default:
		return nil, fmt.Errorf("%w: unknown system %q", errUsage, name)
	}
}

func fmtMs(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// printTable writes one row per concurrency level with each system's median
// rate and latencies, and the ratios when both systems ran.
func printTable(w io.Writer, o options, names []string, results map[string][]cellResult, loadBefore, loadAfter string) error {
	if o.Format == "json" {
		return printJSON(w, o, names, results)
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "3-member clusters on 127.0.0.1, fsync on, payload %d B; %s/%s, %d CPUs (%s), %s; %s\n",
		o.Payload, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), cpuModel(), runtime.Version(),
		time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(bw, "median of %d rounds per cell, each bounded by %s and %d proposals, after a %s warm-up; 1-min load average %s before, %s after\n\n",
		o.Rounds, o.Duration, o.Count, o.Warmup, loadBefore, loadAfter)

	header := []string{"concurrency"}
	for _, n := range names {
		header = append(header, n+" proposals/s", n+" p50", n+" p99")
	}
	ratio := len(names) == 2
	if ratio {
		header = append(header, "proposals/s "+names[0]+"/"+names[1], "p99 "+names[0]+"/"+names[1])
	}
	var rows [][]string
	for i, conc := range o.Concurrency {
		row := []string{strconv.Itoa(conc)}
		for _, n := range names {
			c := results[n][i]
			row = append(row, fmt.Sprintf("%.0f", c.OpsPerSec), fmtMs(c.P50), fmtMs(c.P99))
		}
		if ratio {
			a, b := results[names[0]][i], results[names[1]][i]
			row = append(row, fmtRatio(a.OpsPerSec, b.OpsPerSec), fmtRatio(float64(a.P99), float64(b.P99)))
		}
		rows = append(rows, row)
	}

	if o.Format == "markdown" {
		fmt.Fprintf(bw, "| %s |\n", strings.Join(header, " | "))
		seps := make([]string, len(header))
		for i := range seps {
			seps[i] = "---:"
		}
		fmt.Fprintf(bw, "|%s|\n", strings.Join(seps, "|"))
		for _, r := range rows {
			fmt.Fprintf(bw, "| %s |\n", strings.Join(r, " | "))
		}
	} else {
		tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("raftcompare: write table: %w", err)
		}
	}

	for _, n := range names {
		for i, c := range results[n] {
			if c.Errors > 0 {
				fmt.Fprintf(bw, "\n%s at concurrency %d: %d failed proposals, first: %v", n, o.Concurrency[i], c.Errors, c.FirstErr)
			}
		}
	}
	fmt.Fprintln(bw)
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("raftcompare: write table: %w", err)
	}
	return nil
}

// jsonRow is one row of -o json: a concurrency level with each system's
// median proposals/s and p99 (milliseconds), and the ratios walden/etcd
// (null when a system did not run or measured nothing).
type jsonRow struct {
	Concurrency  int      `json:"concurrency"`
	WaldenOps    *float64 `json:"walden_ops"`
	EtcdOps      *float64 `json:"etcd_ops"`
	Ratio        *float64 `json:"ratio"`
	WaldenP99Ms  *float64 `json:"walden_p99_ms"`
	EtcdP99Ms    *float64 `json:"etcd_p99_ms"`
	P99Ratio     *float64 `json:"p99_ratio"`
	WaldenP50Ms  *float64 `json:"walden_p50_ms"`
	EtcdP50Ms    *float64 `json:"etcd_p50_ms"`
	WaldenErrors int      `json:"walden_errors"`
	EtcdErrors   int      `json:"etcd_errors"`
}

// printJSON writes the rows as a JSON array, one object per concurrency
// level.
func printJSON(w io.Writer, o options, names []string, results map[string][]cellResult) error {
	ms := func(d time.Duration) *float64 { v := float64(d) / float64(time.Millisecond); return &v }
	ratio := func(a, b float64) *float64 {
		if b == 0 {
			return nil
		}
		v := a / b
		return &v
	}
	rows := make([]jsonRow, 0, len(o.Concurrency))
	for i, conc := range o.Concurrency {
		row := jsonRow{Concurrency: conc}
		wr, wok := results["walden"]
		er, eok := results["etcd"]
		if wok {
			c := wr[i]
			row.WaldenOps, row.WaldenP99Ms, row.WaldenP50Ms, row.WaldenErrors = &c.OpsPerSec, ms(c.P99), ms(c.P50), c.Errors
		}
		if eok {
			c := er[i]
			row.EtcdOps, row.EtcdP99Ms, row.EtcdP50Ms, row.EtcdErrors = &c.OpsPerSec, ms(c.P99), ms(c.P50), c.Errors
		}
		if wok && eok {
			row.Ratio = ratio(wr[i].OpsPerSec, er[i].OpsPerSec)
			row.P99Ratio = ratio(float64(wr[i].P99), float64(er[i].P99))
		}
		rows = append(rows, row)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rows); err != nil {
		return fmt.Errorf("raftcompare: write json: %w", err)
	}
	return nil
}

func fmtRatio(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// loadAverage reads the 1-minute load average from /proc/loadavg, if there
// is one: other work on the machine skews both systems' figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// cpuModel reads the processor name from /proc/cpuinfo, if there is one.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
