package sim

import (
	"fmt"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"walden/detect"
	"walden/fencing"
	"walden/fsm"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// Coord is one simulated coordinator: the real state machine (fsm.State),
// the real decision function (detect.Decide) and lease table
// (detect.LeaseTable), and the request handling of server/agent_service.go
// and server/brokers_service.go reduced to their order of steps.
type Coord struct {
	w    *World
	idx  int // index in w.coords and w.hosts
	name string

	st      *fsm.State
	applied int // entries of w.raft.log applied
	waiters map[uint64]func(*waldenv1.Result, error)
	reads   []readWaiter

	// config is the policy: section of this member's config file.
	config *waldenv1.Policy
	leases *detect.LeaseTable

	deciderTerm uint64
	mem         detect.Memory

	probes map[string]*probeState
	// replaying is set while a restarted member replays the log.
	replaying bool
}

type readWaiter struct {
	index uint64
	done  func()
}

type probeState struct {
	epoch    uint64
	failures int
	ok       bool
}

func newCoord(w *World, i int) *Coord {
	c := &Coord{w: w, idx: i, name: w.hosts[i].name, config: policy.Defaults()}
	c.reset()
	return c
}

// reset gives the coordinator the memory of a fresh process: the state
// machine replayed from the committed log, nothing else.
func (c *Coord) reset() {
	w := c.w
	c.st = fsm.New("sim")
	for i := range w.cfg.Coordinators {
		name := fmt.Sprintf("c%d", i+1)
		cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(uint64(i + 1))}}}
		if err := c.st.ApplyConfChange(uint64(i+1), cc, &waldenv1.ConfChangeContext{Member: &waldenv1.MemberContext{Id: name}}, nil); err != nil {
			panic(err)
		}
	}
	c.applied = 0
	c.waiters = map[uint64]func(*waldenv1.Result, error){}
	c.reads = nil
	c.leases = detect.NewLeaseTable(c.monoTime())
	c.deciderTerm, c.mem = 0, detect.Memory{}
	c.probes = map[string]*probeState{}
	c.replaying = true
	for c.applied < len(w.raft.log) {
		c.applyOne()
	}
	c.replaying = false
	for _, j := range c.st.Jobs("", fsm.JobPending) {
		c.onJob(j)
	}
}

func (c *Coord) host() *host { return c.w.hosts[c.idx] }

// monoTime is the process's monotonic clock as a time.Time (what time.Now
// gives the real code).
func (c *Coord) monoTime() time.Time { return time.Unix(0, c.host().mono(c.w.now)) }

func (c *Coord) wallMs() int64 { return 1_700_000_000_000 + c.w.now/1e6 }

func (c *Coord) start() {
	c.w.onHost(c.idx, 150*time.Millisecond, c.deciderTick)
	c.w.onHost(c.idx, time.Duration(c.w.rng.Int64N(int64(time.Second))), c.observeRound)
}

// effective is this member's effective policy: its config under the
// runtime overrides (the code under test).
func (c *Coord) effective() *waldenv1.Policy {
	p, _ := policy.Effective(c.config, c.st.PolicyOverrides())
	return p
}

// applyCommitted applies every committed entry not yet applied.
func (c *Coord) applyCommitted() {
	for c.applied < len(c.w.raft.log) {
		c.applyOne()
	}
	var rest []readWaiter
	for _, r := range c.reads {
		if uint64(c.applied) >= r.index {
			r.done()
		} else {
			rest = append(rest, r)
		}
	}
	c.reads = rest
}

func (c *Coord) applyOne() {
	w := c.w
	e := w.raft.log[c.applied]
	c.applied++
	var before map[string]uint64
	if w.check != nil {
		before = epochs(c.st)
	}
	res, err := c.st.Apply(uint64(w.cfg.Coordinators)+e.index, e.cmd)
	if w.check != nil {
		w.check.afterApply(c, e, before, res, err)
	}
	if df := e.cmd.GetDeclareFailed(); df != nil && err == nil && res.GetDeclareFailed().GetJobId() != "" {
		id := res.GetDeclareFailed().GetJobId()
		if _, ok := w.jobEpoch[id]; !ok {
			w.jobEpoch[id] = df.GetEpoch()
		}
		if j, ok := c.st.Job(id); ok && !c.replaying {
			c.onJob(j)
		}
	}
	if e.cmd.GetProposerId() == c.name && !c.replaying {
		if fn := c.waiters[e.cmd.GetRequestId()]; fn != nil {
			delete(c.waiters, e.cmd.GetRequestId())
			fn(res, err)
		}
	}
}

