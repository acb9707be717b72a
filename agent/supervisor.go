package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"walden/config"
)

// BrokerState is the watched broker's state as its agent sees it.
type BrokerState string

const (
	// BrokerNotWatched: the agent's configuration has no broker section.
	BrokerNotWatched BrokerState = "not_watched"
	// BrokerWaiting: no broker process yet. In child mode the agent
	// starts it once its lease is valid; with a pid file it waits for the
	// process to appear.
	BrokerWaiting BrokerState = "waiting"
	// BrokerStarting: its process runs; its checks have not passed yet.
	BrokerStarting BrokerState = "starting"
	// BrokerUp: its process runs and its checks pass.
	BrokerUp BrokerState = "up"
	// BrokerDown: it died (its process exited or was killed, or its checks
	// failed): the agent does not renew its lease and answers its probes
	// 503, so that the cluster fails it over.
	BrokerDown BrokerState = "down"
	// BrokerStopped: the agent stopped.
	BrokerStopped BrokerState = "stopped"
)

// BrokerStates lists every BrokerState.
var BrokerStates = []BrokerState{BrokerNotWatched, BrokerWaiting, BrokerStarting, BrokerUp, BrokerDown, BrokerStopped}

// BrokerStatus is the watched broker at one instant.
type BrokerStatus struct {
	State BrokerState
	// PID is the broker's process (0 when none is known).
	PID int
	// Since is when it entered State (wall clock, for people).
	Since time.Time
	// Reason says why it is in State ("exited: exit status 1", "killed by
	// the watchdog: lease", "3 checks failed in a row: ...").
	Reason string
	// Starts counts the times the agent started it (child mode).
	Starts int
	// WatchdogArmed is set while the watchdog holds a deadline for a live
	// broker; KillIn is then how long until it kills it.
	WatchdogArmed bool
	KillIn        time.Duration
	// RegisterIn is, while down, how long until the agent registers again
	// (-1: not before the agent restarts).
	RegisterIn time.Duration
}

// KillRecord is one kill of the broker by its watchdog, as the agent saw
// it confirmed.
type KillRecord struct {
	// Reason is one of KillReasons.
	Reason string
	// Latency is from the kill to its confirmation (the process exited).
	Latency time.Duration
	// Lead is how long before the end of the lease's validity the broker
	// was confirmed dead (negative: after); 0 when it held no lease.
	Lead time.Duration
}

// BrokerObserver is told what the agent's broker supervision does (cmd
// turns it into metrics). Its methods must not block.
type BrokerObserver interface {
	BrokerState(BrokerState)
	WatchdogArmed(bool)
	Kill(KillRecord)
	CheckFailed(check string)
}

// Checks, as CheckFailed names them.
const (
	CheckTCP  = "tcp"  // a connect to broker.kafka_addr
	CheckExec = "exec" // broker.health_command
)

// BrokerChecks lists every check.
var BrokerChecks = []string{CheckTCP, CheckExec}

// defaultFailureTimeout stands for the cluster's failure_timeout when a
// registration did not say it (an older walden).
const defaultFailureTimeout = 10 * time.Second

// deadlineUnsent: no deadline told to the current watchdog process yet.
const deadlineUnsent int64 = -2

// decisionSlack is added to failure_timeout and a lease before an agent
// whose broker died registers again: the coordinators' probe rounds and
// the decision's raft round, on a loaded cluster.
const decisionSlack = 2 * time.Second

