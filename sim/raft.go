package sim

import (
	"time"

	"go.etcd.io/raft/v3/raftpb"

	waldenv1 "walden/proto/walden/v1"
)

// raftModel is an abstract raft group: one committed log shared by every
// coordinator, a leader per term, and the ways raft lets a proposal land:
//
//   - a proposal goes to the member its proposer believes is leader; a
//     follower forwards it (etcd raft's MsgProp forwarding), so an entry is
//     appended in the term of whichever leader receives it;
//   - an entry appended by a leader commits after a replication delay; when
//     the leadership changed meanwhile it survives or is lost (coin flip),
//     keeping the term it was appended in;
//   - a deposed leader learns of its deposition only after a delay, and what
//     it appends meanwhile is lost;
//   - every coordinator applies the committed log in order, each with its
//     own lag (longer while its link from the leader is cut).
type raftModel struct {
	w      *World
	term   uint64
	leader int // actual leader's coordinator index; -1 while none
	log    []*entry

	// believedLeader and believedTerm are each coordinator's view.
	believedLeader []int
	believedTerm   []uint64
	// applyAt is the real time of the last apply scheduled per member.
	applyAt []int64

	nextRequest uint64
	// decidedTerm records, per request id of a DeclareFailed proposal, the
	// term of the leadership that decided it (for the term check).
	decidedTerm map[uint64]uint64
	// base is the state the log starts from (a restored cluster's data
	// dir), at baseIndex; nil: the founding members' configuration.
	base      []byte
	baseIndex uint64
}

type entry struct {
	index uint64
	term  uint64
	cmd   *waldenv1.Command
	// cc and ctx make a membership change entry (cmd is nil).
	cc  *raftpb.ConfChangeV2
	ctx *waldenv1.ConfChangeContext
}

func newRaftModel(w *World) *raftModel {
	n := w.cfg.Coordinators
	r := &raftModel{w: w, term: 1, leader: 0, believedLeader: make([]int, n), believedTerm: make([]uint64, n),
		applyAt: make([]int64, n), decidedTerm: map[uint64]uint64{}}
	for i := range r.believedTerm {
		r.believedTerm[i] = 1
	}
	return r
}

// believesLeader reports whether coordinator c believes it leads, and the term.
func (r *raftModel) believesLeader(c int) (bool, uint64) {
	return r.believedLeader[c] == c, r.believedTerm[c]
}

// electLeader makes coordinator c leader of a new term now. The old leader
// keeps believing it leads for up to staleFor; the others learn within
// learnWithin.
func (r *raftModel) electLeader(c int, staleFor, learnWithin time.Duration) {
	w := r.w
	old := r.leader
	r.term++
	r.leader = c
	term := r.term
	w.tracef("raft: %s elected leader of term %d (old leader %s)", w.coords[c].name, term, nameOf(w, old))
	for i := range w.coords {
		learn := func() {
			if r.believedTerm[i] < term {
				r.believedLeader[i], r.believedTerm[i] = c, term
			}
		}
		switch {
		case i == c:
			learn()
		case i == old:
			w.after(w.rng.Int64N(int64(staleFor)+1), learn)
		default:
			w.after(w.rng.Int64N(int64(learnWithin)+1), learn)
		}
	}
}

func nameOf(w *World, c int) string {
	if c < 0 {
		return "none"
	}
	return w.coords[c].name
}

// propose sends cmd from coordinator c towards the leader. The result
// reaches c through its apply path (Coord.waiters); a lost proposal is
// never answered (the caller has its own timeout).
func (r *raftModel) propose(c int, cmd *waldenv1.Command) {
	r.route(c, c, cmd, 0)
}

func (r *raftModel) route(at, from int, cmd *waldenv1.Command, hops int) {
	w := r.w
	if hops > 3 {
		return
	}
	target := r.believedLeader[at]
	if target < 0 {
		return
	}
	if target == at {
		r.append(at, cmd)
		return
	}
	w.send(at, target, func() { r.route(target, at, cmd, hops+1) })
}

