package sim

import (
	"time"

	"walden/lease"
)

// Agent is one simulated broker agent: the registration loop and the
// per-coordinator renewal loops of package agent reduced to their order of
// steps, and its lease rule — the project's own lease.Holder on the host's
// boot clock.
type Agent struct {
	w    *World
	idx  int // host index
	name string

	registered bool
	epoch      uint64
	fenced     bool
	holder     *lease.Holder
	last       int // coordinator that answered the last registration
	// registeredAt is the real time of the current epoch's registration.
	registeredAt int64
	gen          int // loop generation: a new registration starts a new one

	// wal is the broker's WAL: the records written and not trimmed (its
	// disk: it survives a crash); data its serving state (data.go).
	wal  []simRec
	data *dataPlane
}

func newAgent(w *World, h int) *Agent {
	return &Agent{w: w, idx: h, name: w.hosts[h].name, holder: lease.NewHolder(500 * time.Millisecond)}
}

func (w *World) agentByName(name string) *Agent {
	for _, a := range w.agents {
		if a.name == name {
			return a
		}
	}
	panic("sim: no agent " + name)
}

func (a *Agent) host() *host { return a.w.hosts[a.idx] }

// now is the agent's boot clock (it keeps running through a host suspend).
func (a *Agent) now() time.Duration { return time.Duration(a.host().boot(a.w.now)) }

func (a *Agent) start() {
	a.w.onHost(a.idx, time.Duration(a.w.rng.Int64N(int64(time.Second))), a.register)
}

// crash stops the agent like kill -9: it loses everything.
func (a *Agent) crash() {
	a.registered, a.epoch, a.fenced = false, 0, false
	a.holder = lease.NewHolder(500 * time.Millisecond)
	a.gen++
	a.data = nil
}

// valid is the agent's lease rule at this instant, on its own clock.
func (a *Agent) valid() (epoch uint64, ok bool) {
	if !a.registered || a.fenced || a.host().down {
		return a.epoch, false
	}
	ok, _ = a.holder.Valid(a.now())
	return a.epoch, ok
}

// register asks the coordinators, one after another, for a new epoch.
func (a *Agent) register() {
	w := a.w
	gen := a.gen
	var try func(i int)
	try = func(i int) {
		if a.gen != gen {
			return
		}
		c := (a.last + i) % w.cfg.Coordinators
		w.call(a.idx, c, 2*time.Second, func(reply func(any)) {
			w.coords[c].handleRegister(a.name, func(ans answer) { reply(ans) })
		}, func(resp any, timedOut bool) {
			if a.gen != gen {
				return
			}
			if timedOut || resp.(answer).reason != "" {
				w.onHost(a.idx, 200*time.Millisecond, func() { try(i + 1) })
				return
			}
			ans := resp.(answer)
			a.gen++
			a.last = c
			a.registered, a.epoch, a.fenced = true, ans.epoch, false
			a.holder.SetEpoch(ans.epoch)
			a.holder.Revoke()
			a.registeredAt = w.now
			w.check.agentEpoch(a)
			w.tracef("%s registered with epoch %d", a.name, ans.epoch)
			for k := range w.cfg.Coordinators {
				a.renewWith(a.gen, k, ans.ttl)
			}
			a.serve(a.gen, ans.epoch)
		})
	}
	try(0)
}

// renewWith renews with coordinator c every ttl/3, an attempt bounded by
// ttl/6, retrying every ttl/12 after a failure.
func (a *Agent) renewWith(gen, c int, ttl time.Duration) {
	w := a.w
	var round func()
	round = func() {
		if a.gen != gen {
			return
		}
		sent := a.now()
		epoch := a.epoch
		w.call(a.idx, c, max(ttl/6, 50*time.Millisecond), func(reply func(any)) {
			w.coords[c].handleRenew(a.name, epoch, func(ans answer) { reply(ans) })
		}, func(resp any, timedOut bool) {
			if a.gen != gen {
				return
			}
			if timedOut {
				w.onHost(a.idx, ttl/12, round)
				return
			}
			ans := resp.(answer)
			switch ans.reason {
			case "":
				ttl = ans.ttl
				a.holder.Granted(lease.Grant{Coordinator: ans.coordinator, Epoch: epoch, Sent: sent, TTL: ans.ttl},
					lease.Voters{IDs: ans.voters, Incarnations: ans.incarnations, Index: ans.confIndex})
				w.check.agentGranted(a)
				w.onHost(a.idx, max(ttl/3-(a.now()-sent), 0), round)
			case "NODE_FENCED", "EPOCH_EXPIRED", "UNKNOWN_NODE":
				w.tracef("%s: epoch %d refused by %s (%s)", a.name, epoch, w.coords[c].name, ans.reason)
				a.fenced = true
				a.holder.Revoke()
				a.gen++
				w.onHost(a.idx, 100*time.Millisecond, a.register)
			case "LEASE_ATTESTED", "FAILOVER_REQUESTED":
				a.holder.Lost(w.coords[c].name)
				w.onHost(a.idx, ttl/12, round)
			default:
				w.onHost(a.idx, ttl/12, round)
			}
		})
	}
	round()
}
