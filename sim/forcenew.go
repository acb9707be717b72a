package sim

import (
	"fmt"
	"math"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
	"walden/raftnode/raftnodetest"
)

// A lost quorum recovered with --force-new-cluster (Faults.ForceNewCluster),
// as docs/runbook.md "Quorum loss" does it, under load: a coordinator — cut
// off from the other two for a while first in half the runs, so that it
// misses the last commits — is the survivor; the other two are killed for
// good, their data dirs gone. A moment later the operator stops the
// survivor and rewrites its log with raftnode.ForceNewCluster, the function
// `walden server --force-new-cluster` runs, given the same force_new_cluster
// entry (the removals of the other members, then the entry whose apply,
// fsm's, revokes every broker epoch and moves the fencing token and every
// stream's epoch past what the lost log may have issued). The survivor
// starts alone on that log; the two others are added back as learners with
// empty data dirs, each promoted once the spacing of voter changes allows.
//
// What the force may lose, and what the checker holds it to
// (docs/safety.md, F): the survivor's log ends where it ends, so whatever
// only the lost members committed beyond it is lost. A record acknowledged
// under an epoch the force revokes is still in the catalog once its broker
// registered again — from the survivor's catalog, or from the broker's WAL
// beyond the end of a stream the survivor shows opened by it — unless the
// survivor missed the catalog commit that held it (the broker trimmed it
// from its WAL after that commit; records beyond it stop at the gap) or the
// registration of the epoch that acknowledged it (the survivor shows the
// stream closed by an earlier recovery: the broker uploads nothing of it).
// Those records are the documented loss (checkForceLoss, checker.forceLost)
// and their offsets may be given out again; every other invariant holds
// unchanged. The second case is a finding of this profile (seed 25): the
// runbook said every broker uploads what its WAL holds beyond the catalog.

// forceNewClusterEpochBump is server.ForceNewClusterEpochBump, the bump
// `walden server --force-new-cluster` writes (TestForceNewClusterBumpIsTheServers
// keeps them equal; package sim does not import server).
const forceNewClusterEpochBump = 1_000_000

// scheduleForceNewCluster schedules the quorum loss and its recovery.
func (w *World) scheduleForceNewCluster() {
	w.after(w.uniform(60*time.Second, 200*time.Second), func() {
		l := w.raft.leader
		if l < 0 || w.hosts[l].down || w.replacing {
			w.scheduleForceNewCluster()
			return
		}
		s := w.coords[w.rng.IntN(len(w.coords))]
		lag := w.rng.IntN(2) == 0
		if !lag {
			w.after(w.uniform(0, 2*time.Second), func() { w.loseQuorum(s) })
			return
		}
		if s.idx == l {
			// A cut-off leader steps down; one of the others leads.
			w.raft.electLeader((l+1+w.rng.IntN(len(w.coords)-1))%len(w.coords), 300*time.Millisecond, 300*time.Millisecond)
		}
		w.tracef("net: %s cut off from the other coordinators (it will miss the last commits; leader %s, %d entries)", s.name, nameOf(w, w.raft.leader), len(w.raft.log))
		var links []*link
		for _, o := range w.coords {
			if o != s {
				links = append(links, w.links[s.idx][o.idx], w.links[o.idx][s.idx])
			}
		}
		for _, l := range links {
			l.cut, l.goodSince = true, -1
		}
		// A broker whose catalog calls went through s turns to another
		// coordinator, as its client does when one stops answering: the
		// others go on committing without s.
		for _, a := range w.agents {
			if a.last == s.idx {
				a.last = w.raft.leader
			}
		}
		// A failover the survivor will not see: its decision, job and the
		// broker's new registration are in the lost log only.
		w.manualFailover(w.agents[w.rng.IntN(len(w.agents))], w.raft.leader)
		w.after(w.uniform(3*time.Second, 15*time.Second), func() {
			w.loseQuorum(s)
			w.after(w.uniform(time.Second, 5*time.Second), func() {
				for _, l := range links {
					l.cut, l.goodSince = false, w.now
				}
			})
		})
	})
}

