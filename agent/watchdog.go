package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"walden/lease"
)

// The watchdog process.
//
// The agent does not kill the broker itself: a separate process does, on
// its own timer, so that an agent that stalls (SIGSTOP, a debugger, CPU
// starvation, a bug) cannot keep a broker alive past its lease. The agent
// tells it, at every change, the instant on the boot clock at which the
// broker must be dead (the lease's validity end minus watchdog.kill_margin),
// and the watchdog kills the broker's process group at that instant unless
// told a later one. In child mode the watchdog process is also the broker's
// parent: it starts the broker only while that instant is in the future, so
// the broker is never alive a moment without a deadline, and reaps it. Both
// die with the agent (Pdeathsig), the broker with the watchdog; a watchdog
// whose agent goes away (its input closes) kills the broker first.
//
// The protocol is one JSON object a line: watchdogMsg from the agent on the
// watchdog's standard input, watchdogEvent back on its standard output.

// Operations of watchdogMsg.
const (
	opConfig   = "config"   // the kill command and its timeout
	opDeadline = "deadline" // the instant the broker must be dead by
	opStart    = "start"    // start the broker as our child
	opAdopt    = "adopt"    // watch a broker started by someone else
	opTerm     = "term"     // SIGTERM to the broker's process group
	opKill     = "kill"     // kill the broker now
)

// Events of watchdogEvent.
const (
	evAck         = "ack"
	evStarted     = "started"
	evStartFailed = "start_failed"
	evAdopted     = "adopted"
	evAdoptFailed = "adopt_failed"
	evKilled      = "killed"
	evKillFailed  = "kill_failed"
	evExited      = "exited"
)

// Deadlines of watchdogMsg.DeadlineNS other than an instant.
const (
	// deadlineNone: no deadline (a broker that checks its lease itself;
	// the watchdog only starts and reaps it).
	deadlineNone int64 = -1
	// deadlineNow: no valid lease: a broker must not run.
	deadlineNow int64 = 0
)

// Kill reasons, as the watchdog reports them and the metrics label them.
const (
	KillLease       = "lease"        // the lease was about to run out
	KillNoLease     = "no_lease"     // a broker alive while the agent held no valid lease
	KillFenced      = "fenced"       // the cluster refused the broker's epoch
	KillHealth      = "health"       // the broker failed its checks
	KillStop        = "stop"         // the agent stopped
	KillAgentGone   = "agent_gone"   // the watchdog lost its agent
	KillWatchdogGap = "watchdog_gap" // the agent killed it: the watchdog process did not in time
)

// KillReasons lists every kill reason.
var KillReasons = []string{KillLease, KillNoLease, KillFenced, KillHealth, KillStop, KillAgentGone, KillWatchdogGap}

type watchdogMsg struct {
	Op  string `json:"op"`
	Seq uint64 `json:"seq"`

	KillCommand   []string `json:"kill_command,omitempty"`
	KillTimeoutNS int64    `json:"kill_timeout_ns,omitempty"`

	DeadlineNS int64  `json:"deadline_ns"`
	Reason     string `json:"reason,omitempty"`

	Argv []string `json:"argv,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	Env  []string `json:"env,omitempty"`

	PID   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
}

type watchdogEvent struct {
	Event      string `json:"event"`
	Seq        uint64 `json:"seq,omitempty"`
	PID        int    `json:"pid,omitempty"`
	PGID       int    `json:"pgid,omitempty"`
	Start      uint64 `json:"start,omitempty"`
	AtNS       int64  `json:"at_ns,omitempty"`
	DeadlineNS int64  `json:"deadline_ns,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Via        string `json:"via,omitempty"`
	Status     string `json:"status,omitempty"`
	Error      string `json:"error,omitempty"`
}

// stopSignals are the signals a terminal or a service manager sends to stop
// or suspend a process, and SIGPIPE.
var stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE}