// supervisor watches the broker beside the agent: it starts it (child mode)
// or finds it (pid file), checks it, tells the watchdog process the
// instant it must be dead by, and when it dies closes the registration gate
// (the agent stops renewing its lease) until the cluster could fail it
// over. One goroutine (run) drives it; another (pump) reads the watchdog
// process's events.
type supervisor struct {
	a     *Agent
	cfg   config.AgentBroker
	wdCfg config.AgentWatchdog
	log   *slog.Logger
	obs   BrokerObserver

	mu         sync.Mutex
	st         BrokerStatus
	gateOpen   bool
	gateCh     chan struct{} // closed and replaced when the gate changes
	hostCancel context.CancelFunc
	wd         *watchdogClient
	target     *watched      // the broker's process, while it runs
	targetCh   chan struct{} // closed and replaced when target changes
	exitReason string        // why the last target ended
	kills      map[int]killInfo
	deadline   int64 // the last deadline sent
	reason     string
	backstop   *time.Timer
	stopping   bool // the agent is stopping: no more incarnations
}

// killInfo is a kill the watchdog reported, until the process's exit.
type killInfo struct {
	reason   string
	at, due  int64
	withLead bool
}

func newSupervisor(a *Agent) *supervisor {
	return &supervisor{
		a: a, cfg: a.cfg.Broker, wdCfg: a.cfg.Watchdog, log: a.log.With("component", "broker"), obs: a.opts.BrokerObserver,
		st:       BrokerStatus{State: BrokerWaiting, Since: time.Now()},
		gateOpen: true, gateCh: make(chan struct{}), targetCh: make(chan struct{}), kills: map[int]killInfo{}, deadline: deadlineUnsent,
	}
}

func (s *supervisor) childMode() bool { return len(s.cfg.Command) > 0 }

// needsWatchdogProcess: a child is started and reaped by the watchdog
// process; a pid file's broker needs one only to be killed.
func (s *supervisor) needsWatchdogProcess() bool { return s.childMode() || s.wdCfg.Enabled }

// status returns the broker's status now.
func (s *supervisor) status() BrokerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if s.target != nil {
		st.PID = s.target.pid
	}
	st.WatchdogArmed = s.armedLocked()
	if st.WatchdogArmed {
		st.KillIn = max(time.Duration(s.deadline-bootNS()), 0)
	}
	return st
}

func (s *supervisor) armedLocked() bool {
	return s.wdCfg.Enabled && s.wd != nil && s.target != nil && s.deadline != deadlineNone
}

// isDown reports whether the broker is down, and why.
func (s *supervisor) isDown() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.State == BrokerDown, s.st.Reason
}

func (s *supervisor) setState(state BrokerState, reason string) {
	s.mu.Lock()
	changed := s.st.State != state
	s.st.State, s.st.Reason, s.st.Since = state, reason, time.Now()
	if state != BrokerDown {
		s.st.RegisterIn = 0
	}
	s.mu.Unlock()
	if changed && s.obs != nil {
		s.obs.BrokerState(state)
	}
}

// waitGate blocks until the agent may register (the gate is open) or ctx
// ends.
func (s *supervisor) waitGate(ctx context.Context) bool {
	for {
		s.mu.Lock()
		open, ch := s.gateOpen, s.gateCh
		s.mu.Unlock()
		if open {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		}
	}
}

func (s *supervisor) gateIsOpen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gateOpen
}

func (s *supervisor) setGate(open bool) {
	s.mu.Lock()
	s.gateOpen = open
	close(s.gateCh)
	s.gateCh = make(chan struct{})
	if !open && s.hostCancel != nil {
		s.hostCancel()
		s.hostCancel = nil
	}
	s.mu.Unlock()
}

// renewing returns the context renewals run in: it ends when the broker
// goes down (the gate closes).
func (s *supervisor) renewing(ctx context.Context) context.Context {
	rctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.gateOpen {
		cancel()
		return rctx
	}
	if s.hostCancel != nil {
		s.hostCancel()
	}
	s.hostCancel = cancel
	return rctx
}