// loseQuorum kills every coordinator but s for good. s keeps the log it
// received: all of it when it was not cut off, else what it applied.
func (w *World) loseQuorum(s *Coord) {
	w.quorumLost = true
	n := len(w.raft.log)
	for _, l := range w.links[s.idx][:w.cfg.Coordinators] {
		if l.cut {
			n = s.applied
		}
	}
	for _, o := range w.coords {
		if o != s {
			o.host().down = true
			o.host().incarnation++
		}
	}
	w.tracef("quorum lost: %v killed for good, their data dirs gone; %s received %d of %d committed entries", w.otherCoords(s), s.name, n, len(w.raft.log))
	w.forceFullLog = w.raft.log
	w.raft.log = w.raft.log[:n:n]
	w.raft.leader = -1
	w.after(w.uniform(5*time.Second, 60*time.Second), func() { w.forceNewCluster(s) })
}

func (w *World) otherCoords(s *Coord) []string {
	var out []string
	for _, o := range w.coords {
		if o != s {
			out = append(out, o.name)
		}
	}
	return out
}

// forceNewCluster is the runbook's steps 3 to 5: the survivor stopped, its
// log rewritten by raftnode.ForceNewCluster, started alone; the others
// added back as learners with empty data dirs and promoted.
func (w *World) forceNewCluster(s *Coord) {
	h := s.host()
	h.down = true
	h.incarnation++
	forced, removed := w.rewriteForced(s)
	w.raft.log = append(w.raft.log, forced...)
	w.tracef("operator: %s started with --force-new-cluster: %v removed, %d entries appended", s.name, removed, len(forced))
	w.checkForceLoss(s)
	w.quorumLost = false
	w.raft.electLeader(s.idx, 0, 0)
	h.down = false
	h.lastTrouble = w.now
	s.reset()
	s.start()
	horizon := func() time.Duration {
		ms, _ := s.st.LeaseHorizon()
		return max(200*time.Millisecond, time.Duration(ms)*time.Millisecond)
	}
	at := w.now + w.uniform(2*time.Second, 20*time.Second)
	promoteAt := w.now + int64(horizon())
	for _, o := range w.coords {
		if o == s {
			continue
		}
		id := uint64(o.idx + 1)
		ctx := &waldenv1.ConfChangeContext{Member: &waldenv1.MemberContext{Id: o.name}}
		change := func(t raftpb.ConfChangeType) *raftpb.ConfChangeV2 {
			return &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: t.Enum(), NodeId: new(id)}}}
		}
		start := at + w.uniform(200*time.Millisecond, 3*time.Second)
		w.at(at, func() {
			w.raft.commitConf(change(raftpb.ConfChangeAddLearnerNode), ctx)
			w.tracef("operator: %s added back as a learner", o.name)
		})
		w.at(start, func() { w.startEmpty(o) })
		promoteAt = max(promoteAt, start+int64(time.Second))
		w.at(promoteAt, func() {
			w.raft.commitConf(change(raftpb.ConfChangeAddNode), ctx)
			w.tracef("raft: %s promoted to voter", o.name)
		})
		// The next promotion waits the spacing of voter changes.
		promoteAt += int64(horizon()) + w.uniform(0, 2*time.Second)
		at += w.uniform(0, 5*time.Second)
	}
}