// whenApplied runs done once this member has applied index entries.
func (c *Coord) whenApplied(index uint64, done func()) {
	if uint64(c.applied) >= index {
		done()
		return
	}
	c.reads = append(c.reads, readWaiter{index: index, done: done})
}

// propose proposes op and calls done with its result, or with a timeout
// error after timeout.
func (c *Coord) propose(op any, timeout time.Duration, done func(*waldenv1.Result, error)) uint64 {
	w := c.w
	w.raft.nextRequest++
	id := w.raft.nextRequest
	cmd := &waldenv1.Command{RequestId: id, ProposedUnixMs: c.wallMs(), ProposerId: c.name}
	switch o := op.(type) {
	case *waldenv1.RegisterBroker:
		cmd.Op = &waldenv1.Command_RegisterBroker{RegisterBroker: o}
	case *waldenv1.ObserveBroker:
		cmd.Op = &waldenv1.Command_ObserveBroker{ObserveBroker: o}
	case *waldenv1.DeclareFailed:
		cmd.Op = &waldenv1.Command_DeclareFailed{DeclareFailed: o}
	case *waldenv1.SetPolicy:
		cmd.Op = &waldenv1.Command_SetPolicy{SetPolicy: o}
	case *waldenv1.FinishJob:
		cmd.Op = &waldenv1.Command_FinishJob{FinishJob: o}
	case *waldenv1.RecordEvent:
		cmd.Op = &waldenv1.Command_RecordEvent{RecordEvent: o}
	default:
		panic(fmt.Sprintf("sim: propose %T", op))
	}
	finished := false
	c.waiters[id] = func(r *waldenv1.Result, err error) {
		if !finished {
			finished = true
			done(r, err)
		}
	}
	w.onHost(c.idx, timeout, func() {
		if !finished {
			finished = true
			delete(c.waiters, id)
			done(nil, errTimeout)
		}
	})
	w.raft.propose(c.idx, cmd)
	return id
}

var errTimeout = fmt.Errorf("sim: timed out")

// answer is what a coordinator replies to an agent.
type answer struct {
	epoch  uint64
	ttl    time.Duration
	reason string // a fencing reason, "UNAVAILABLE", or "" on success
}

// forward relays an agent request to the member this one believes leads
// (a follower forwards Register and RenewLease).
func (c *Coord) forward(handle func(*Coord, func(answer)), reply func(answer)) {
	w := c.w
	target := w.raft.believedLeader[c.idx]
	if target < 0 || target == c.idx {
		reply(answer{reason: "UNAVAILABLE"})
		return
	}
	w.call(c.idx, target, 2*time.Second, func(r func(any)) {
		handle(w.coords[target], func(a answer) { r(a) })
	}, func(resp any, timedOut bool) {
		if timedOut {
			reply(answer{reason: "UNAVAILABLE"})
			return
		}
		reply(resp.(answer))
	})
}

// handleRegister is Agent.Register.
func (c *Coord) handleRegister(broker string, reply func(answer)) {
	if ok, _ := c.w.raft.believesLeader(c.idx); !ok {
		c.forward(func(l *Coord, r func(answer)) { l.handleRegisterAsLeader(broker, r) }, reply)
		return
	}
	c.handleRegisterAsLeader(broker, reply)
}

func (c *Coord) handleRegisterAsLeader(broker string, reply func(answer)) {
	if ok, _ := c.w.raft.believesLeader(c.idx); !ok {
		reply(answer{reason: "UNAVAILABLE"})
		return
	}
	c.propose(&waldenv1.RegisterBroker{BrokerId: broker, AgentAddr: broker}, 2*time.Second, func(res *waldenv1.Result, err error) {
		if err != nil {
			reply(answer{reason: reasonOf(err)})
			return
		}
		p := c.effective()
		epoch := res.GetRegisterBroker().GetEpoch()
		c.leases.Renew(broker, epoch, c.monoTime(), ms(p.GetLeaseTtlMs()))
		reply(answer{epoch: epoch, ttl: ms(p.GetLeaseTtlMs())})
	})
}