// append appends cmd at coordinator x, which believes it leads.
func (r *raftModel) append(x int, cmd *waldenv1.Command) {
	w := r.w
	if x != r.leader || r.believedTerm[x] != r.term {
		w.tracef("raft: %s (deposed, term %d) appends %s: lost", w.coords[x].name, r.believedTerm[x], opName(cmd))
		return
	}
	term := r.term
	w.after(int64(time.Millisecond)+w.rng.Int64N(int64(4*time.Millisecond)), func() {
		if r.term != term && w.rng.IntN(2) == 0 {
			w.tracef("raft: %s appended in term %d lost in the leader change", opName(cmd), term)
			return
		}
		r.commit(term, cmd)
	})
}

// commit appends cmd to the committed log and schedules its apply on every
// coordinator.
func (r *raftModel) commit(term uint64, cmd *waldenv1.Command) {
	w := r.w
	e := &entry{index: uint64(len(r.log) + 1), term: term, cmd: cmd}
	r.log = append(r.log, e)
	for i := range w.coords {
		r.scheduleApply(i)
	}
}

// commitConf appends the membership change cc to the committed log, in
// the current term (the simulation's operator changes membership through a
// leader that stays).
func (r *raftModel) commitConf(cc *raftpb.ConfChangeV2, ctx *waldenv1.ConfChangeContext) {
	w := r.w
	e := &entry{index: uint64(len(r.log) + 1), term: r.term, cc: cc, ctx: ctx}
	r.log = append(r.log, e)
	for i := range w.coords {
		r.scheduleApply(i)
	}
}

// scheduleApply makes coordinator i apply what is committed, after its lag.
func (r *raftModel) scheduleApply(i int) {
	w := r.w
	from := r.leader
	if from < 0 {
		from = i
	}
	lag := int64(time.Millisecond) + w.rng.Int64N(int64(5*time.Millisecond))
	if from != i && w.links[from][i].cut {
		lag = int64(100 * time.Millisecond) // retried until the link heals
		w.after(lag, func() { r.scheduleApply(i) })
		return
	}
	t := max(w.now+lag, r.applyAt[i])
	r.applyAt[i] = t
	inc := w.hosts[i].incarnation
	w.at(t, func() {
		if w.hosts[i].incarnation != inc {
			return
		}
		w.runOn(i, func() { w.coords[i].applyCommitted() })
	})
}

// readIndex confirms, as etcd raft's ReadIndex does, that what coordinator
// c reads next is at least as new as everything committed when the read
// started: it asks the member c believes leads, a deposed leader learns of
// its deposition and retries as a follower, and done runs on c once c has
// applied up to the read index. A lost read is never answered.
func (r *raftModel) readIndex(c int, done func()) {
	w := r.w
	var ask func(at int, hops int)
	ask = func(at int, hops int) {
		if hops > 3 {
			return
		}
		target := r.believedLeader[at]
		if target < 0 {
			return
		}
		if target == at {
			if at != r.leader || r.believedTerm[at] != r.term {
				// A heartbeat round answered with a higher term: step
				// down and retry through the new leader.
				if r.leader >= 0 {
					r.believedLeader[at], r.believedTerm[at] = r.leader, r.term
					ask(at, hops+1)
				}
				return
			}
			idx := uint64(len(r.log))
			w.after(int64(time.Millisecond)+w.rng.Int64N(int64(3*time.Millisecond)), func() {
				w.send(at, c, func() { w.coords[c].whenApplied(idx, done) })
			})
			return
		}
		w.send(at, target, func() { ask(target, hops+1) })
	}
	ask(c, 0)
}

func opName(cmd *waldenv1.Command) string {
	switch op := cmd.GetOp().(type) {
	case *waldenv1.Command_DeclareFailed:
		return "DeclareFailed(" + op.DeclareFailed.GetBrokerId() + ")"
	case *waldenv1.Command_RegisterBroker:
		return "RegisterBroker(" + op.RegisterBroker.GetBrokerId() + ")"
	case *waldenv1.Command_ObserveBroker:
		return "ObserveBroker(" + op.ObserveBroker.GetBrokerId() + "," + op.ObserveBroker.GetObservationState().Name() + ")"
	case *waldenv1.Command_SetPolicy:
		return "SetPolicy"
	case *waldenv1.Command_FinishJob:
		return "FinishJob(" + op.FinishJob.GetJobId() + ")"
	default:
		return "command"
	}
}

// indexBase is the raft index before the log's first entry.
func (r *raftModel) indexBase() uint64 {
	if r.base != nil {
		return r.baseIndex
	}
	return uint64(r.w.cfg.Coordinators)
}