// rewriteForced writes the survivor's log into a raft storage, rewrites it
// with raftnode.ForceNewCluster and returns the entries it appended, as the
// simulation's log entries, and the names of the members it removed. The
// force_new_cluster entry is the one `walden server --force-new-cluster`
// writes (server/force_new_cluster.go).
func (w *World) rewriteForced(s *Coord) ([]*entry, []string) {
	// The simulation names a coordinator's raft id by its index; walden
	// derives it from the name (raftnode.RaftID).
	toRaft := map[uint64]uint64{}
	fromRaft := map[uint64]int{}
	for _, c := range w.coords {
		id := raftnode.RaftID(c.name)
		toRaft[uint64(c.idx+1)], fromRaft[id] = id, c.idx
	}
	if w.raft.base != nil {
		panic("sim: force new cluster after a restore is not simulated")
	}
	st := raftnodetest.NewMemStorage()
	base := w.raft.indexBase()
	cs := &raftpb.ConfState{}
	for i := range w.cfg.Coordinators {
		cs.Voters = append(cs.Voters, toRaft[uint64(i+1)])
	}
	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{ConfState: cs, Index: new(base), Term: new(uint64(1))}}
	var ents []*raftpb.Entry
	term := uint64(1)
	for _, e := range w.raft.log {
		re := &raftpb.Entry{Index: new(base + e.index), Term: new(e.term)}
		term = max(term, e.term)
		if e.cc != nil {
			cc := proto.Clone(e.cc).(*raftpb.ConfChangeV2)
			for _, ch := range cc.GetChanges() {
				ch.NodeId = new(toRaft[ch.GetNodeId()])
			}
			if e.ctx != nil {
				cc.Context = mustMarshal(e.ctx)
			}
			re.Type, re.Data = raftpb.EntryConfChangeV2.Enum(), mustMarshal(cc)
		} else {
			re.Type, re.Data = raftpb.EntryNormal.Enum(), mustMarshal(e.cmd)
		}
		ents = append(ents, re)
	}
	last := base + uint64(len(w.raft.log))
	commit := base + uint64(min(s.applied, len(w.raft.log)))
	if err := st.Save(&raftpb.HardState{Term: new(term), Vote: new(uint64(0)), Commit: new(commit)}, ents, snap); err != nil {
		panic(err)
	}
	names := map[uint64]string{}
	for _, c := range w.coords {
		names[raftnode.RaftID(c.name)] = c.name
	}
	var removedNames []string
	removed, err := raftnode.ForceNewCluster(st, s.name, func(l raftnode.ForcedLog) ([]byte, error) {
		op := &waldenv1.ForceNewCluster{NodeId: s.name, LastIndex: l.LastIndex, CommitIndex: l.CommitIndex, Term: l.Term,
			EpochBump: forceNewClusterEpochBump, UnixMs: s.wallMs()}
		for _, id := range l.Removed {
			op.Removed = append(op.Removed, names[id])
		}
		removedNames = op.Removed
		if w.cfg.Mutations.ForceNewClusterNoEntry {
			return nil, nil
		}
		return proto.Marshal(&waldenv1.Command{ProposerId: s.name, ProposedUnixMs: op.GetUnixMs(),
			Op: &waldenv1.Command_ForceNewCluster{ForceNewCluster: op}})
	})
	if err != nil || len(removed) != w.cfg.Coordinators-1 {
		panic(fmt.Sprintf("sim: force new cluster: removed %v: %v", removed, err))
	}
	newLast, err := st.LastIndex()
	if err != nil {
		panic(err)
	}
	hs, _, err := st.InitialState()
	if err != nil || hs.GetCommit() != newLast {
		panic(fmt.Sprintf("sim: force new cluster: commit %d of %d: %v", hs.GetCommit(), newLast, err))
	}
	added, err := st.Entries(last+1, newLast+1, math.MaxUint64)
	if err != nil {
		panic(err)
	}
	var out []*entry
	for _, re := range added {
		e := &entry{index: re.GetIndex() - base, term: re.GetTerm()}
		switch re.GetType() {
		case raftpb.EntryConfChange:
			v1 := new(raftpb.ConfChange)
			if err := proto.Unmarshal(re.GetData(), v1); err != nil {
				panic(err)
			}
			e.cc = v1.AsV2()
			for _, ch := range e.cc.GetChanges() {
				ch.NodeId = new(uint64(fromRaft[ch.GetNodeId()] + 1))
			}
		case raftpb.EntryNormal:
			e.cmd = new(waldenv1.Command)
			if err := proto.Unmarshal(re.GetData(), e.cmd); err != nil {
				panic(err)
			}
		default:
			panic(fmt.Sprintf("sim: force new cluster appended a %v entry", re.GetType()))
		}
		out = append(out, e)
	}
	return out, removedNames
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// stateOf is the state machine after log.
func (w *World) stateOf(log []*entry) *fsm.State {
	st := w.initialState()
	for _, e := range log {
		if e.cc != nil {
			_ = st.ApplyConfChange(w.raft.indexBase()+e.index, e.cc, e.ctx, nil)
			continue
		}
		_, _ = st.Apply(w.raft.indexBase()+e.index, e.term, e.cmd)
	}
	return st
}