// leaseChanged tells the watchdog process the instant the broker must be
// dead by: kill_margin before the lease's validity ends, now when there is
// no valid lease, never without the watchdog. It never blocks.
func (s *supervisor) leaseChanged() {
	if !s.needsWatchdogProcess() {
		return
	}
	ns, reason := deadlineNone, ""
	if s.wdCfg.Enabled {
		ns, reason = s.killDeadline()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wd == nil || (ns == s.deadline && reason == s.reason) {
		return
	}
	// A deadline that moved later by less than a millisecond is not worth
	// a message (a later deadline only ever lets the broker live longer).
	if ns > 0 && s.deadline > 0 && ns > s.deadline && ns-s.deadline < int64(time.Millisecond) && reason == s.reason {
		return
	}
	wasArmed := s.armedLocked()
	s.deadline, s.reason = ns, reason
	s.wd.setDeadline(ns, reason)
	s.armBackstopLocked()
	if armed := s.armedLocked(); armed != wasArmed && s.obs != nil {
		s.obs.WatchdogArmed(armed)
	}
}

// killDeadline is the watchdog's deadline now: the lease's validity end
// minus kill_margin on the boot clock, or deadlineNow with the reason.
func (s *supervisor) killDeadline() (int64, string) {
	a := s.a
	a.mu.Lock()
	now := a.clock.Now()
	l := a.leaseLocked(now)
	stopped := a.st.stopped
	a.mu.Unlock()
	switch {
	case l.Valid:
		// The agent's clock is the boot clock (lease.BootClock), which the
		// watchdog process reads too.
		return max(int64(now+l.Remaining-s.wdCfg.KillMargin), 1), KillLease
	case stopped:
		return deadlineNow, KillStop
	case l.Fenced:
		return deadlineNow, KillFenced
	}
	return deadlineNow, KillNoLease
}

// armBackstopLocked arms the agent's own timer behind the watchdog
// process's: if the broker is still alive a little after its deadline (the
// watchdog process is stalled or gone), the agent kills it itself. The
// slack, a quarter of kill_margin (at most 100ms), keeps that kill before
// the lease's validity ends.
func (s *supervisor) armBackstopLocked() {
	if s.backstop != nil {
		s.backstop.Stop()
		s.backstop = nil
	}
	if !s.wdCfg.Enabled || s.target == nil || s.deadline == deadlineNone {
		return
	}
	slack := min(s.wdCfg.KillMargin/4, 100*time.Millisecond)
	at := time.Duration(s.deadline) + slack
	if s.deadline == deadlineNow {
		at = time.Duration(bootNS()) + 250*time.Millisecond
	}
	t := *s.target
	s.backstop = time.AfterFunc(max(at-time.Duration(bootNS()), 0), func() { s.backstopKill(t) })
}

func (s *supervisor) backstopKill(t watched) {
	s.mu.Lock()
	current := s.target != nil && s.target.pid == t.pid && s.target.start == t.start
	_, killed := s.kills[t.pid]
	s.mu.Unlock()
	if !current {
		return
	}
	if alive, err := sameProcess(t.pid, t.start); err != nil || !alive {
		return
	}
	via, err := killTarget(t.pid, t.pgid, unix.SIGKILL)
	s.log.Error("the watchdog process did not kill the broker in time: the agent killed it", "pid", t.pid, "signalled", via,
		"watchdog_reported_a_kill", killed, "err", err)
	s.mu.Lock()
	if !killed {
		s.kills[t.pid] = killInfo{reason: KillWatchdogGap, at: bootNS(), due: s.deadline, withLead: s.deadline > 0}
	}
	s.mu.Unlock()
	if !t.child || s.watchdog() == nil {
		// Nobody else reports this exit.
		go func() {
			if waitExit(t.pid, t.start, 10*time.Second) {
				s.targetExited(t.pid, bootNS(), "killed by the agent")
			}
		}()
	}
}

// run supervises the broker until ctx ends.
func (s *supervisor) run(ctx context.Context) {
	defer s.closeWatchdog()
	if s.obs != nil {
		s.obs.BrokerState(s.status().State)
	}
	for ctx.Err() == nil {
		if err := s.ensureWatchdog(ctx); err != nil {
			s.log.Error("cannot start the watchdog process; retrying", "err", err)
			if !sleepCtx(ctx, time.Second) {
				return
			}
			continue
		}
		epoch, ok := s.waitLease(ctx)
		if !ok {
			return
		}
		reason, fenced := s.incarnation(ctx, epoch)
		if ctx.Err() != nil || s.isStopping() {
			<-ctx.Done()
			return
		}
		wait := s.wentDown(ctx, reason, fenced, epoch)
		if wait < 0 {
			s.log.Warn("the broker stays down: broker.restart is false; restart the agent to start it again")
			<-ctx.Done()
			return
		}
		s.log.Info("registering again once the cluster could fail the dead broker over", "in", wait.Round(time.Millisecond))
		if !s.waitOut(ctx, wait) {
			return
		}
		s.setState(BrokerWaiting, "registering again")
		s.setGate(true)
	}
}

// waitOut waits d while the broker is down. A pid file's broker that
// appears meanwhile runs without a lease: with the watchdog it dies at once.
func (s *supervisor) waitOut(ctx context.Context, d time.Duration) bool {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return true
		}
		if !sleepCtx(ctx, min(left, s.cfg.CheckInterval)) {
			return false
		}
		s.killUnleased(ctx)
	}
}

