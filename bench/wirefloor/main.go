package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/proto"

	"walden/bench/internal/procstat"
	waldenv1 "walden/proto/walden/v1"
)

// errUsage marks a bad command line.
var errUsage = errors.New("wirefloor: usage")

// transports are the transports a run can measure, in their order.
var transports = []string{"raw", "raw-tls", "grpc", "grpc-tls"}

// options are the command-line flags.
type options struct {
	Conns       int
	Rate        float64
	Warmup      time.Duration
	Window      time.Duration
	Rounds      int
	Transports  []string
	Slots       []time.Duration // 0: sends spread evenly; d > 0: those of each d together
	ClientProcs int
	Format      string
}

func main() {
	if isChild(os.Args[1:]) {
		if err := runChild(os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
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
	fs := flag.NewFlagSet("wirefloor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Conns, "conns", 1000, "client connections (one TCP connection each), in 1..20000")
	fs.Float64Var(&o.Rate, "rate", 1, "requests per second per connection, in (0, 1000]")
	fs.DurationVar(&o.Warmup, "warmup", 5*time.Second, "unmeasured time once every connection sends, per transport, slot and round")
	fs.DurationVar(&o.Window, "window", 20*time.Second, "measured window per transport, slot and round")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds (each measures every transport with every slot); the table shows the median and range")
	ts := fs.String("transports", strings.Join(transports, ","), "comma-separated transports: raw, raw-tls, grpc, grpc-tls")
	slots := fs.String("slots", "0", "comma-separated send slots: 0 spreads the sends evenly over each period; a duration d in 1ms..period/2 rounds each connection's send time down to a multiple of d, so that the connections of a slot send together")
	fs.IntVar(&o.ClientProcs, "client-procs", 2, "client processes the connections are spread over, in 1..16")
	fs.StringVar(&o.Format, "o", "table", "output: table (for people) or json (for scripts)")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	switch {
	case o.Conns < 1 || o.Conns > 20000:
		return o, fmt.Errorf("%w: -conns %d is not in 1..20000", errUsage, o.Conns)
	case !(o.Rate > 0 && o.Rate <= 1000):
		return o, fmt.Errorf("%w: -rate %v is not in (0, 1000]", errUsage, o.Rate)
	case o.Warmup < 0 || o.Warmup > time.Hour:
		return o, fmt.Errorf("%w: -warmup %v is not in 0..1h", errUsage, o.Warmup)
	case o.Window < 100*time.Millisecond || o.Window > time.Hour:
		return o, fmt.Errorf("%w: -window %v is not in 100ms..1h", errUsage, o.Window)
	case o.Rounds < 1 || o.Rounds > 100:
		return o, fmt.Errorf("%w: -rounds %d is not in 1..100", errUsage, o.Rounds)
	case o.ClientProcs < 1 || o.ClientProcs > 16:
		return o, fmt.Errorf("%w: -client-procs %d is not in 1..16", errUsage, o.ClientProcs)
	case o.Format != "table" && o.Format != "json":
		return o, fmt.Errorf("%w: -o %q is not table or json", errUsage, o.Format)
	}
	o.ClientProcs = min(o.ClientProcs, o.Conns)
	for _, t := range strings.Split(*ts, ",") {
		t = strings.TrimSpace(t)
		if !slices.Contains(transports, t) {
			return o, fmt.Errorf("%w: -transports: %q is not one of %s", errUsage, t, strings.Join(transports, ", "))
		}
		if !slices.Contains(o.Transports, t) {
			o.Transports = append(o.Transports, t)
		}
	}
	var err error
	if o.Slots, err = parseSlots(*slots, periodOf(o.Rate)); err != nil {
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	return o, nil
}

// parseSlots reads the comma-separated list of -slots: each 0 or a
// duration in 1ms..period/2, each once, in their order.
func parseSlots(list string, period time.Duration) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		d, err := time.ParseDuration(f)
		if err != nil {
			return nil, fmt.Errorf("-slots: %q is not a duration (such as 0, 20ms or 100ms)", f)
		}
		if d != 0 && (d < time.Millisecond || d > period/2) {
			return nil, fmt.Errorf("-slots: %v is neither 0 nor in 1ms..%v (half the period of %v between a connection's sends)", d, period/2, period)
		}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out, nil
}

// periodOf is the time between two sends of a connection at rate a second.
func periodOf(rate float64) time.Duration {
	return time.Duration(float64(time.Second) / rate)
}

// variant is what a round measures once: a transport with a send slot.
type variant struct {
	transport string
	slot      time.Duration
}

func (v variant) String() string { return v.transport + ", slot " + fmtSlot(v.slot) }

// variants are the transports with each slot, in the order every round
// measures them.
func (o options) variants() []variant {
	var vs []variant
	for _, t := range o.Transports {
		for _, s := range o.Slots {
			vs = append(vs, variant{transport: t, slot: s})
		}
	}
	return vs
}

// slotMs is a slot in milliseconds, as rows and summaries report it.
func slotMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fmtSlot is a slot as the table and the progress lines show it.
func fmtSlot(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// round is what one variant measured in one round.
type round struct {
	Transport string `json:"transport"`
	// SlotMs is the send slot in milliseconds (0: sends spread evenly).
	SlotMs float64 `json:"slot_ms"`
	Round  int     `json:"round"`
	// Expected is the messages a second the clients were to send.
	Expected float64 `json:"expected_per_s"`
	// The server: messages answered in the window and per second, CPU per
	// message and in cores, wait for a CPU per second run, read and write
	// calls and bytes per message, resident memory at the window's end.
	Answered         uint64  `json:"server_answered"`
	AnsweredPerS     float64 `json:"server_answered_per_s"`
	ServerMsPerMsg   float64 `json:"server_cpu_ms_per_msg"`
	ServerCores      float64 `json:"server_cores"`
	ServerWait       float64 `json:"server_wait_per_run"`
	ServerReadCalls  float64 `json:"server_read_calls_per_msg"`
	ServerWriteCalls float64 `json:"server_write_calls_per_msg"`
	ServerBytes      float64 `json:"server_bytes_per_msg"`
	ServerSlices     float64 `json:"server_slices_per_msg"`
	ServerRSSMB      float64 `json:"server_rss_mb"`
	// The clients, all processes together: requests sent and answers
	// received in the window, sends more than a period late (over the
	// whole run), CPU per answer, cores, wait per run.
	ClientSent      uint64  `json:"clients_sent"`
	ClientAnswered  uint64  `json:"clients_answered"`
	ClientLate      uint64  `json:"clients_late"`
	ClientMsPerMsg  float64 `json:"clients_cpu_ms_per_msg"`
	ClientCores     float64 `json:"clients_cores"`
	ClientWait      float64 `json:"clients_wait_per_run"`
	LoadBefore      string  `json:"load_before"`
	LoadAfter       string  `json:"load_after"`
	WindowS         float64 `json:"window_s"`
	ConnectSeconds  float64 `json:"connect_s"`
	RequestBytes    int     `json:"request_bytes"`
	AnswerBytes     int     `json:"answer_bytes"`
	ServerStartedAt string  `json:"started_at"`
}

// summary is the median and range of the rounds of one variant.
type summary struct {
	Transport      string  `json:"transport"`
	SlotMs         float64 `json:"slot_ms"`
	Rounds         int     `json:"rounds"`
	RequestBytes   int     `json:"request_bytes"`
	AnswerBytes    int     `json:"answer_bytes"`
	AnsweredPerS   stat    `json:"server_answered_per_s"`
	ServerMsPerMsg stat    `json:"server_cpu_ms_per_msg"`
	ServerCores    stat    `json:"server_cores"`
	ServerWait     stat    `json:"server_wait_per_run"`
	ServerCalls    stat    `json:"server_calls_per_msg"`
	ServerBytes    stat    `json:"server_bytes_per_msg"`
	ServerSlices   stat    `json:"server_slices_per_msg"`
	ServerRSSMB    stat    `json:"server_rss_mb"`
	ClientMsPerMsg stat    `json:"clients_cpu_ms_per_msg"`
	ClientWait     stat    `json:"clients_wait_per_run"`
}

// stat is a median and a range.
type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func statOf(xs []float64) stat {
	if len(xs) == 0 {
		return stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Median: m, Min: s[0], Max: s[len(s)-1]}
}

// report is the output of -o json.
type report struct {
	Date       string    `json:"date"`
	Command    string    `json:"command"`
	CPUs       int       `json:"cpus"`
	Conns      int       `json:"conns"`
	Rate       float64   `json:"rate_per_conn"`
	WarmupS    float64   `json:"warmup_s"`
	WindowS    float64   `json:"window_s"`
	LoadBefore string    `json:"load_before"`
	LoadAfter  string    `json:"load_after"`
	Summary    []summary `json:"summary"`
	Rounds     []round   `json:"rounds"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// The children's stderr and this process's progress lines share it.
	stderr = &lockedWriter{w: stderr}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "wirefloor-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var cert, key string
	if slices.Contains(o.Transports, "grpc-tls") || slices.Contains(o.Transports, "raw-tls") {
		if cert, key, err = selfSigned(dir); err != nil {
			return err
		}
	}
	rep := report{Date: time.Now().UTC().Format(time.RFC3339), Command: "wirefloor " + strings.Join(args, " "),
		CPUs: runtime.NumCPU(), Conns: o.Conns, Rate: o.Rate, WarmupS: o.Warmup.Seconds(), WindowS: o.Window.Seconds(),
		LoadBefore: procstat.Loadavg()}
	for r := 1; r <= o.Rounds; r++ {
		for _, v := range o.variants() {
			fmt.Fprintf(stderr, "round %d, %v: %d connections at %v/s (load average %s)\n", r, v, o.Conns, o.Rate, procstat.Loadavg())
			row, err := measure(ctx, o, self, v, cert, key, stderr)
			if err != nil {
				return fmt.Errorf("wirefloor: round %d, %v: %w", r, v, err)
			}
			row.Round = r
			fmt.Fprintf(stderr, "  server %.4f ms/msg (%.3f cores, %.0f msgs/s of %.0f, wait/run %.2f), clients %.4f ms/msg\n",
				row.ServerMsPerMsg, row.ServerCores, row.AnsweredPerS, row.Expected, row.ServerWait, row.ClientMsPerMsg)
			rep.Rounds = append(rep.Rounds, row)
		}
	}
	rep.LoadAfter = procstat.Loadavg()
	rep.Summary = summarize(o.variants(), rep.Rounds)
	if o.Format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printTable(stdout, rep)
	return nil
}

func summarize(vs []variant, rows []round) []summary {
	var out []summary
	for _, v := range vs {
		s := summary{Transport: v.transport, SlotMs: slotMs(v.slot)}
		var ans, ms, cores, wait, calls, bytes, wakes, rss, cms, cwait []float64
		for _, r := range rows {
			if r.Transport != s.Transport || r.SlotMs != s.SlotMs {
				continue
			}
			s.Rounds++
			s.RequestBytes, s.AnswerBytes = r.RequestBytes, r.AnswerBytes
			ans = append(ans, r.AnsweredPerS)
			ms = append(ms, r.ServerMsPerMsg)
			cores = append(cores, r.ServerCores)
			wait = append(wait, r.ServerWait)
			calls = append(calls, r.ServerReadCalls+r.ServerWriteCalls)
			bytes = append(bytes, r.ServerBytes)
			wakes = append(wakes, r.ServerSlices)
			rss = append(rss, r.ServerRSSMB)
			cms = append(cms, r.ClientMsPerMsg)
			cwait = append(cwait, r.ClientWait)
		}
		s.AnsweredPerS, s.ServerMsPerMsg, s.ServerCores, s.ServerWait = statOf(ans), statOf(ms), statOf(cores), statOf(wait)
		s.ServerCalls, s.ServerBytes, s.ServerSlices, s.ServerRSSMB = statOf(calls), statOf(bytes), statOf(wakes), statOf(rss)
		s.ClientMsPerMsg, s.ClientWait = statOf(cms), statOf(cwait)
		out = append(out, s)
	}
	return out
}

func printTable(w io.Writer, rep report) {
	fmt.Fprintf(w, "%s, %d CPUs, %d connections × %v/s, warm-up %v, window %v, load average %s → %s\n",
		rep.Date, rep.CPUs, rep.Conns, rep.Rate, time.Duration(rep.WarmupS*float64(time.Second)),
		time.Duration(rep.WindowS*float64(time.Second)), rep.LoadBefore, rep.LoadAfter)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "transport\tslot\trounds\tmsg bytes (req/ans)\tanswered/s\tserver ms/msg\tserver cores\tserver wait/run\tserver syscalls/msg\tserver slices/msg\tserver bytes/msg\tserver RSS MB\tclients ms/msg\tclients wait/run")
	for _, s := range rep.Summary {
		slot := fmtSlot(time.Duration(s.SlotMs * float64(time.Millisecond)))
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Transport, slot, s.Rounds, s.RequestBytes, s.AnswerBytes,
			fmtStat(s.AnsweredPerS, 0), fmtStat(s.ServerMsPerMsg, 4), fmtStat(s.ServerCores, 3), fmtStat(s.ServerWait, 2),
			fmtStat(s.ServerCalls, 2), fmtStat(s.ServerSlices, 2), fmtStat(s.ServerBytes, 0), fmtStat(s.ServerRSSMB, 0), fmtStat(s.ClientMsPerMsg, 4), fmtStat(s.ClientWait, 2))
	}
	tw.Flush()
	fmt.Fprintln(w, "median [min–max] over the rounds; slot 0: the connections' sends spread evenly over each period, slot d: those of each d sent together; ms/msg is CPU (user + system) per message answered; syscalls and bytes are the server's reads and writes of any file per message; slices are the times its threads were put on a CPU per message; msg bytes are the payloads (raw: frame; grpc: protobuf, before gRPC's and HTTP/2's framing)")
}

func fmtStat(s stat, prec int) string {
	return fmt.Sprintf("%.*f [%.*f–%.*f]", prec, s.Median, prec, s.Min, prec, s.Max)
}

// lockedWriter serializes the writes of several writers to one.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// child is a child process and its pipes.
type child struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string
	exited chan struct{}
}

// startChild starts this binary with args; its stderr goes to stderr.
func startChild(self string, args []string, stderr io.Writer) (*child, error) {
	cmd := exec.Command(self, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, in: in, lines: make(chan string, 16), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		_ = cmd.Wait()
		close(c.exited)
		close(c.lines)
	}()
	return c, nil
}

// expect waits up to d for the child's next line and returns its fields
// after the word want.
func (c *child) expect(ctx context.Context, want string, d time.Duration) ([]string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			return nil, fmt.Errorf("process %d ended (%v) before it said %q", c.cmd.Process.Pid, c.cmd.ProcessState, want)
		}
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != want {
			return nil, fmt.Errorf("process %d said %q, not %q", c.cmd.Process.Pid, l, want)
		}
		return f[1:], nil
	case <-t.C:
		return nil, fmt.Errorf("process %d did not say %q within %v", c.cmd.Process.Pid, want, d)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *child) say(line string) error {
	_, err := io.WriteString(c.in, line+"\n")
	return err
}

// counts asks the child for its counters.
func (c *child) counts(ctx context.Context, n int) ([]uint64, error) {
	if err := c.say("count"); err != nil {
		return nil, err
	}
	f, err := c.expect(ctx, "count", 10*time.Second)
	if err != nil {
		return nil, err
	}
	if len(f) != n {
		return nil, fmt.Errorf("process %d counted %d numbers, not %d", c.cmd.Process.Pid, len(f), n)
	}
	out := make([]uint64, n)
	for i, s := range f {
		if out[i], err = strconv.ParseUint(s, 10, 64); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// stop closes the child's stdin (it ends) and kills it after 5 s.
func (c *child) stop() {
	_ = c.in.Close()
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// sample is what one process said at one instant.
type sample struct {
	proc  procstat.Sample
	sched procstat.Sched
	io    procstat.IO
}

func sampleOf(pid int) (sample, error) {
	p, err := procstat.Read(pid)
	if err != nil {
		return sample{}, err
	}
	io, err := procstat.ReadIO(pid)
	if err != nil {
		return sample{}, err
	}
	return sample{proc: p, sched: procstat.ReadSched(pid), io: io}, nil
}

// measure runs one round of variant v.
func measure(ctx context.Context, o options, self string, v variant, cert, key string, stderr io.Writer) (row round, err error) {
	t := v.transport
	connectTimeout := 30*time.Second + time.Duration(o.Conns)*20*time.Millisecond
	period := periodOf(o.Rate)
	// Every child ends by itself after lifetime, whatever happens here.
	lifetime := connectTimeout + o.Warmup + o.Window + period + 30*time.Second
	life := []string{"-rate", fmt.Sprint(o.Rate), "-lifetime", lifetime.String()}
	row = round{Transport: t, SlotMs: slotMs(v.slot), Expected: float64(o.Conns) * o.Rate, LoadBefore: procstat.Loadavg(), ServerStartedAt: time.Now().UTC().Format(time.RFC3339)}
	row.RequestBytes, row.AnswerBytes = frameSize, frameSize
	if t != "raw" {
		row.RequestBytes, row.AnswerBytes = proto.Size(renewal(1)), proto.Size(&waldenv1.RenewLeasesResponse{Seq: 1, Grant: grant()})
	}

	srv, err := startChild(self, append([]string{"-serve", t, "-cert", cert, "-key", key}, life...), stderr)
	if err != nil {
		return row, err
	}
	defer srv.stop()
	f, err := srv.expect(ctx, "addr", 10*time.Second)
	if err != nil || len(f) != 1 {
		return row, fmt.Errorf("server: %v", err)
	}
	if _, _, err := net.SplitHostPort(f[0]); err != nil {
		return row, fmt.Errorf("server address %q: %w", f[0], err)
	}
	addr := f[0]

	began := time.Now()
	var cls []*child
	defer func() {
		var wg sync.WaitGroup
		for _, c := range cls {
			wg.Go(c.stop)
		}
		wg.Wait()
	}()
	for p := range o.ClientProcs {
		first, last := p*o.Conns/o.ClientProcs, (p+1)*o.Conns/o.ClientProcs
		c, err := startChild(self, append([]string{"-client", t, "-addr", addr, "-cert", cert,
			"-conns", strconv.Itoa(last - first), "-first", strconv.Itoa(first), "-total", strconv.Itoa(o.Conns), "-slot", v.slot.String()}, life...), stderr)
		if err != nil {
			return row, err
		}
		cls = append(cls, c)
	}
	for _, c := range cls {
		if f, err := c.expect(ctx, "ready", connectTimeout); err != nil {
			return row, fmt.Errorf("clients: %w", err)
		} else if len(f) != 0 {
			return row, fmt.Errorf("clients: ready %v", f)
		}
	}
	row.ConnectSeconds = time.Since(began).Seconds()
	start := time.Now().Add(100 * time.Millisecond)
	for _, c := range cls {
		if err := c.say(fmt.Sprintf("go %d", start.UnixNano())); err != nil {
			return row, err
		}
	}
	// Wait the warm-up from the moment the last connection has sent its
	// first request.
	if err := sleep(ctx, time.Until(start)+period+o.Warmup); err != nil {
		return row, err
	}

	pids := []int{srv.cmd.Process.Pid}
	for _, c := range cls {
		pids = append(pids, c.cmd.Process.Pid)
	}
	snap := func() ([]sample, []uint64, error) {
		ss := make([]sample, len(pids))
		for i, pid := range pids {
			if ss[i], err = sampleOf(pid); err != nil {
				return nil, nil, err
			}
		}
		n, err := srv.counts(ctx, 1)
		if err != nil {
			return nil, nil, err
		}
		for _, c := range cls {
			m, err := c.counts(ctx, 3)
			if err != nil {
				return nil, nil, err
			}
			n = append(n, m...)
		}
		return ss, n, nil
	}
	s0, n0, err := snap()
	if err != nil {
		return row, err
	}
	if err := sleep(ctx, o.Window); err != nil {
		return row, err
	}
	s1, n1, err := snap()
	if err != nil {
		return row, err
	}
	row.LoadAfter = procstat.Loadavg()

	wall := s1[0].proc.At.Sub(s0[0].proc.At)
	row.WindowS = wall.Seconds()
	row.Answered = n1[0] - n0[0]
	row.AnsweredPerS = float64(row.Answered) / wall.Seconds()
	row.ServerCores = procstat.Cores(s0[0].proc, s1[0].proc)
	row.ServerWait = procstat.WaitPerRun(s0[0].sched, s1[0].sched)
	row.ServerRSSMB = float64(s1[0].proc.RSS) / (1 << 20)
	if row.Answered > 0 {
		n := float64(row.Answered)
		row.ServerMsPerMsg = float64(s1[0].proc.CPU-s0[0].proc.CPU) / float64(time.Millisecond) / n
		row.ServerReadCalls = float64(s1[0].io.ReadCalls-s0[0].io.ReadCalls) / n
		row.ServerWriteCalls = float64(s1[0].io.WriteCalls-s0[0].io.WriteCalls) / n
		row.ServerBytes = float64(s1[0].io.ReadBytes-s0[0].io.ReadBytes+s1[0].io.WriteBytes-s0[0].io.WriteBytes) / n
		row.ServerSlices = float64(s1[0].sched.Slices-s0[0].sched.Slices) / n
	}
	var ccpu time.Duration
	var sch0, sch1 procstat.Sched
	for i := range cls {
		a, b := s0[i+1], s1[i+1]
		ccpu += b.proc.CPU - a.proc.CPU
		row.ClientCores += procstat.Cores(a.proc, b.proc)
		sch0.Run, sch0.Wait = sch0.Run+a.sched.Run, sch0.Wait+a.sched.Wait
		sch1.Run, sch1.Wait = sch1.Run+b.sched.Run, sch1.Wait+b.sched.Wait
		k := 1 + 3*i
		row.ClientSent += n1[k] - n0[k]
		row.ClientAnswered += n1[k+1] - n0[k+1]
		row.ClientLate += n1[k+2]
	}
	row.ClientWait = procstat.WaitPerRun(sch0, sch1)
	if row.ClientAnswered > 0 {
		row.ClientMsPerMsg = float64(ccpu) / float64(time.Millisecond) / float64(row.ClientAnswered)
	}
	return row, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// selfSigned writes a self-signed ECDSA P-256 certificate for 127.0.0.1
// and its key into dir, valid for a day.
func selfSigned(dir string) (cert, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "wirefloor"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return "", "", err
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return "", "", err
	}
	return cert, key, nil
}
