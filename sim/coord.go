package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"walden/detect"
	"walden/fsm"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// Coord is one simulated coordinator running the project's own code: the
// state machine (fsm.State), the grant rule (detect.Grant over a
// lease.Grantor whose durable state survives restarts), the observer's
// planning (detect.Observer.Plan) and the decision function
// (detect.Decide). What the simulation supplies is the order of the steps
// of server/agent_service.go, server/brokers_service.go and detect.Decider,
// and their network and raft.
type Coord struct {
	w    *World
	idx  int // index in w.coords and w.hosts
	name string

	st      *fsm.State
	applied int // entries of w.raft.log applied
	waiters map[uint64]func(*waldenv1.Result, error)
	reads   []readWaiter

	// config is the policy: section of this member's config file (the
	// seed, when it is the first leader).
	config *waldenv1.Policy
	// store is the member's durable lease state (it survives restarts).
	store    *lease.MemStore
	grantor  *lease.Grantor
	observer *detect.Observer

	deciderTerm uint64
	leaderSince time.Time
	mem         detect.Memory
	seedAt      int64

	// replaying is set while a restarted member replays the log.
	replaying bool
	// epochSince is the real time this member applied each broker's
	// current epoch (for the liveness check: it cannot grant before).
	epochSince map[string]int64
	// quietEnd is the real time the grantor's quiet period after the last
	// start ends.
	quietEnd int64
	// emptyDataDir is set for the start after a replacement.
	emptyDataDir bool
	// reconciled is the term (plus 2^32 for the plan) in which this
	// member, as leader, last proposed a step of a restore's
	// reconciliation.
	reconciled uint64
}

type readWaiter struct {
	index uint64
	done  func()
}

func newCoord(w *World, i int) *Coord {
	c := &Coord{w: w, idx: i, name: w.hosts[i].name, config: w.basePolicy(), store: &lease.MemStore{}}
	c.reset()
	return c
}

// clock is the host's boot clock.
func (c *Coord) clock() lease.Clock {
	h := c.host()
	return lease.ClockFunc(func() time.Duration { return time.Duration(h.boot(c.w.now)) })
}

// reset gives the coordinator the memory of a fresh process: the state
// machine replayed from the committed log, the lease state from its store,
// nothing else.
func (c *Coord) reset() {
	w := c.w
	c.st = w.initialState()
	c.applied = 0
	c.epochSince = map[string]int64{}
	c.waiters = map[uint64]func(*waldenv1.Result, error){}
	c.reads = nil
	c.deciderTerm, c.mem = 0, detect.Memory{}
	c.replaying = true
	for c.applied < len(w.raft.log) {
		c.applyOne()
	}
	c.replaying = false
	ttl, drift := ms(c.config.GetLeaseTtlMs()), ms(c.config.GetDriftMarginMs())
	// A member with an empty data dir starts its grantor before it has
	// anything of the log (server/detection.go): its config file alone.
	if p, _, seeded := c.st.Policy(); seeded && !c.emptyDataDir {
		ttl, drift = max(ttl, ms(p.GetLeaseTtlMs())), max(drift, ms(p.GetDriftMarginMs()))
	}
	g, err := lease.NewGrantor(c.clock(), c.store, ttl, drift)
	if err != nil {
		panic(err)
	}
	c.grantor = g
	quiet := g.QuietFor()
	if ms, ok := c.leaseHorizon(); ok {
		quiet = max(quiet, time.Duration(ms)*time.Millisecond)
	}
	c.quietEnd = w.now + int64(float64(quiet)/c.host().rate)
	// Every entry of the log before this start may have been granted by a
	// former run: the observer vouches only for epochs registered after.
	start := w.raft.indexBase() + uint64(len(w.raft.log))
	c.observer = detect.NewObserver(detect.ObserverConfig{NodeID: c.name, Grantor: g, Clock: c.clock(),
		StartIndex: start, Logger: slog.New(slog.DiscardHandler)}, mutatedState{c}, nil, nil)
	for _, j := range c.st.Jobs("", waldenv1.JobState_JOB_STATE_PENDING) {
		c.onJob(j)
	}
}