// catchStopSignals makes the watchdog process deaf to stopSignals by
// catching and dropping them, not by ignoring them: a signal's "ignore"
// disposition is inherited across exec, so a broker started by an ignoring
// watchdog ignored SIGTERM and SIGINT from its start (a JVM installs no
// shutdown hook for a signal ignored when it starts), and every graceful stop
// ended in SIGKILL after broker.stop_timeout. A caught signal is reset to
// its default in the child at exec, as is one the agent itself was started
// ignoring (nohup, a service manager's ignored SIGPIPE), which the watchdog
// catches too.
func catchStopSignals() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, stopSignals...)
	go func() {
		for range sigs {
		}
	}()
}

// watchdogTick bounds how long the watchdog sleeps between two readings of
// the boot clock: its timers run on the monotonic clock, which stops while
// the host is suspended, so after a resume it notices a passed deadline
// within a tick.
const watchdogTick = 20 * time.Millisecond

// RunWatchdog is the body of the watchdog process (`walden agent watchdog`,
// started by the agent): it reads the agent's messages from in, writes its
// events to out, and gives a broker it starts stdout and stderr. It returns
// when in ends, after killing the broker if one is alive. It ignores the
// signals a terminal or a service manager sends to stop a process (the
// agent stops it by closing in); SIGKILL of the agent kills it (Pdeathsig).
func RunWatchdog(in io.Reader, out io.Writer, stdout, stderr *os.File) error {
	catchStopSignals()
	w := &watchdog{
		out: json.NewEncoder(out), stdout: stdout, stderr: stderr,
		deadline: deadlineNow, reason: KillNoLease, killTimeout: time.Second,
		exits: make(chan exitNote, 4), fork: newForker(),
	}
	msgs := make(chan watchdogMsg)
	go func() {
		defer close(msgs)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var m watchdogMsg
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				fmt.Fprintf(os.Stderr, "walden agent watchdog: ignoring a malformed message: %v\n", err)
				continue
			}
			msgs <- m
		}
	}()
	for {
		wait := w.due()
		var timer <-chan time.Time
		if wait >= 0 {
			timer = time.After(min(wait, watchdogTick))
		}
		select {
		case m, ok := <-msgs:
			if !ok {
				w.agentGone()
				return nil
			}
			w.handle(m)
		case e := <-w.exits:
			w.exited(e)
		case <-timer:
		}
		w.check()
	}
}

// watchdog is the state of the watchdog process. Only RunWatchdog's
// goroutine touches it.
type watchdog struct {
	out            *json.Encoder
	stdout, stderr *os.File
	fork           *forker

	killCommand []string
	killTimeout time.Duration

	deadline int64  // deadlineNone, deadlineNow or a boot clock instant
	reason   string // why, when deadline is deadlineNow

	target *watched
	exits  chan exitNote
	gen    int // numbers the targets, so that a late exit is not taken for a newer one's
}

// watched is the broker the watchdog kills when its deadline comes.
type watched struct {
	pid, pgid int
	start     uint64
	child     bool
	killedAt  int64 // boot clock of the kill; 0 before
	gen       int
}

type exitNote struct {
	gen    int
	pid    int
	at     int64
	status string
}

func (w *watchdog) emit(e watchdogEvent) {
	if err := w.out.Encode(e); err != nil {
		// The agent is gone; its input closing ends the loop.
		fmt.Fprintf(os.Stderr, "walden agent watchdog: cannot tell the agent: %v\n", err)
	}
}

func bootNS() int64 { return int64(lease.BootClock.Now()) }

// due is how long until the watchdog must act: 0 now, -1 never.
func (w *watchdog) due() time.Duration {
	if w.target == nil || w.target.killedAt != 0 {
		if w.target != nil {
			return watchdogTick // follow a kill to the exit
		}
		return -1
	}
	switch w.deadline {
	case deadlineNone:
		return -1
	case deadlineNow:
		return 0
	}
	return max(time.Duration(w.deadline-bootNS()), 0)
}

// check kills the target when its deadline has come, and kills it again
// with SIGKILL when it outlived a kill by the kill timeout.
func (w *watchdog) check() {
	t := w.target
	if t == nil {
		return
	}
	if t.killedAt != 0 {
		if time.Duration(bootNS()-t.killedAt) > w.killTimeout+time.Second {
			via, err := killTarget(t.pid, t.pgid, unix.SIGKILL)
			e := watchdogEvent{Event: evKillFailed, PID: t.pid, AtNS: bootNS(), Via: via, Error: "still alive after the kill"}
			if err != nil {
				e.Error += ": " + err.Error()
			}
			w.emit(e)
			t.killedAt = bootNS()
		}
		return
	}
	switch {
	case w.deadline == deadlineNone:
	case w.deadline == deadlineNow:
		w.kill(w.reason)
	case bootNS() >= w.deadline:
		w.kill(KillLease)
	}
}