// killUnleased hands the watchdog a pid file's broker process that runs
// while the agent holds no valid lease for it: its deadline is now.
func (s *supervisor) killUnleased(ctx context.Context) {
	if s.childMode() || !s.wdCfg.Enabled || s.hasTarget() {
		return
	}
	if p, pid, ok := s.pidFileProcess(); ok {
		s.log.Warn("a broker process runs while the agent holds no valid lease: the watchdog kills it", "pid", pid, "pid_file", s.cfg.PIDFile)
		s.adopt(ctx, pid, p)
	}
}

// ensureWatchdog starts the watchdog process when it is needed and not
// running, and the goroutine that reads its events.
func (s *supervisor) ensureWatchdog(ctx context.Context) error {
	if !s.needsWatchdogProcess() {
		return nil
	}
	if wd := s.watchdog(); wd != nil && wd.alive() {
		return nil
	}
	o := s.a.opts
	wd, err := startWatchdog(o.WatchdogCommand, o.BrokerStdout, o.BrokerStderr, s.wdCfg.KillCommand, s.wdCfg.KillTimeout, s.log.With("component", "watchdog"))
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.wd, s.deadline, s.reason = wd, deadlineUnsent, ""
	s.mu.Unlock()
	s.leaseChanged()
	go s.pump(ctx, wd)
	return nil
}

// pump reads the watchdog process's events until it exits.
func (s *supervisor) pump(ctx context.Context, wd *watchdogClient) {
	for {
		select {
		case e := <-wd.events:
			s.handleEvent(e)
		case <-wd.done:
			// Drain what it said before it went.
			for {
				select {
				case e := <-wd.events:
					s.handleEvent(e)
					continue
				default:
				}
				break
			}
			if ctx.Err() == nil {
				s.watchdogLost(wd)
			}
			return
		}
	}
}

func (s *supervisor) watchdog() *watchdogClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wd
}

func (s *supervisor) closeWatchdog() {
	if wd := s.watchdog(); wd != nil {
		wd.close(s.wdCfg.KillTimeout + 10*time.Second)
	}
}

// handleEvent handles an event of the watchdog process.
func (s *supervisor) handleEvent(e watchdogEvent) {
	switch e.Event {
	case evKilled:
		s.mu.Lock()
		s.kills[e.PID] = killInfo{reason: e.Reason, at: e.AtNS, due: e.DeadlineNS, withLead: e.DeadlineNS > 0}
		s.mu.Unlock()
		lvl := slog.LevelWarn
		if e.Error != "" {
			lvl = slog.LevelError
		}
		s.log.Log(context.Background(), lvl, "the watchdog killed the broker", "pid", e.PID, "reason", e.Reason, "signalled", e.Via,
			"after_deadline", lateBy(e), "err", e.Error)
	case evKillFailed:
		s.log.Error("the watchdog's kill did not end the broker at once", "pid", e.PID, "via", e.Via, "err", e.Error)
	case evExited:
		s.targetExited(e.PID, e.AtNS, e.Status)
	}
}