// checkForceLoss holds the force to what it may lose. Each acknowledged
// record is in the forced catalog, or in its broker's WAL contiguous from
// the stream's end there while the forced state shows the stream opened by
// the broker (it uploads that tail when it registers again, or the recovery
// of a pending job does; a stream it shows closed is taken for recovered,
// and its WAL is not read). Or else its loss is one of the two the docs
// name, and is recorded (checker.forceLost: its offsets may be
// acknowledged again with other records, and it is not asked of the catalog
// afterwards):
//
//   - a lost catalog commit: the stream's catalog in the lost log went
//     further than the survivor's, and the record, at or beyond the
//     survivor's end, was committed there or is in the WAL beyond that
//     commit's gap;
//   - a lost registration: the epoch that acknowledged the record was
//     registered in the lost log only, so its reopening of the stream is
//     lost too, and the record, at or beyond the survivor's end, is in the
//     lost catalog or in a WAL nobody reads.
//
// Anything else lost is a violation.
func (w *World) checkForceLoss(s *Coord) {
	k := w.check
	forced := w.stateOf(w.raft.log)
	full := w.stateOf(w.forceFullLog)
	k.forced, k.forceAt = true, w.now
	for _, a := range w.agents {
		id := a.streamOf()
		var end, fullEnd uint64
		if st, ok := forced.Stream(id); ok {
			end = st.GetEndOffset()
		}
		if st, ok := full.Stream(id); ok {
			fullEnd = st.GetEndOffset()
		}
		have := w.catalogOf(forced, id)
		for _, st := range forced.OpeningStreams(a.name) {
			if st.GetStreamId() == id {
				for _, r := range contiguous(a.wal, id, end, 0) {
					have[r.offset] = r.value
				}
			}
		}
		var known uint64 // the broker's epoch in the forced state
		if b, ok := forced.Broker(a.name); ok {
			known = b.GetEpoch()
		}
		inWAL := map[uint64]uint64{}
		for _, r := range a.wal {
			if r.stream == id {
				inWAL[r.offset] = r.value
			}
		}
		fullCat := w.catalogOf(full, id)
		commits, registrations := 0, 0
		for off, ar := range k.acks[id] {
			if v, ok := have[off]; ok && v == ar.value {
				continue
			}
			kept := fullCat[off] == ar.value || inWAL[off] == ar.value
			switch {
			case off >= end && fullEnd > end && ((off < fullEnd && fullCat[off] == ar.value) || (off >= fullEnd && inWAL[off] == ar.value)):
				commits++
			case off >= end && ar.broker == a.name && ar.epoch > known && kept:
				registrations++
			default:
				k.fail(KindAckedLost, "after %s was forced into a new cluster, record %d that %s@%d acknowledged at stream %d offset %d is neither in its catalog "+
					"(end %d) nor in the WAL it uploads from there, and no lost entry explains it (the lost log's end %d, the broker's epoch there %d)",
					s.name, ar.value, ar.broker, ar.epoch, id, off, end, fullEnd, known)
				return
			}
			if k.forceLost[id] == nil {
				k.forceLost[id] = map[uint64]bool{}
			}
			k.forceLost[id][off] = true
		}
		if commits+registrations > 0 {
			k.forceLossCommits += commits
			k.forceLossRegistrations += registrations
			w.tracef("force new cluster: stream %d: %d acknowledged records lost with a catalog commit, %d with a registration of the lost log "+
				"(the survivor's catalog ends at %d, the lost log's at %d)", id, commits, registrations, end, fullEnd)
		}
	}
}

// mayLead reports whether coordinator c may be elected: not while the
// quorum is lost, and only a voter once it was forced into a new cluster
// (a learner added back does not campaign). Other runs elect any running
// coordinator, as before.
func (w *World) mayLead(c int) bool {
	if !w.cfg.Faults.ForceNewCluster {
		return true
	}
	if w.quorumLost {
		return false
	}
	l := w.raft.leader
	if l < 0 {
		return false
	}
	for _, v := range w.coords[l].st.Voters() {
		if v == w.coords[c].name {
			return true
		}
	}
	return false
}

// ForceLoss is the number of acknowledged records the force into a new
// cluster lost as the docs say it may: with a catalog commit the survivor
// missed, and with a registration it missed (checkForceLoss).
func (w *World) ForceLoss() (commits, registrations int) {
	return w.check.forceLossCommits, w.check.forceLossRegistrations
}