// kill kills the target now: with the kill command when there is one (then
// SIGKILL if the broker outlives it), else SIGKILL to its process group.
func (w *watchdog) kill(reason string) {
	t := w.target
	if !t.child {
		if alive, _ := sameProcess(t.pid, t.start); !alive {
			return // gone by itself; its exit is on its way
		}
	}
	// The kill's instant is taken before the signal: the exit, seen by
	// another goroutine, can come before the kill call returns.
	start := bootNS()
	t.killedAt = start
	via, err := "", error(nil)
	if len(w.killCommand) > 0 {
		via, err = w.runKillCommand(t)
		if err == nil && !waitExit(t.pid, t.start, max(w.killTimeout-time.Duration(bootNS()-start), 0)) {
			err = errors.New("the broker outlived the kill command")
		}
		if err != nil {
			w.emit(watchdogEvent{Event: evKillFailed, PID: t.pid, AtNS: bootNS(), Reason: reason, Via: via, Error: err.Error()})
			via, err = killTarget(t.pid, t.pgid, unix.SIGKILL)
		}
	} else {
		via, err = killTarget(t.pid, t.pgid, unix.SIGKILL)
	}
	e := watchdogEvent{Event: evKilled, PID: t.pid, PGID: t.pgid, AtNS: start, Reason: reason, Via: via}
	if w.deadline > 0 {
		e.DeadlineNS = w.deadline
	}
	if err != nil {
		e.Error = err.Error()
	}
	w.emit(e)
}

// runKillCommand runs watchdog.kill_command for t, bounded by the kill
// timeout (its process group is killed at the timeout).
func (w *watchdog) runKillCommand(t *watched) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), w.killTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.killCommand[0], w.killCommand[1:]...)
	cmd.Env = append(os.Environ(), "WALDEN_BROKER_PID="+strconv.Itoa(t.pid), "WALDEN_BROKER_PGID="+strconv.Itoa(t.pgid))
	cmd.Stdout, cmd.Stderr = w.stderr, w.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	err := cmd.Run()
	if err != nil {
		return "kill command", fmt.Errorf("kill command %q: %w", w.killCommand[0], err)
	}
	return "kill command", nil
}

func (w *watchdog) handle(m watchdogMsg) {
	switch m.Op {
	case opConfig:
		w.killCommand = m.KillCommand
		if m.KillTimeoutNS > 0 {
			w.killTimeout = time.Duration(m.KillTimeoutNS)
		}
	case opDeadline:
		w.deadline, w.reason = m.DeadlineNS, m.Reason
		if w.reason == "" {
			w.reason = KillNoLease
		}
	case opStart:
		w.start(m)
		return
	case opAdopt:
		w.adopt(m)
		return
	case opTerm:
		if t := w.target; t != nil && t.killedAt == 0 {
			_, _ = killTarget(t.pid, t.pgid, unix.SIGTERM)
		}
	case opKill:
		if t := w.target; t != nil && t.killedAt == 0 {
			w.kill(m.Reason)
		}
	}
	w.emit(watchdogEvent{Event: evAck, Seq: m.Seq})
}