// targetExited records that the broker's process pid exited at (boot
// clock) and, after a kill, how long the kill took.
func (s *supervisor) targetExited(pid int, at int64, status string) {
	s.mu.Lock()
	k, killed := s.kills[pid]
	delete(s.kills, pid)
	current := s.target != nil && s.target.pid == pid
	if current {
		s.target = nil
		if killed {
			s.exitReason = fmt.Sprintf("killed by the watchdog (%s)", k.reason)
		} else {
			s.exitReason = fmt.Sprintf("its process %d exited (%s)", pid, status)
		}
		if s.backstop != nil {
			s.backstop.Stop()
			s.backstop = nil
		}
		close(s.targetCh)
		s.targetCh = make(chan struct{})
	}
	wasArmed := current && s.wdCfg.Enabled && s.wd != nil && s.deadline != deadlineNone
	s.mu.Unlock()
	if wasArmed && s.obs != nil {
		s.obs.WatchdogArmed(false)
	}
	if !killed {
		return
	}
	rec := KillRecord{Reason: k.reason, Latency: time.Duration(at - k.at)}
	if k.withLead {
		rec.Lead = time.Duration(k.due) + s.wdCfg.KillMargin - time.Duration(at)
	}
	s.log.Warn("broker dead after its kill", "pid", pid, "reason", k.reason, "kill_latency", rec.Latency, "before_lease_end", rec.Lead)
	if s.obs != nil {
		s.obs.Kill(rec)
	}
}

func lateBy(e watchdogEvent) time.Duration {
	if e.DeadlineNS <= 0 {
		return 0
	}
	return time.Duration(e.AtNS - e.DeadlineNS)
}

// watchdogLost: the watchdog process exited. A child dies with it
// (Pdeathsig); a pid file's broker is killed here: it must not run
// unwatched.
func (s *supervisor) watchdogLost(wd *watchdogClient) {
	t := s.currentTarget()
	s.log.Error("the watchdog process exited; the broker cannot run without it", "broker_pid", pidOf(t))
	if t == nil {
		return
	}
	if !t.child {
		if alive, _ := sameProcess(t.pid, t.start); alive {
			via, err := killTarget(t.pid, t.pgid, unix.SIGKILL)
			s.log.Warn("killed the broker whose watchdog exited", "pid", t.pid, "signalled", via, "err", err)
		}
	}
	go func() {
		waitExit(t.pid, t.start, 10*time.Second)
		s.targetExited(t.pid, bootNS(), "its watchdog process exited")
	}()
}

func pidOf(t *watched) int {
	if t == nil {
		return 0
	}
	return t.pid
}

func (s *supervisor) currentTarget() *watched {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.target
}

func (s *supervisor) setTarget(t *watched) {
	s.mu.Lock()
	wasArmed := s.armedLocked()
	s.target = t
	close(s.targetCh)
	s.targetCh = make(chan struct{})
	s.armBackstopLocked()
	armed := s.armedLocked()
	s.mu.Unlock()
	if armed != wasArmed && s.obs != nil {
		s.obs.WatchdogArmed(armed)
	}
}

// awaitExit waits until the broker's process has exited, up to ctx.
func (s *supervisor) awaitExit(ctx context.Context) bool {
	for {
		s.mu.Lock()
		t, ch := s.target, s.targetCh
		s.mu.Unlock()
		if t == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		}
	}
}

