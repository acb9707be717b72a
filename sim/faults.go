package sim

import (
	"math"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"walden/lease"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// expDelay draws an exponentially distributed delay with the given mean.
func (w *World) expDelay(mean time.Duration) int64 {
	return int64(-math.Log(1-w.rng.Float64()) * float64(mean))
}

// uniform draws a duration in [lo, hi].
func (w *World) uniform(lo, hi time.Duration) int64 {
	return int64(lo) + w.rng.Int64N(int64(hi-lo)+1)
}

// every runs fn at exponentially distributed intervals of mean.
func (w *World) every(mean time.Duration, fn func()) {
	var loop func()
	loop = func() {
		fn()
		w.after(w.expDelay(mean), loop)
	}
	w.after(w.expDelay(mean), loop)
}

// randomPolicy returns a valid policy with a random lease_ttl and timing.
func (w *World) randomPolicy() *waldenv1.Policy {
	for {
		p := policy.Defaults()
		p.CooldownMs = 0
		p.MaxFailedFraction = 1
		p.LeaseTtlMs = (10 + w.rng.Int64N(191)) * 100 // 1s … 20s
		p.DriftMarginMs = 500
		p.FailureTimeoutMs = p.LeaseTtlMs + p.DriftMarginMs + (1+w.rng.Int64N(100))*100
		if policy.Validate(p) == nil {
			return p
		}
	}
}

// basePolicy is the policy of every member's config file without
// ConfigDrift: the defaults, without the cooldown and the freeze (so that
// the simulation fails brokers over often).
func (w *World) basePolicy() *waldenv1.Policy {
	p := policy.Defaults()
	p.CooldownMs, p.MaxFailedFraction = 0, 1
	return p
}

func (w *World) startFaults() {
	f := w.cfg.Faults
	for _, c := range w.coords {
		if f.ConfigDrift {
			c.config = w.randomPolicy()
		}
	}
	w.check.ttlChanged(ms(w.coords[0].config.GetLeaseTtlMs()))
	for _, c := range w.coords {
		w.check.ttlChanged(ms(c.config.GetLeaseTtlMs()))
	}
	if f.LeaderChanges {
		w.every(20*time.Second, func() {
			next := w.rng.IntN(len(w.coords))
			if w.hosts[next].down || !w.mayLead(next) {
				return
			}
			w.raft.electLeader(next, 1500*time.Millisecond, 300*time.Millisecond)
			if f.ManualFailovers && w.rng.IntN(4) == 0 {
				// An operator acts right after the election.
				a := w.agents[w.rng.IntN(len(w.agents))]
				w.after(w.rng.Int64N(int64(100*time.Millisecond)), func() { w.manualFailover(a, next) })
			}
		})
	}
	if f.NetworkFaults {
		w.every(8*time.Second, w.networkFault)
		w.every(45*time.Second, w.isolateAgent)
	}
	if f.PolicyChanges {
		w.every(60*time.Second, func() {
			l := w.raft.leader
			if l < 0 || w.hosts[l].down {
				return
			}
			p := w.randomPolicy()
			set := map[string]string{
				policy.KeyLeaseTTL:       policy.Format(p, policy.KeyLeaseTTL),
				policy.KeyFailureTimeout: policy.Format(p, policy.KeyFailureTimeout),
			}
			w.tracef("operator: policy set lease_ttl=%s failure_timeout=%s", set[policy.KeyLeaseTTL], set[policy.KeyFailureTimeout])
			w.lastPolicyChange = w.now
			w.check.ttlChanged(ms(p.GetLeaseTtlMs()))
			w.coords[l].propose(&waldenv1.SetPolicy{Set: set}, 2*time.Second, func(*waldenv1.Result, error) {})
		})
	}
	if f.Suspends {
		w.every(60*time.Second, func() {
			a := w.agents[w.rng.IntN(len(w.agents))]
			w.suspend(a.idx, time.Duration(w.uniform(time.Second, 30*time.Second)))
		})
	}
	if f.Stalls {
		w.every(40*time.Second, func() {
			c := w.coords[w.rng.IntN(len(w.coords))]
			h := c.host()
			d := w.uniform(50*time.Millisecond, 3*time.Second)
			h.stalledUntil = max(h.stalledUntil, w.now+d)
			h.lastTrouble = w.now + d
			w.tracef("%s stalls for %.3fs", c.name, float64(d)/1e9)
		})
	}
	if f.Restarts {
		w.every(90*time.Second, func() {
			c := w.coords[w.rng.IntN(len(w.coords))]
			if c.host().down {
				return
			}
			w.crashCoord(c, time.Duration(w.uniform(time.Second, 10*time.Second)))
		})
	}
	if f.Replacements {
		w.every(100*time.Second, func() {
			c := w.coords[w.rng.IntN(len(w.coords))]
			if c.host().down || w.replacing || w.raft.leader == c.idx {
				return // the runbook replaces a follower, one at a time
			}
			w.replaceCoord(c, time.Duration(w.uniform(200*time.Millisecond, 3*time.Second)))
		})
	}
	if f.ReplacementScript {
		w.replacementScript()
	}
	if f.Restore {
		w.scheduleRestore()
	}
	if f.ForceNewCluster {
		w.scheduleForceNewCluster()
	}
	if f.ManualFailovers {
		w.every(90*time.Second, func() {
			a := w.agents[w.rng.IntN(len(w.agents))]
			w.manualFailover(a, w.rng.IntN(len(w.coords)))
		})
	}
	// Brokers die now and then, and come back.
	w.every(120*time.Second, func() {
		a := w.agents[w.rng.IntN(len(w.agents))]
		if a.host().down {
			return
		}
		w.tracef("%s killed", a.name)
		a.host().down = true
		a.host().incarnation++
		a.crash()
		w.after(w.uniform(5*time.Second, 30*time.Second), func() {
			a.host().down = false
			a.host().lastResume = w.now
			w.tracef("%s restarted", a.name)
			a.start()
		})
	})
}

// manualFailover has an operator fail a over through coordinator c.
func (w *World) manualFailover(a *Agent, c int) {
	if w.hosts[c].down {
		return
	}
	w.tracef("operator: failover %s through %s", a.name, w.coords[c].name)
	w.failoverRequestedAt[a.name] = w.now
	w.runOn(c, func() { w.coords[c].handleFailover(a.name) })
}

// networkFault degrades one link (or a pair) for a while, then heals it.
func (w *World) networkFault() {
	n := len(w.hosts)
	i := w.rng.IntN(n)
	j := w.rng.IntN(n - 1)
	if j >= i {
		j++
	}
	if i >= w.cfg.Coordinators && j >= w.cfg.Coordinators {
		return // agents do not talk to each other
	}
	both := w.rng.IntN(2) == 0
	mode := w.rng.IntN(3)
	d := w.uniform(500*time.Millisecond, 15*time.Second)
	apply := func(l *link) {
		switch mode {
		case 0:
			l.cut = true
		case 1:
			l.loss = 0.2
			l.jitter = int64(100 * time.Millisecond)
		default:
			l.jitter = int64(400 * time.Millisecond)
		}
	}
	links := []*link{w.links[i][j]}
	if both {
		links = append(links, w.links[j][i])
	}
	w.tracef("net: %s→%s degraded (mode %d, both ways %t) for %.1fs", w.hosts[i].name, w.hosts[j].name, mode, both, float64(d)/1e9)
	for _, l := range links {
		apply(l)
		l.goodSince = -1
	}
	w.after(d, func() {
		for _, l := range links {
			l.cut, l.loss, l.jitter = false, 0, int64(2*time.Millisecond)
			l.goodSince = w.now
		}
		w.tracef("net: %s→%s healed", w.hosts[i].name, w.hosts[j].name)
	})
}

// isolateAgent cuts one agent off from every coordinator, both ways, for a
// while (the broker keeps running: a partition, not a crash).
func (w *World) isolateAgent() {
	a := w.agents[w.rng.IntN(len(w.agents))]
	d := w.uniform(2*time.Second, 30*time.Second)
	w.tracef("net: %s cut off from every coordinator for %.1fs", a.name, float64(d)/1e9)
	var links []*link
	for _, c := range w.coords {
		links = append(links, w.links[a.idx][c.idx], w.links[c.idx][a.idx])
	}
	for _, l := range links {
		l.cut = true
		l.goodSince = -1
	}
	w.after(d, func() {
		for _, l := range links {
			l.cut = false
			l.goodSince = w.now
		}
		w.tracef("net: %s reconnected", a.name)
	})
}

// suspend suspends host h (its monotonic clock stops, its boot clock runs).
func (w *World) suspend(h int, d time.Duration) {
	hh := w.hosts[h]
	if hh.down || hh.suspendedSince >= 0 {
		return
	}
	w.tracef("%s: host suspended for %.1fs", hh.name, d.Seconds())
	hh.suspendedSince = w.now
	w.after(int64(d), func() {
		hh.suspendedTotal += w.now - hh.suspendedSince
		hh.suspendedSince = -1
		hh.lastResume = w.now
		w.tracef("%s: host resumed", hh.name)
		fns := w.hostTimers(h).fns
		w.hostTimers(h).fns = nil
		for _, fn := range fns {
			fn()
		}
	})
}

// startEmpty starts coordinator c's host again with an empty data dir (no
// lease state) and the default policy in its config file, as a member
// replaced after its disk was lost.
func (w *World) startEmpty(c *Coord) {
	h := c.host()
	h.down = false
	h.lastTrouble = w.now
	c.store = &lease.MemStore{}
	c.config = w.basePolicy()
	w.raft.believedLeader[c.idx], w.raft.believedTerm[c.idx] = w.raft.leader, w.raft.term
	c.emptyDataDir = true
	c.reset()
	c.emptyDataDir = false
	w.tracef("%s started with an empty data dir", c.name)
	c.start()
}

// replaceCoord replaces coordinator c under its name, as the runbook does
// after its disk is lost: it dies, its removal is committed, it is added
// again as a learner and started after d with an empty data dir (no lease
// state) and the default policy in its config file; the learner is promoted
// once the spacing of voter changes (the cluster's lease horizon) has
// passed since the removal.
func (w *World) replaceCoord(c *Coord, d time.Duration) {
	h := c.host()
	w.replacing = true
	w.tracef("%s replaced under its name: killed, data dir lost", c.name)
	h.down = true
	h.incarnation++
	id := uint64(c.idx + 1)
	ctx := &waldenv1.ConfChangeContext{Member: &waldenv1.MemberContext{Id: c.name}}
	change := func(t raftpb.ConfChangeType) *raftpb.ConfChangeV2 {
		return &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: t.Enum(), NodeId: new(id)}}}
	}
	w.raft.commitConf(change(raftpb.ConfChangeRemoveNode), nil)
	spacing := 200 * time.Millisecond
	if l := w.raft.leader; l >= 0 && !w.cfg.Mutations.NoVoterChangeSpacing {
		ms, _ := w.coords[l].st.LeaseHorizon()
		spacing = max(spacing, time.Duration(ms)*time.Millisecond)
	}
	w.after(int64(50*time.Millisecond), func() {
		w.raft.commitConf(change(raftpb.ConfChangeAddLearnerNode), ctx)
		w.tracef("operator: %s added again as a learner", c.name)
	})
	w.after(int64(d), func() { w.startEmpty(c) })
	w.after(int64(max(spacing, d+time.Second)), func() {
		w.raft.commitConf(change(raftpb.ConfChangeAddNode), ctx)
		w.tracef("raft: %s promoted to voter (%.1fs after its removal)", c.name, float64(max(spacing, d+time.Second))/1e9)
		w.replacing = false
	})
}