// start starts the broker as our child, in its own process group, dying
// with us, only while the deadline is in the future.
func (w *watchdog) start(m watchdogMsg) {
	fail := func(err string) { w.emit(watchdogEvent{Event: evStartFailed, Seq: m.Seq, Error: err}) }
	switch {
	case w.target != nil:
		fail(fmt.Sprintf("a broker (pid %d) is still running", w.target.pid))
		return
	case len(m.Argv) == 0:
		fail("no command")
		return
	case w.deadline == deadlineNow || (w.deadline > 0 && bootNS() >= w.deadline):
		fail("no valid lease: a broker may not start")
		return
	}
	cmd := exec.Command(m.Argv[0], m.Argv[1:]...)
	cmd.Dir = m.Dir
	cmd.Env = append(os.Environ(), m.Env...)
	cmd.Stdout, cmd.Stderr = w.stdout, w.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := w.fork.start(cmd); err != nil {
		fail(err.Error())
		return
	}
	pid := cmd.Process.Pid
	var start uint64
	if p, err := readProc(pid); err == nil {
		start = p.start
	}
	w.target = &watched{pid: pid, pgid: pid, start: start, child: true, gen: w.nextGen()}
	gen := w.target.gen
	go func() {
		err := cmd.Wait()
		status := "exit status 0"
		if err != nil {
			status = err.Error()
		}
		w.exits <- exitNote{gen: gen, pid: pid, at: bootNS(), status: status}
	}()
	w.emit(watchdogEvent{Event: evStarted, Seq: m.Seq, PID: pid, PGID: pid, Start: start, AtNS: bootNS()})
}

func (w *watchdog) nextGen() int { w.gen++; return w.gen }

// adopt watches a broker started by someone else (a pid file).
func (w *watchdog) adopt(m watchdogMsg) {
	fail := func(err string) { w.emit(watchdogEvent{Event: evAdoptFailed, Seq: m.Seq, PID: m.PID, Error: err}) }
	if t := w.target; t != nil {
		if t.pid == m.PID && t.start == m.Start {
			w.emit(watchdogEvent{Event: evAdopted, Seq: m.Seq, PID: t.pid, PGID: t.pgid, Start: t.start, AtNS: bootNS()})
			return
		}
		fail(fmt.Sprintf("already watching pid %d", t.pid))
		return
	}
	// Open a handle on the process before checking it is the one meant,
	// so that the exit watched is that process's.
	fd, err := unix.PidfdOpen(m.PID, 0)
	if err != nil {
		fail(fmt.Sprintf("pid %d: %v", m.PID, err))
		return
	}
	p, err := readProc(m.PID)
	if err != nil || p.start != m.Start || p.dead() {
		unix.Close(fd)
		fail(fmt.Sprintf("pid %d is not the broker any more", m.PID))
		return
	}
	w.target = &watched{pid: m.PID, pgid: p.pgid, start: p.start, gen: w.nextGen()}
	gen, pid := w.target.gen, m.PID
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
				break
			}
		}
		w.exits <- exitNote{gen: gen, pid: pid, at: bootNS(), status: "exited"}
	}()
	w.emit(watchdogEvent{Event: evAdopted, Seq: m.Seq, PID: pid, PGID: p.pgid, Start: p.start, AtNS: bootNS()})
}

func (w *watchdog) exited(e exitNote) {
	if w.target == nil || w.target.gen != e.gen {
		return
	}
	w.target = nil
	w.emit(watchdogEvent{Event: evExited, PID: e.pid, AtNS: e.at, Status: e.status})
}

// agentGone: the agent closed our input (it stopped, or died): a broker
// must not outlive its agent. Kill it and wait for its exit (a child is
// reaped), then return.
func (w *watchdog) agentGone() {
	if w.target == nil {
		return
	}
	if w.target.killedAt == 0 {
		w.kill(KillAgentGone)
	}
	deadline := time.After(w.killTimeout + 5*time.Second)
	for w.target != nil {
		select {
		case e := <-w.exits:
			w.exited(e)
		case <-deadline:
			return
		}
	}
}

// forker starts processes from one OS thread that lives as long as the
// process: Linux sends a child its Pdeathsig when the thread that forked it
// exits, not only when the process does, and the Go runtime may end
// threads.
type forker struct {
	reqs chan forkReq
}

type forkReq struct {
	cmd  *exec.Cmd
	done chan error
}

func newForker() *forker {
	f := &forker{reqs: make(chan forkReq)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives until the process exits
		for r := range f.reqs {
			r.done <- r.cmd.Start()
		}
	}()
	return f
}

func (f *forker) start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	f.reqs <- forkReq{cmd: cmd, done: done}
	return <-done
}

// sharedForker is the agent's forker (one thread for the whole process).
var sharedForker = sync.OnceValue(newForker)