// waitLease waits until the agent holds a valid lease the broker can run
// under (with the watchdog, one that lasts longer than kill_margin), and
// returns its epoch. With a pid file and the watchdog it meanwhile hands
// the watchdog any broker process that runs without a lease: it dies.
func (s *supervisor) waitLease(ctx context.Context) (uint64, bool) {
	for {
		s.a.mu.Lock()
		l := s.a.leaseLocked(s.a.clock.Now())
		ch := s.a.changed
		s.a.mu.Unlock()
		if l.Valid && (!s.wdCfg.Enabled || l.Remaining > s.wdCfg.KillMargin) {
			if !s.childMode() && s.wdCfg.Enabled && s.hasTarget() {
				// A broker adopted without a lease is being killed: let it
				// go before the lease's broker is looked for.
				kctx, cancel := context.WithTimeout(ctx, s.wdCfg.KillTimeout+5*time.Second)
				s.awaitExit(kctx)
				cancel()
			}
			return l.Epoch, true
		}
		s.killUnleased(ctx)
		select {
		case <-ctx.Done():
			return 0, false
		case <-ch:
		case <-time.After(s.cfg.CheckInterval):
		}
	}
}

// pidFileProcess reads the pid file and reports the live process it names.
func (s *supervisor) pidFileProcess() (procInfo, int, bool) {
	if s.cfg.PIDFile == "" {
		return procInfo{}, 0, false
	}
	pid, err := readPIDFile(s.cfg.PIDFile)
	if err != nil {
		return procInfo{}, 0, false
	}
	p, err := readProc(pid)
	if err != nil || p.dead() {
		return procInfo{}, 0, false
	}
	return p, pid, true
}

// adopt makes a pid file's process the broker: handed to the watchdog
// process when there is one.
func (s *supervisor) adopt(ctx context.Context, pid int, p procInfo) bool {
	wd := s.watchdog()
	if wd == nil {
		s.setTarget(&watched{pid: pid, pgid: p.pgid, start: p.start})
		return true
	}
	e, err := wd.request(ctx, watchdogMsg{Op: opAdopt, PID: pid, Start: p.start})
	if err != nil || e.Event != evAdopted {
		s.log.Warn("the watchdog process could not watch the broker's process", "pid", pid, "err", errors.Join(err, eventErr(e)))
		return false
	}
	s.setTarget(&watched{pid: e.PID, pgid: e.PGID, start: e.Start})
	return true
}

func eventErr(e watchdogEvent) error {
	if e.Error == "" {
		return nil
	}
	return errors.New(e.Error)
}

// incarnation runs one broker incarnation under the lease of epoch: it
// starts or finds the broker and checks it until it dies. It returns why,
// and whether the cluster refused the epoch (the broker was failed over).
func (s *supervisor) incarnation(ctx context.Context, epoch uint64) (reason string, fenced bool) {
	begun := time.Now()
	switch {
	case s.childMode():
		e, err := s.watchdog().request(ctx, watchdogMsg{Op: opStart, Argv: s.cfg.Command, Dir: s.cfg.Dir, Env: s.cfg.Env})
		if err == nil && e.Event != evStarted {
			err = eventErr(e)
		}
		if err != nil {
			return "could not start the broker: " + err.Error(), false
		}
		s.mu.Lock()
		s.st.Starts++
		s.mu.Unlock()
		s.setTarget(&watched{pid: e.PID, pgid: e.PGID, start: e.Start, child: true})
		s.log.Info("broker started", "pid", e.PID, "epoch", epoch, "command", s.cfg.Command)
	case s.cfg.PIDFile != "":
		if !s.hasTarget() {
			s.setState(BrokerWaiting, "waiting for the broker's process (pid file "+s.cfg.PIDFile+")")
		}
		for !s.hasTarget() {
			if p, pid, ok := s.pidFileProcess(); ok {
				if !s.adopt(ctx, pid, p) {
					return "the watchdog process could not watch the broker's process", false
				}
				s.log.Info("broker process found", "pid", pid, "epoch", epoch, "pid_file", s.cfg.PIDFile)
				break
			}
			if r, f, over := s.leaseOver(epoch); over {
				return r, f
			}
			if time.Since(begun) > s.cfg.StartTimeout {
				return fmt.Sprintf("no broker process appeared within broker.start_timeout (%s, pid file %s)", s.cfg.StartTimeout, s.cfg.PIDFile), false
			}
			if !sleepCtx(ctx, s.cfg.CheckInterval) {
				return "", false
			}
		}
	}
	return s.watch(ctx, epoch, begun)
}