// initialState is the state before the log's first entry: the restored
// cluster's, or the founding members' configuration.
func (w *World) initialState() *fsm.State {
	st := fsm.New("sim")
	if w.raft.base != nil {
		if err := st.Restore(w.raft.base); err != nil {
			panic(err)
		}
		return st
	}
	for i := range w.cfg.Coordinators {
		name := fmt.Sprintf("c%d", i+1)
		cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(uint64(i + 1))}}}
		if err := st.ApplyConfChange(uint64(i+1), cc, &waldenv1.ConfChangeContext{Member: &waldenv1.MemberContext{Id: name}}, nil); err != nil {
			panic(err)
		}
	}
	return st
}

func (c *Coord) host() *host { return c.w.hosts[c.idx] }

func (c *Coord) bootTime() time.Time { return time.Unix(0, c.host().boot(c.w.now)) }

func (c *Coord) wallMs() int64 { return 1_700_000_000_000 + c.w.now/1e6 }

func (c *Coord) start() {
	c.w.onHost(c.idx, 150*time.Millisecond, c.deciderTick)
	c.w.onHost(c.idx, time.Duration(c.w.rng.Int64N(int64(time.Second))), c.observeRound)
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
	if e.cc != nil {
		if err := c.st.ApplyConfChange(w.raft.indexBase()+e.index, e.cc, e.ctx, nil); err != nil {
			w.tracef("%s: membership change at %d refused: %v", c.name, e.index, err)
		}
		return
	}
	var before map[string]uint64
	if w.check != nil {
		before = epochs(c.st)
	}
	res, err := c.st.Apply(w.raft.indexBase()+e.index, e.term, e.cmd)
	if w.check != nil {
		w.check.afterApply(c, e, before, res, err)
	}
	if rb := e.cmd.GetRegisterBroker(); rb != nil && err == nil {
		c.epochSince[rb.GetBrokerId()] = w.now
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
	if e.cmd.GetReconcileScan() != nil && err == nil && !c.replaying {
		for _, id := range c.st.RestoreState().GetJobIds() {
			if j, ok := c.st.Job(id); ok {
				c.onJob(j)
			}
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
	case *waldenv1.SeedPolicy:
		cmd.Op = &waldenv1.Command_SeedPolicy{SeedPolicy: o}
	case *waldenv1.RequestFailover:
		cmd.Op = &waldenv1.Command_RequestFailover{RequestFailover: o}
	case *waldenv1.FinishJob:
		cmd.Op = &waldenv1.Command_FinishJob{FinishJob: o}
	case *waldenv1.RecordEvent:
		cmd.Op = &waldenv1.Command_RecordEvent{RecordEvent: o}
	case *waldenv1.OpenStreamRequest:
		cmd.Op = &waldenv1.Command_OpenStream{OpenStream: o}
	case *waldenv1.CommitObjectRequest:
		cmd.Op = &waldenv1.Command_CommitObject{CommitObject: o}
	case *waldenv1.CloseStreamRequest:
		cmd.Op = &waldenv1.Command_CloseStream{CloseStream: o}
	case *waldenv1.CheckpointJob:
		cmd.Op = &waldenv1.Command_CheckpointJob{CheckpointJob: o}
	case *waldenv1.ReconcileScan:
		cmd.Op = &waldenv1.Command_ReconcileScan{ReconcileScan: o}
	case *waldenv1.ReconcileObjects:
		cmd.Op = &waldenv1.Command_ReconcileObjects{ReconcileObjects: o}
	case *waldenv1.ReconcilePlan:
		cmd.Op = &waldenv1.Command_ReconcilePlan{ReconcilePlan: o}
	default:
		panic(fmt.Sprintf("sim: propose %T", op))
	}
	fsm.PrepareProposal(cmd) // as raftnode does: the entry's check level
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

var errTimeout = errors.New("sim: timed out")

// answer is what a coordinator replies to an agent.
type answer struct {
	epoch  uint64
	ttl    time.Duration
	reason string // a fencing reason, "UNAVAILABLE", or "" on success
	// coordinator, voters and confIndex come with a grant.
	coordinator  string
	voters       []string
	incarnations []uint64
	confIndex    uint64
}

// handleRegister is Agent.Register: a follower forwards to the member it
// believes leads; the leader proposes RegisterBroker.
func (c *Coord) handleRegister(broker string, reply func(answer)) {
	w := c.w
	if ok, _ := w.raft.believesLeader(c.idx); !ok {
		target := w.raft.believedLeader[c.idx]
		if target < 0 || target == c.idx {
			reply(answer{reason: "UNAVAILABLE"})
			return
		}
		w.call(c.idx, target, 2*time.Second, func(r func(any)) {
			w.coords[target].handleRegisterAsLeader(broker, func(a answer) { r(a) })
		}, func(resp any, timedOut bool) {
			if timedOut {
				reply(answer{reason: "UNAVAILABLE"})
				return
			}
			reply(resp.(answer))
		})
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
		p, _, _ := c.st.Policy()
		reply(answer{epoch: res.GetRegisterBroker().GetEpoch(), ttl: ms(p.GetLeaseTtlMs())})
	})
}

// handleRenew is Agent.RenewLease: granted here, from this member's applied
// state and clock. A refusal that may come from lagging behind the log (an
// unknown broker, or an epoch newer than the one applied) is confirmed by a
// ReadIndex round first.
func (c *Coord) handleRenew(broker string, epoch uint64, reply func(answer)) {
	grant := func() {
		resp, err := detect.Grant(mutatedState{c}, c.grantor, c.name, broker, epoch)
		if err != nil {
			reply(answer{reason: reasonOf(err)})
			return
		}
		a := answer{epoch: epoch, ttl: ms(resp.GetLeaseTtlMs()), coordinator: c.name, confIndex: resp.GetConfIndex()}
		for _, v := range resp.GetVoters() {
			a.voters = append(a.voters, v.GetId())
			a.incarnations = append(a.incarnations, v.GetIncarnation())
		}
		reply(a)
	}
	if err := c.st.CheckBroker(broker, epoch, nil); err != nil {
		if b, known := c.st.Broker(broker); !known || epoch >= b.GetEpoch() {
			c.w.raft.readIndex(c.idx, grant)
			return
		}
	}
	grant()
}

// handleFailover is Brokers.Failover: an operator's request, replicated;
// the coordinators stop renewing the epoch and the leader decides once a
// majority attests.
func (c *Coord) handleFailover(broker string) {
	b, ok := c.st.Broker(broker)
	if !ok || b.GetFenced() {
		return
	}
	c.w.tracef("%s: operator requests the failover of %s@%d", c.name, broker, b.GetEpoch())
	c.propose(&waldenv1.RequestFailover{BrokerId: broker, Epoch: b.GetEpoch(), Reason: "operator", Actor: "operator"}, 2*time.Second,
		func(*waldenv1.Result, error) {})
}

func (c *Coord) liveMembers() []string {
	var out []string
	for _, m := range c.st.Members() {
		out = append(out, m.GetId())
	}
	return out
}

// deciderTick is one round of detect.Decider.Tick.
func (c *Coord) deciderTick() {
	w := c.w
	defer w.onHost(c.idx, 150*time.Millisecond, c.deciderTick)
	leader, term := w.raft.believesLeader(c.idx)
	now := c.bootTime()
	if !leader {
		c.deciderTerm, c.mem = 0, detect.Memory{}
		return
	}
	if c.deciderTerm != term {
		c.deciderTerm, c.mem, c.leaderSince, c.seedAt = term, detect.Memory{}, now, 0
	}
	c.reconcileTick(term)
	p, _, seeded := c.st.Policy()
	if !seeded {
		if c.seedAt == 0 || now.UnixNano()-c.seedAt >= int64(time.Second) {
			c.seedAt = now.UnixNano()
			c.propose(&waldenv1.SeedPolicy{Policy: c.config, SeededBy: c.name}, 2*time.Second, func(*waldenv1.Result, error) {})
		}
		return
	}
	dec := detect.Decide(detect.Input{
		Now: now, NowUnixMs: c.wallMs(), LeaderSince: c.leaderSince, LeaderID: c.name, Term: term,
		Policy: p, Voters: c.st.Voters(), LiveMembers: c.liveMembers(), Brokers: c.st.Brokers(),
		RunningRecoveries: c.st.ActiveJobs(), Memory: c.mem,
	})
	c.mem = dec.Memory
	for _, df := range dec.Declare {
		w.tracef("%s (term %d) declares %s@%d failed: %s", c.name, term, df.GetBrokerId(), df.GetEpoch(), df.GetEvidence().GetReason())
		// The proposal leaves the decider a moment later (the tick's own
		// work): the leadership may have moved meanwhile.
		df := df
		w.onHost(c.idx, time.Duration(w.rng.Int64N(int64(20*time.Millisecond))), func() {
			id := c.propose(df, 2*time.Second, func(res *waldenv1.Result, err error) {
				if err != nil && refusal.Of(err) != "" {
					w.tracef("%s: decision on %s refused: %s", c.name, df.GetBrokerId(), refusal.Of(err))
				}
			})
			w.raft.decidedTerm[id] = term
		})
	}
}

// observeRound is one round of detect.Observer: probe every observed
// broker, plan this member's observation (detect.Observer.Plan) and propose
// it; an applied withdrawal lifts the promise.
func (c *Coord) observeRound() {
	w := c.w
	defer w.onHost(c.idx, time.Second, c.observeRound)
	for _, b := range c.st.Brokers() {
		if b.GetFenced() {
			continue
		}
		id := b.GetBrokerId()
		a := w.agentByName(id)
		obs := c.observer
		w.call(c.idx, a.idx, 500*time.Millisecond, func(reply func(any)) { reply(true) }, func(_ any, timedOut bool) {
			cur, ok := c.st.Broker(id)
			if !ok || cur.GetFenced() || obs != c.observer {
				return
			}
			var probeErr error
			if timedOut || cur.GetEpoch() != b.GetEpoch() {
				probeErr = detect.ErrProbe
			}
			p, _, seeded := c.st.Policy()
			pr, ok := obs.Plan(cur, probeErr, true, p, seeded)
			if !ok {
				return
			}
			if pr.Observe.GetLeaseExpired() {
				w.tracef("%s attests %s@%d expired", c.name, id, pr.Observe.GetEpoch())
			}
			c.propose(pr.Observe, 2*time.Second, func(_ *waldenv1.Result, err error) {
				if err == nil && pr.Withdraw && obs == c.observer {
					w.tracef("%s withdrew its attestation for %s@%d", c.name, id, pr.Observe.GetEpoch())
					obs.Withdrawn(pr.Observe)
				}
			})
		})
	}
}

// onJob: the assignee of a new recovery job runs it: reads the WAL at once
// (the decision needed a majority of attestations), then finishes.
func (c *Coord) onJob(j *waldenv1.Job) {
	w := c.w
	if j.GetAssigneeId() != c.name {
		return
	}
	if j.GetRestore() {
		c.restoreJob(j)
		return
	}
	w.onHost(c.idx, ms(j.GetLeaseWaitMs()), func() {
		if !j.GetAcknowledgedNothing() {
			w.check.walRead(j.GetBrokerId(), w.jobEpoch[j.GetJobId()])
		} else {
			w.tracef("%s: job %s reads no WAL: epoch %d acknowledged nothing", c.name, j.GetJobId(), w.jobEpoch[j.GetJobId()])
		}
		w.onHost(c.idx, 200*time.Millisecond, func() { c.recoverData(j) })
	})
}

// reasonOf returns the refusal reason of an error.
func reasonOf(err error) string {
	if errors.Is(err, lease.ErrPromised) {
		return "LEASE_ATTESTED"
	}
	if r := refusal.Of(err); r != "" {
		return string(r)
	}
	return "UNAVAILABLE"
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// leaseHorizon is the cluster's lease horizon as this member's grantor is
// told it: the state's, or, under the mutation QuietFromConfigFile, its own
// config file's lease_ttl + drift_margin.
func (c *Coord) leaseHorizon() (int64, bool) {
	if c.w.cfg.Mutations.QuietFromConfigFile {
		return c.config.GetLeaseTtlMs() + c.config.GetDriftMarginMs(), true
	}
	return c.st.LeaseHorizon()
}

// mutatedState is the member's state as the grant rule and the observer
// read it, with the lease horizon of leaseHorizon.
type mutatedState struct{ c *Coord }

func (m mutatedState) Renewal(broker string, epoch uint64) (fsm.Renewal, error) {
	r, err := m.c.st.Renewal(broker, epoch)
	if err == nil {
		r.LeaseHorizonMs, _ = m.c.leaseHorizon()
	}
	return r, err
}

func (m mutatedState) Brokers() []*waldenv1.Broker { return m.c.st.Brokers() }
func (m mutatedState) ActiveJobs() int             { return m.c.st.ActiveJobs() }
func (m mutatedState) Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool) {
	return m.c.st.Policy()
}
func (m mutatedState) LeaseHorizon() (int64, bool) { return m.c.leaseHorizon() }