// replacementScript schedules the scenario of Faults.ReplacementScript,
// with the times drawn from the seed.
func (w *World) replacementScript() {
	a := w.agents[0]
	c1, c2, c3 := w.coords[0], w.coords[1], w.coords[2]
	cut := func(x, y int) {
		for _, l := range []*link{w.links[x][y], w.links[y][x]} {
			l.cut, l.goodSince = true, -1
		}
	}
	heal := func(x, y int) {
		for _, l := range []*link{w.links[x][y], w.links[y][x]} {
			l.cut, l.goodSince = false, w.now
		}
	}
	t := w.uniform(15*time.Second, 25*time.Second)
	w.at(t, func() {
		l := w.raft.leader
		if l < 0 {
			return
		}
		w.raft.electLeader(c1.idx, 0, 100*time.Millisecond) // the replaced member is a follower
		set := map[string]string{policy.KeyLeaseTTL: "12s", policy.KeyFailureTimeout: "20s"}
		w.tracef("operator: policy set lease_ttl=12s failure_timeout=20s")
		w.lastPolicyChange = w.now
		w.check.ttlChanged(12 * time.Second)
		w.after(int64(200*time.Millisecond), func() {
			w.coords[w.raft.leader].propose(&waldenv1.SetPolicy{Set: set}, 2*time.Second, func(*waldenv1.Result, error) {})
		})
	})
	t += w.uniform(20*time.Second, 30*time.Second)
	w.at(t, func() {
		w.tracef("net: %s cut off from %s", a.name, c2.name)
		cut(a.idx, c2.idx)
	})
	t += w.uniform(15*time.Second, 25*time.Second)
	w.at(t, func() {
		w.tracef("net: %s cut off from %s and %s", a.name, c1.name, c3.name)
		cut(a.idx, c1.idx)
		cut(a.idx, c3.idx)
		w.replaceCoord(c3, time.Duration(w.uniform(200*time.Millisecond, time.Second)))
	})
	t += w.uniform(time.Second, 2*time.Second)
	w.at(t, func() { w.manualFailover(a, c1.idx) })
	w.at(t+int64(40*time.Second), func() {
		heal(a.idx, c1.idx)
		heal(a.idx, c2.idx)
		heal(a.idx, c3.idx)
		w.tracef("net: %s reconnected", a.name)
	})
}

// crashCoord kills coordinator c and restarts it after d with its memory
// lost (its state machine replays the committed log).
func (w *World) crashCoord(c *Coord, d time.Duration) {
	h := c.host()
	w.tracef("%s killed", c.name)
	h.down = true
	h.incarnation++
	if w.raft.leader == c.idx {
		// The others elect a new leader.
		for k := 1; k < len(w.coords); k++ {
			next := (c.idx + k) % len(w.coords)
			if !w.hosts[next].down {
				w.raft.electLeader(next, 0, 300*time.Millisecond)
				break
			}
		}
	}
	w.after(int64(d), func() {
		h.down = false
		h.lastTrouble = w.now
		w.raft.believedLeader[c.idx], w.raft.believedTerm[c.idx] = -1, 0
		c.reset()
		w.after(w.uniform(10*time.Millisecond, 300*time.Millisecond), func() {
			if w.raft.believedTerm[c.idx] < w.raft.term {
				w.raft.believedLeader[c.idx], w.raft.believedTerm[c.idx] = w.raft.leader, w.raft.term
			}
		})
		w.tracef("%s restarted", c.name)
		c.start()
	})
}