// leaseOver reports, with the watchdog, that the lease the incarnation runs
// under is over for good: the cluster refused its epoch, or the agent
// registered another one. The watchdog then kills the broker at once.
func (s *supervisor) leaseOver(epoch uint64) (string, bool, bool) {
	if !s.wdCfg.Enabled {
		return "", false, false
	}
	l := s.a.Lease()
	switch {
	case l.Fenced && l.Epoch == epoch:
		return fmt.Sprintf("the cluster refused epoch %d (failed over)", epoch), true, true
	case l.Epoch != epoch:
		return fmt.Sprintf("epoch %d was replaced by %d", epoch, l.Epoch), true, true
	}
	return "", false, false
}

// watch checks the broker every check interval until it dies.
func (s *supervisor) watch(ctx context.Context, epoch uint64, begun time.Time) (string, bool) {
	s.setState(BrokerStarting, "")
	hasProcess := s.cfg.HasProcess()
	passed, failures := false, 0
	tick := time.NewTicker(s.cfg.CheckInterval)
	defer tick.Stop()
	for {
		s.mu.Lock()
		t, tch, why := s.target, s.targetCh, s.exitReason
		s.mu.Unlock()
		if hasProcess && t == nil {
			_, fenced, _ := s.leaseOver(epoch)
			return why, fenced
		}
		if t != nil && s.watchdog() == nil {
			// Nobody reports the exit of a pid file's process without
			// the watchdog: look.
			if alive, err := sameProcess(t.pid, t.start); err == nil && !alive {
				s.targetExited(t.pid, bootNS(), "exited")
				continue
			}
		}
		if _, _, over := s.leaseOver(epoch); over {
			// The watchdog kills it now (its deadline is now); the exit
			// ends the watch.
			select {
			case <-ctx.Done():
				return "", false
			case <-tch:
			case <-tick.C:
			}
			continue
		}
		select {
		case <-ctx.Done():
			return "", false
		case <-tch:
			continue
		case <-tick.C:
		}
		err := s.check(ctx)
		switch {
		case err == nil:
			failures = 0
			if !passed {
				passed = true
				s.setState(BrokerUp, "")
				s.log.Info("broker up: its checks pass", "epoch", epoch)
			}
		case !passed && time.Since(begun) < s.cfg.StartTimeout:
			// Still starting: failures do not count yet.
		case !passed:
			return fmt.Sprintf("it did not pass its checks within broker.start_timeout (%s): %v", s.cfg.StartTimeout, err), false
		default:
			failures++
			s.log.Warn("broker check failed", "failures", failures, "threshold", s.cfg.FailureThreshold, "err", err)
			if failures >= s.cfg.FailureThreshold {
				return fmt.Sprintf("%d checks failed in a row: %v", failures, err), false
			}
		}
	}
}

// check runs the configured checks once: a TCP connect, then the health
// command. With neither, the broker is healthy while its process runs.
func (s *supervisor) check(ctx context.Context) error {
	if s.cfg.KafkaAddr != "" {
		d := net.Dialer{Timeout: s.cfg.HealthTimeout}
		c, err := d.DialContext(ctx, "tcp", s.cfg.KafkaAddr)
		if err != nil {
			s.checkFailed(CheckTCP)
			return fmt.Errorf("connect to %s: %w", s.cfg.KafkaAddr, err)
		}
		_ = c.Close()
	}
	if len(s.cfg.HealthCommand) > 0 {
		if err := runHealthCommand(ctx, s.cfg.HealthCommand, s.cfg.HealthTimeout); err != nil {
			s.checkFailed(CheckExec)
			return err
		}
	}
	return nil
}

