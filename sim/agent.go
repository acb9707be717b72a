package sim

import (
	"time"
)

// Agent is one simulated broker agent: the registration and renewal loop of
// package agent reduced to its order of steps, and its lease rule.
type Agent struct {
	w    *World
	idx  int // host index
	name string

	registered bool
	epoch      uint64
	fenced     bool
	// confirmedSent is the monotonic time the last granted renewal was
	// sent; confirmedTTL what it granted. 0: none.
	confirmedSent int64
	confirmedTTL  time.Duration
	margin        time.Duration
	last          int // coordinator that answered last
	// registeredAt is the real time of the current epoch's registration.
	registeredAt int64
	gen          int // loop generation: a new registration starts a new one
}

func newAgent(w *World, h int) *Agent {
	return &Agent{w: w, idx: h, name: w.hosts[h].name, margin: 500 * time.Millisecond}
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

func (a *Agent) start() {
	a.w.onHost(a.idx, time.Duration(a.w.rng.Int64N(int64(time.Second))), a.register)
}

// crash stops the agent like kill -9: it loses everything.
func (a *Agent) crash() {
	a.registered, a.epoch, a.fenced, a.confirmedSent = false, 0, false, 0
	a.gen++
}

// valid is the agent's lease rule at this instant, on its own clock.
func (a *Agent) valid() (epoch uint64, ok bool) {
	if !a.registered || a.fenced || a.confirmedSent == 0 || a.host().down {
		return a.epoch, false
	}
	return a.epoch, a.host().mono(a.w.now) < a.confirmedSent+int64(a.confirmedTTL-a.margin)
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
			a.confirmedSent, a.confirmedTTL = 0, ans.ttl
			a.registeredAt = w.now
			w.check.agentEpoch(a)
			w.tracef("%s registered with epoch %d", a.name, ans.epoch)
			a.renewLoop(a.gen, ans.ttl)
		})
	}
	try(0)
}

// renewLoop renews every ttl/3, trying the coordinators one after another
// with a per-attempt timeout of ttl/3, and retries every ttl/12.
func (a *Agent) renewLoop(gen int, ttl time.Duration) {
	w := a.w
	var round func()
	round = func() {
		if a.gen != gen {
			return
		}
		var attempt func(i int)
		attempt = func(i int) {
			if a.gen != gen {
				return
			}
			if i >= w.cfg.Coordinators {
				w.onHost(a.idx, ttl/12, round)
				return
			}
			c := (a.last + i) % w.cfg.Coordinators
			sent := a.host().mono(w.now)
			epoch := a.epoch
			w.call(a.idx, c, ttl/3, func(reply func(any)) {
				w.coords[c].handleRenew(a.name, epoch, func(ans answer) { reply(ans) })
			}, func(resp any, timedOut bool) {
				if a.gen != gen {
					return
				}
				if timedOut {
					attempt(i + 1)
					return
				}
				ans := resp.(answer)
				switch ans.reason {
				case "":
					a.last = c
					if ans.ttl > 0 {
						ttl = ans.ttl
					}
					if sent > a.confirmedSent {
						a.confirmedSent, a.confirmedTTL = sent, ttl
					}
					w.check.agentGranted(a)
					next := time.Duration(int64(ttl/3) - (a.host().mono(w.now) - sent))
					w.onHost(a.idx, max(next, 0), round)
				case "NODE_FENCED", "EPOCH_EXPIRED", "UNKNOWN_NODE":
					w.tracef("%s: epoch %d refused (%s)", a.name, epoch, ans.reason)
					a.fenced = true
					a.gen++
					w.onHost(a.idx, 100*time.Millisecond, a.register)
				default:
					attempt(i + 1)
				}
			})
		}
		attempt(0)
	}
	round()
}