// handleRenew is Agent.RenewLease.
func (c *Coord) handleRenew(broker string, epoch uint64, reply func(answer)) {
	if ok, _ := c.w.raft.believesLeader(c.idx); !ok {
		c.forward(func(l *Coord, r func(answer)) { l.handleRenewAsLeader(broker, epoch, r) }, reply)
		return
	}
	c.handleRenewAsLeader(broker, epoch, reply)
}

func (c *Coord) handleRenewAsLeader(broker string, epoch uint64, reply func(answer)) {
	if ok, _ := c.w.raft.believesLeader(c.idx); !ok {
		reply(answer{reason: "UNAVAILABLE"})
		return
	}
	at := c.monoTime()
	c.w.raft.readIndex(c.idx, func() {
		if err := c.st.CheckBroker(broker, epoch, nil); err != nil {
			reply(answer{reason: reasonOf(err)})
			return
		}
		ttl := c.effective().GetLeaseTtlMs()
		if !c.leases.Renew(broker, epoch, at, ms(ttl)) {
			reply(answer{reason: "DECLARING"})
			return
		}
		c.w.tracef("%s grants %s@%d ttl %dms", c.name, broker, epoch, ttl)
		reply(answer{epoch: epoch, ttl: ms(ttl)})
	})
}

// handleFailover is Brokers.Failover (manual failover by an operator).
func (c *Coord) handleFailover(broker string) {
	w := c.w
	ok, term := w.raft.believesLeader(c.idx)
	if !ok {
		target := w.raft.believedLeader[c.idx]
		if target >= 0 && target != c.idx {
			w.send(c.idx, target, func() { w.coords[target].handleFailover(broker) })
		}
		return
	}
	w.raft.readIndex(c.idx, func() {
		b, ok := c.st.Broker(broker)
		if !ok || b.GetFenced() {
			return
		}
		p := c.effective()
		remaining := c.leases.ForceDeclare(broker, b.GetEpoch(), ms(p.GetLeaseTtlMs()), c.monoTime())
		ev := &waldenv1.Evidence{Manual: true, Reason: "manual failover", DecidedBy: c.name,
			LeaseWaitMs: max(remaining.Milliseconds()+p.GetDriftMarginMs(), 0)}
		w.tracef("%s manual failover of %s@%d, lease wait %dms", c.name, broker, b.GetEpoch(), ev.GetLeaseWaitMs())
		id := c.propose(&waldenv1.DeclareFailed{BrokerId: broker, Epoch: b.GetEpoch(), Evidence: ev, LiveMembers: c.liveMembers()},
			2*time.Second, func(res *waldenv1.Result, err error) {
				if err != nil && fencing.Reason(err) != "" {
					c.leases.AbortDeclare(broker, b.GetEpoch())
				}
			})
		w.raft.decidedTerm[id] = term
	})
}

func (c *Coord) liveMembers() []string {
	var out []string
	for _, m := range c.st.Members() {
		out = append(out, m.GetId())
	}
	return out
}

func (c *Coord) voters() []string { return c.liveMembers() }