func (s *supervisor) checkFailed(check string) {
	if s.obs != nil {
		s.obs.CheckFailed(check)
	}
}

// runHealthCommand runs argv in its own process group, killed whole at the
// timeout; exit status 0 is healthy.
func runHealthCommand(ctx context.Context, argv []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("health command %s did not finish within %s", argv[0], timeout)
	case err != nil:
		msg := strings.TrimSpace(out.String())
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		if msg != "" {
			return fmt.Errorf("health command %s: %w: %s", argv[0], err, msg)
		}
		return fmt.Errorf("health command %s: %w", argv[0], err)
	}
	return nil
}

// wentDown handles the broker's death: it makes sure the process is dead
// (killing it when the agent may), closes the registration gate (renewals
// stop; the lease is void at once), answers probes 503, and returns how long
// to wait before registering again: none when the cluster already refused
// the epoch (its failover happened; a registration waits while the recovery
// runs), else the cluster's failure_timeout plus a lease plus decisionSlack,
// so that the cluster can decide the failover first; -1: never
// (broker.restart false).
func (s *supervisor) wentDown(ctx context.Context, reason string, fenced bool, epoch uint64) time.Duration {
	if s.hasTarget() {
		if wd := s.watchdog(); wd != nil {
			_, _ = wd.request(ctx, watchdogMsg{Op: opKill, Reason: KillHealth})
			kctx, cancel := context.WithTimeout(ctx, s.wdCfg.KillTimeout+5*time.Second)
			if !s.awaitExit(kctx) {
				s.log.Error("the broker's process did not exit after its kill", "pid", pidOf(s.currentTarget()))
			}
			cancel()
		}
	}
	s.setGate(false)
	s.a.brokerDown(epoch)
	var wait time.Duration
	switch {
	case s.childMode() && !s.cfg.Restart:
		wait = -1
	case fenced:
		wait = 0
	default:
		s.a.mu.Lock()
		ft, ttl := s.a.st.failureTimeout, s.a.st.ttl
		s.a.mu.Unlock()
		if ft <= 0 {
			ft = defaultFailureTimeout
		}
		wait = ft + ttl + decisionSlack
	}
	s.setState(BrokerDown, reason)
	s.mu.Lock()
	s.st.RegisterIn = wait
	s.mu.Unlock()
	s.log.Warn("broker down: the agent stops renewing its lease and answers probes 503, so that the cluster fails it over",
		"epoch", epoch, "reason", reason)
	return wait
}

// stop stops the broker with the agent: gracefully (SIGTERM, up to
// broker.stop_timeout while the lease is still renewed, then the kill), or
// at once. It returns when the broker is dead or given up on.
func (s *supervisor) stop(graceful bool) {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	wd := s.watchdog()
	if !s.hasTarget() || wd == nil {
		s.setState(BrokerStopped, "the agent stopped")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StopTimeout+s.wdCfg.KillTimeout+10*time.Second)
	defer cancel()
	if graceful {
		s.log.Info("stopping the broker (SIGTERM to its process group)", "pid", pidOf(s.currentTarget()), "stop_timeout", s.cfg.StopTimeout)
		_, _ = wd.request(ctx, watchdogMsg{Op: opTerm})
		tctx, tcancel := context.WithTimeout(ctx, s.cfg.StopTimeout)
		s.awaitExit(tctx)
		tcancel()
	}
	if s.hasTarget() {
		_, _ = wd.request(ctx, watchdogMsg{Op: opKill, Reason: KillStop})
		if !s.awaitExit(ctx) {
			s.log.Error("the broker's process did not exit after its kill", "pid", pidOf(s.currentTarget()))
		}
	}
	s.setState(BrokerStopped, "the agent stopped")
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// defaultWatchdogCommand is `walden agent watchdog` from the running
// executable.
func defaultWatchdogCommand() []string {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return []string{exe, "agent", "watchdog"}
}

func (s *supervisor) hasTarget() bool { return s.currentTarget() != nil }

func (s *supervisor) isStopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}
