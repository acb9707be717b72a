package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// watchdogClient is the agent's end of its watchdog process: it starts the
// process, sends it messages without ever blocking the caller (a stalled
// watchdog process must not stall the agent), and hands its events on.
type watchdogClient struct {
	log  *slog.Logger
	cmd  *exec.Cmd
	in   io.WriteCloser
	done chan struct{} // closed when the process's output ended (it exited)

	mu       sync.Mutex
	seq      uint64
	queue    []watchdogMsg
	deadline *watchdogMsg // the latest deadline not yet written
	pending  map[uint64]chan watchdogEvent
	wake     chan struct{}
	closed   bool

	// events are the events that answer no request: killed, kill_failed,
	// exited. The supervisor reads them.
	events chan watchdogEvent
}

// errWatchdogGone means the watchdog process exited.
var errWatchdogGone = errors.New("the watchdog process exited")

// startWatchdog starts the watchdog process argv, which gives a broker it
// starts stdout and stderr, and configures its kill command.
func startWatchdog(argv []string, stdout, stderr *os.File, killCommand []string, killTimeout time.Duration, log *slog.Logger) (*watchdogClient, error) {
	if len(argv) == 0 {
		return nil, errors.New("agent: no watchdog command")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("agent: watchdog: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("agent: watchdog: %w", err)
	}
	cmd.Stderr = stderr
	cmd.ExtraFiles = []*os.File{stdout, stderr} // fds 3 and 4: the broker's stdout and stderr
	// Its own process group, so that a terminal's signals (Ctrl-C, Ctrl-Z)
	// to the agent's group do not reach it; it dies with the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := sharedForker().start(cmd); err != nil {
		return nil, fmt.Errorf("agent: start the watchdog process %s: %w", argv[0], err)
	}
	c := &watchdogClient{
		log: log, cmd: cmd, in: in, done: make(chan struct{}),
		pending: map[uint64]chan watchdogEvent{}, wake: make(chan struct{}, 1), events: make(chan watchdogEvent, 64),
	}
	go c.write()
	go c.read(out)
	c.send(watchdogMsg{Op: opConfig, KillCommand: killCommand, KillTimeoutNS: int64(killTimeout)})
	log.Info("watchdog process started", "pid", cmd.Process.Pid)
	return c, nil
}

// write sends the queued messages, the latest deadline first.
func (c *watchdogClient) write() {
	enc := json.NewEncoder(c.in)
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		c.mu.Lock()
		msgs := c.queue
		c.queue = nil
		if c.deadline != nil {
			msgs = append([]watchdogMsg{*c.deadline}, msgs...)
			c.deadline = nil
		}
		closed := c.closed
		c.mu.Unlock()
		for _, m := range msgs {
			if err := enc.Encode(m); err != nil {
				return // the process is gone: read sees its end
			}
		}
		if closed {
			_ = c.in.Close()
			return
		}
	}
}

func (c *watchdogClient) read(out io.Reader) {
	defer func() {
		_ = c.cmd.Wait()
		c.mu.Lock()
		for seq, ch := range c.pending {
			close(ch)
			delete(c.pending, seq)
		}
		c.mu.Unlock()
		close(c.done)
	}()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var e watchdogEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			c.log.Warn("the watchdog process wrote something unreadable", "line", sc.Text())
			continue
		}
		c.mu.Lock()
		ch := c.pending[e.Seq]
		if ch != nil && e.Seq != 0 {
			delete(c.pending, e.Seq)
		}
		c.mu.Unlock()
		if ch != nil && e.Seq != 0 {
			ch <- e
			continue
		}
		if e.Event == evAck {
			continue
		}
		select {
		case c.events <- e:
		case <-time.After(time.Second):
			c.log.Warn("watchdog events are not read; dropped one", "event", e.Event)
		}
	}
}

// send queues m and returns its sequence number.
func (c *watchdogClient) send(m watchdogMsg) uint64 {
	c.mu.Lock()
	c.seq++
	m.Seq = c.seq
	if m.Op == opDeadline {
		c.deadline = &m
	} else {
		c.queue = append(c.queue, m)
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return m.Seq
}

// request sends m and waits for the event answering it.
func (c *watchdogClient) request(ctx context.Context, m watchdogMsg) (watchdogEvent, error) {
	ch := make(chan watchdogEvent, 1)
	c.mu.Lock()
	c.seq++
	m.Seq = c.seq
	c.pending[m.Seq] = ch
	c.queue = append(c.queue, m)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	select {
	case e, ok := <-ch:
		if !ok {
			return watchdogEvent{}, errWatchdogGone
		}
		return e, nil
	case <-c.done:
		return watchdogEvent{}, errWatchdogGone
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, m.Seq)
		c.mu.Unlock()
		return watchdogEvent{}, ctx.Err()
	}
}

// setDeadline tells the watchdog the instant the broker must be dead by
// (deadlineNone, deadlineNow with the reason, or a boot clock reading).
func (c *watchdogClient) setDeadline(ns int64, reason string) {
	c.send(watchdogMsg{Op: opDeadline, DeadlineNS: ns, Reason: reason})
}

// close ends the watchdog's input (it kills a broker still alive, then
// exits) and waits up to timeout for it to exit; then it kills it.
func (c *watchdogClient) close(timeout time.Duration) {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	select {
	case <-c.done:
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// alive reports whether the watchdog process still runs.
func (c *watchdogClient) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}