// deciderTick is one round of detect.Decider.Tick.
func (c *Coord) deciderTick() {
	w := c.w
	defer w.onHost(c.idx, 150*time.Millisecond, c.deciderTick)
	leader, term := w.raft.believesLeader(c.idx)
	now := c.monoTime()
	if !leader {
		c.deciderTerm, c.mem = 0, detect.Memory{}
		return
	}
	if c.deciderTerm != term {
		c.deciderTerm, c.mem = term, detect.Memory{}
		c.leases.Reset(now)
	}
	p := c.effective()
	ttl := ms(p.GetLeaseTtlMs())
	brokers := c.st.Brokers()
	expiry := map[string]time.Time{}
	for _, b := range brokers {
		expiry[b.GetBrokerId()] = c.leases.ExpiresAt(b.GetBrokerId(), b.GetEpoch(), ttl)
	}
	dec := detect.Decide(detect.Input{
		Now: now, NowUnixMs: c.wallMs(), LeaderSince: c.leases.LeaderSince(), LeaderID: c.name, Term: term,
		Policy: p, Voters: c.voters(), LiveMembers: c.liveMembers(), Brokers: brokers, LeaseExpiry: expiry,
		RunningRecoveries: c.st.ActiveJobs(), Memory: c.mem,
	})
	c.mem = dec.Memory
	for _, df := range dec.Declare {
		if !df.GetDryRun() && !c.leases.BeginDeclare(df.GetBrokerId(), df.GetEpoch(), ttl, ms(p.GetDriftMarginMs()), c.monoTime()) {
			continue
		}
		w.tracef("%s (term %d) declares %s@%d failed: %s", c.name, term, df.GetBrokerId(), df.GetEpoch(), df.GetEvidence().GetReason())
		// The proposal leaves the decider a moment later (the tick's own
		// work): the leadership may have moved meanwhile.
		df := df
		w.onHost(c.idx, time.Duration(w.rng.Int64N(int64(20*time.Millisecond))), func() {
			id := c.propose(df, 2*time.Second, func(res *waldenv1.Result, err error) {
				if err != nil && fencing.Reason(err) != "" {
					c.leases.AbortDeclare(df.GetBrokerId(), df.GetEpoch())
				}
			})
			w.raft.decidedTerm[id] = term
		})
	}
}

// observeRound is one round of detect.Observer: probe every observed broker
// and propose the observations that changed (3 failed probes: suspect).
func (c *Coord) observeRound() {
	w := c.w
	defer w.onHost(c.idx, time.Second, c.observeRound)
	for _, b := range c.st.Brokers() {
		if b.GetFenced() || b.GetMaintenance() {
			continue
		}
		id, epoch := b.GetBrokerId(), b.GetEpoch()
		a := w.agentByName(id)
		w.call(c.idx, a.idx, 500*time.Millisecond, func(reply func(any)) { reply(true) }, func(_ any, timedOut bool) {
			ps := c.probes[id]
			if ps == nil || ps.epoch != epoch {
				ps = &probeState{epoch: epoch}
				c.probes[id] = ps
			}
			if timedOut {
				ps.failures++
			} else {
				ps.failures, ps.ok = 0, true
			}
			state := ""
			switch {
			case ps.failures >= 3:
				state = fsm.ObservedSuspect
			case ps.failures == 0 && ps.ok:
				state = fsm.ObservedAlive
			}
			if state == "" || state == committedObservation(c.st, id, c.name) {
				return
			}
			c.propose(&waldenv1.ObserveBroker{ObserverId: c.name, BrokerId: id, State: state}, 2*time.Second,
				func(*waldenv1.Result, error) {})
		})
	}
}

func committedObservation(st *fsm.State, broker, observer string) string {
	b, ok := st.Broker(broker)
	if !ok {
		return ""
	}
	for _, o := range b.GetObservations() {
		if o.GetObserverId() == observer {
			return o.GetState()
		}
	}
	return ""
}

// onJob: the assignee of a new recovery job runs it (waits out lease_wait_ms, then reads the WAL and finishes).
func (c *Coord) onJob(j *waldenv1.Job) {
	w := c.w
	if j.GetAssigneeId() != c.name {
		return
	}
	wait := ms(j.GetLeaseWaitMs())
	w.tracef("%s runs %s: lease wait %s", c.name, j.GetJobId(), wait)
	w.onHost(c.idx, wait, func() {
		w.check.walRead(j.GetBrokerId(), w.jobEpoch[j.GetJobId()])
		w.onHost(c.idx, 200*time.Millisecond, func() {
			c.propose(&waldenv1.FinishJob{JobId: j.GetJobId(), Attempt: j.GetAttempt(), State: fsm.JobSucceeded}, 2*time.Second,
				func(*waldenv1.Result, error) {})
		})
	})
}

// reasonOf returns the refusal reason of a state machine error.
func reasonOf(err error) string {
	if err == errTimeout {
		return "UNAVAILABLE"
	}
	if r := fencing.Reason(err); r != "" {
		return r
	}
	return "UNAVAILABLE"
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
