package sim

import (
	"fmt"
	"slices"
	"time"

	"walden/fsm"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
)

// Violation is one broken invariant, with the real time it was seen.
type Violation struct {
	At   time.Duration
	Kind string
	What string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s at %.3fs: %s", v.Kind, v.At.Seconds(), v.What)
}

// Invariant kinds.
const (
	// KindAckAfterRead: an agent holds a valid lease (on its own clock) for
	// an epoch whose WAL the recovery has started reading.
	KindAckAfterRead = "valid-after-wal-read"
	// KindTerm: an entry decided in one term was applied in another.
	KindTerm = "decided-in-another-term"
	// KindEpoch: an epoch went backwards.
	KindEpoch = "epoch-went-back"
	// KindLapse: an agent's lease lapsed while a majority of coordinators
	// was healthy and reachable.
	KindLapse = "lapse-with-healthy-majority"
	// KindAckedLost: a record a broker acknowledged is not in the catalog
	// once the recovery of a later epoch of the broker succeeded.
	KindAckedLost = "acknowledged-record-lost"
	// KindAckedTwice: an offset was acknowledged with two records, or
	// committed with another record than the one acknowledged there.
	KindAckedTwice = "offset-acknowledged-twice"
	// KindKeyTwice: two different objects were uploaded under one key (a
	// fencing token or broker epoch, which names a job's or a broker's
	// objects, was issued twice).
	KindKeyTwice = "object-key-issued-twice"
)

type checker struct {
	w          *World
	violations []Violation
	// readAt records, per broker and fenced epoch, the real time the
	// recovery started reading its WAL.
	readAt map[string]map[uint64]int64
	// agentEpochs is each agent's last epoch.
	agentEpochs map[string]uint64
	// Liveness is checked only when enabled (some protocols do not claim it).
	liveness bool
	// maxTTL is the longest lease_ttl in force in the last window.
	ttlHistory []ttlAt
	// promisedAt is the last time each coordinator was seen holding its
	// attestation for an agent's epoch (key: coordinator, agent, epoch).
	promisedAt map[promiseKey]int64
	// acks are the acknowledged records: stream → offset → the record and
	// who acknowledged it.
	acks map[uint64]map[uint64]ackedRec
	// forced is set once the cluster was forced into a new one
	// (Faults.ForceNewCluster); forceLost holds, per stream, the offsets of
	// the acknowledged records the force lost as the runbook says it may
	// (checkForceLoss), until they are acknowledged again; forceChecked the
	// brokers whose registration after the force was checked.
	forced       bool
	forceAt      int64
	forceLost    map[uint64]map[uint64]bool
	forceChecked map[string]bool
	// forceLossCommits and forceLossRegistrations count the acknowledged
	// records the force lost as documented (checkForceLoss).
	forceLossCommits, forceLossRegistrations int
}

// ackedRec is an acknowledged record.
type ackedRec struct {
	value  uint64
	broker string
	epoch  uint64 // the broker epoch that acknowledged it
}

type promiseKey struct {
	coord, agent string
	epoch        uint64
}

type ttlAt struct {
	at  int64
	ttl time.Duration
}

func newChecker(w *World) *checker {
	return &checker{w: w, readAt: map[string]map[uint64]int64{}, agentEpochs: map[string]uint64{}, liveness: true, promisedAt: map[promiseKey]int64{},
		acks: map[uint64]map[uint64]ackedRec{}, forceLost: map[uint64]map[uint64]bool{}, forceChecked: map[string]bool{}}
}

func (k *checker) fail(kind, format string, args ...any) {
	v := Violation{At: time.Duration(k.w.now), Kind: kind, What: fmt.Sprintf(format, args...)}
	k.w.tracef("VIOLATION %s", v)
	k.violations = append(k.violations, v)
}

func (k *checker) start() {
	k.w.after(int64(100*time.Millisecond), k.sample)
}

// sample checks every running agent every 100ms of real time.
func (k *checker) sample() {
	for _, a := range k.w.agents {
		k.checkAgent(a)
		k.checkLiveness(a)
	}
	k.w.after(int64(100*time.Millisecond), k.sample)
}

// walRead records that the recovery starts reading broker's WAL of epoch.
func (k *checker) walRead(broker string, epoch uint64) {
	if k.readAt[broker] == nil {
		k.readAt[broker] = map[uint64]int64{}
	}
	if _, ok := k.readAt[broker][epoch]; !ok {
		k.readAt[broker][epoch] = k.w.now
	}
	k.w.tracef("recovery reads the WAL of %s@%d", broker, epoch)
	k.checkAgent(k.w.agentByName(broker))
}

// checkAgent: a running agent must not hold a valid lease for an epoch
// whose WAL is being read.
func (k *checker) checkAgent(a *Agent) {
	if !a.host().runnable(k.w.now) {
		return
	}
	epoch, ok := a.valid()
	if !ok {
		return
	}
	if t, read := k.readAt[a.name][epoch]; read {
		k.fail(KindAckAfterRead, "%s holds a valid lease for epoch %d, whose WAL the recovery started reading %.3fs ago",
			a.name, epoch, float64(k.w.now-t)/1e9)
	}
}

func (k *checker) agentGranted(a *Agent) { k.checkAgent(a) }

func (k *checker) agentEpoch(a *Agent) {
	if a.epoch < k.agentEpochs[a.name] {
		k.fail(KindEpoch, "%s got epoch %d after epoch %d", a.name, a.epoch, k.agentEpochs[a.name])
	}
	k.agentEpochs[a.name] = a.epoch
}

func epochs(st *fsm.State) map[string]uint64 {
	out := map[string]uint64{}
	for _, b := range st.Brokers() {
		out[b.GetBrokerId()] = b.GetEpoch()
	}
	return out
}

// afterApply checks an applied entry on coordinator c.
func (k *checker) afterApply(c *Coord, e *entry, before map[string]uint64, res *waldenv1.Result, err error) {
	for id, ep := range epochs(c.st) {
		if ep < before[id] {
			k.fail(KindEpoch, "%s: broker %s epoch %d after %d", c.name, id, ep, before[id])
		}
	}
	if err != nil {
		return
	}
	if co := e.cmd.GetCommitObject(); co != nil && !res.GetCommitObject().GetRedundant() {
		k.committed(c, co.GetObject())
	}
	for _, ro := range e.cmd.GetReconcileObjects().GetObjects() {
		k.committed(c, ro.GetObject())
	}
	if fj := e.cmd.GetFinishJob(); fj != nil && fj.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED {
		if j, ok := c.st.Job(fj.GetJobId()); ok {
			k.recovered(c, j)
		}
	}
	if df := e.cmd.GetDeclareFailed(); df != nil && !res.GetDeclareFailed().GetDryRun() {
		if dt, ok := k.w.raft.decidedTerm[e.cmd.GetRequestId()]; ok && dt != e.term {
			k.fail(KindTerm, "DeclareFailed(%s@%d) decided in term %d was appended and applied in term %d",
				df.GetBrokerId(), df.GetEpoch(), dt, e.term)
		}
	}
}

// ttlChanged records the lease_ttl in force.
func (k *checker) ttlChanged(ttl time.Duration) {
	k.ttlHistory = append(k.ttlHistory, ttlAt{at: k.w.now, ttl: ttl})
}

// window is how long a majority must have been healthy before a lapse
// counts: two of the longest lease_ttl in force in the last minute, plus a
// second.
func (k *checker) window() int64 {
	longest := 3 * time.Second
	for _, t := range k.ttlHistory {
		if k.w.now-t.at < int64(time.Minute) || t == k.ttlHistory[len(k.ttlHistory)-1] {
			longest = max(longest, t.ttl)
		}
	}
	return int64(2*longest + time.Second)
}

// checkLiveness: a registered agent whose epoch is current, that has not
// been suspended, and that has had perfect links to and from a majority of
// running coordinators for the window, must hold a valid lease.
func (k *checker) checkLiveness(a *Agent) {
	w := k.w
	for _, c := range w.coords {
		if c.grantor.Promised(lease.Key{Broker: a.name, Epoch: a.epoch}) {
			k.promisedAt[promiseKey{c.name, a.name, a.epoch}] = w.now
		}
	}
	if !k.liveness || !a.host().runnable(w.now) || !a.registered || a.fenced {
		return
	}
	win := k.window()
	if w.now-a.registeredAt < win || w.now-a.host().lastResume < win || w.now-w.lastPolicyChange < win {
		return
	}
	if w.failoverRequestedAt[a.name] != 0 && w.now-w.failoverRequestedAt[a.name] < 10*win {
		return
	}
	healthy := 0
	var names []string
	for _, c := range w.coords {
		h := c.host()
		if h.down || w.now-h.lastTrouble < win || !h.runnable(w.now) || w.now-c.quietEnd < win {
			continue
		}
		// Only voters grant; a replacement is a learner until promoted.
		if !slices.Contains(c.st.Voters(), c.name) {
			continue
		}
		// A coordinator that has not applied the broker's registration
		// (cut off from the leader) cannot grant its epoch: it is not
		// healthy for this broker.
		if b, ok := c.st.Broker(a.name); !ok || b.GetEpoch() != a.epoch || b.GetFenced() {
			continue
		}
		// A coordinator that attested must withdraw through raft before it
		// grants again: it needs the leader both ways, for the window after
		// it last held the attestation too (a withdrawal just applied has
		// not been followed by a renewal yet).
		if at, ok := k.promisedAt[promiseKey{c.name, a.name, a.epoch}]; ok && w.now-at < win {
			l := w.raft.leader
			if l < 0 || (l != c.idx && (!w.links[c.idx][l].perfect() || !w.links[l][c.idx].perfect() ||
				w.now-w.links[c.idx][l].goodSince < win || w.now-w.links[l][c.idx].goodSince < win)) {
				continue
			}
		}
		up, down := w.links[a.idx][c.idx], w.links[c.idx][a.idx]
		if up.perfect() && down.perfect() && w.now-up.goodSince >= win && w.now-down.goodSince >= win && w.now-c.epochSince[a.name] >= win {
			healthy++
			names = append(names, c.name)
		}
	}
	if healthy < w.cfg.Coordinators/2+1 {
		return
	}
	if _, ok := a.valid(); !ok {
		k.fail(KindLapse, "%s's lease (epoch %d) lapsed while %v of %d coordinators were healthy and reachable for %.1fs (grants left %v)",
			a.name, a.epoch, names, w.cfg.Coordinators, float64(win)/1e9, a.holder.Live(a.now()))
	}
}

// acked records that broker a acknowledged r under its epoch.
func (k *checker) acked(a *Agent, epoch uint64, r simRec) {
	m := k.acks[r.stream]
	if m == nil {
		m = map[uint64]ackedRec{}
		k.acks[r.stream] = m
	}
	if prev, ok := m[r.offset]; ok && prev.value != r.value && k.forceLost[r.stream][r.offset] {
		// The force lost the record acknowledged here, as documented: the
		// offset is given out again, and the new record is held to every
		// invariant.
		k.w.tracef("stream %d offset %d, lost by the force, acknowledged again by %s@%d", r.stream, r.offset, a.name, epoch)
		delete(k.forceLost[r.stream], r.offset)
	} else if ok && prev.value != r.value {
		k.fail(KindAckedTwice, "stream %d offset %d acknowledged by %s@%d (record %d), acknowledged before by %s@%d (record %d)",
			r.stream, r.offset, a.name, epoch, r.value, prev.broker, prev.epoch, prev.value)
		return
	}
	m[r.offset] = ackedRec{value: r.value, broker: a.name, epoch: epoch}
}

// committed checks an object committed on coordinator c: at an offset
// acknowledged before, it holds the record acknowledged there.
func (k *checker) committed(c *Coord, o *waldenv1.Object) {
	for _, r := range o.GetRanges() {
		m := k.acks[r.GetStreamId()]
		for _, rec := range k.w.objects[o.GetObjectId()] {
			if rec.offset < r.GetStartOffset() || rec.offset >= r.GetEndOffset() {
				continue
			}
			if a, ok := m[rec.offset]; ok && a.value != rec.value && !k.forceLost[r.GetStreamId()][rec.offset] {
				k.fail(KindAckedTwice, "%s: object %s commits record %d at stream %d offset %d, where %s@%d acknowledged record %d",
					c.name, o.GetObjectId(), rec.value, r.GetStreamId(), rec.offset, a.broker, a.epoch, a.value)
				return
			}
		}
	}
}

// recovered checks, when job j succeeded on coordinator c, that every
// record its broker acknowledged under an epoch before the job's token is
// in c's catalog.
func (k *checker) recovered(c *Coord, j *waldenv1.Job) {
	a := k.w.agentByName(j.GetBrokerId())
	s := a.streamOf()
	var content map[uint64]uint64
	for off, ar := range k.acks[s] {
		if ar.broker != a.name || ar.epoch >= j.GetToken() || k.forceLost[s][off] {
			continue
		}
		if content == nil {
			content = k.w.catalogOf(c.st, s)
		}
		if v, ok := content[off]; !ok || v != ar.value {
			k.fail(KindAckedLost, "%s: job %s succeeded, but record %d that %s@%d acknowledged at stream %d offset %d is not in the catalog (found %d)",
				c.name, j.GetJobId(), ar.value, ar.broker, ar.epoch, s, off, v)
			return
		}
	}
}

// registeredAfterForce checks, the first time broker a serves under an
// epoch registered in the forced cluster, that every record it acknowledged under an
// epoch the force revoked is in the catalog of coordinator c (which
// committed the broker's WAL tail), but for the documented loss.
func (k *checker) registeredAfterForce(a *Agent, c *Coord, epoch uint64) {
	if !k.forced || a.registeredAt < k.forceAt || k.forceChecked[a.name] {
		return
	}
	k.forceChecked[a.name] = true
	s := a.streamOf()
	content := k.w.catalogOf(c.st, s)
	for off, ar := range k.acks[s] {
		if ar.broker != a.name || ar.epoch >= epoch || k.forceLost[s][off] {
			continue
		}
		if v, ok := content[off]; !ok || v != ar.value {
			k.fail(KindAckedLost, "%s: %s@%d serves after the force, but record %d that %s@%d acknowledged at stream %d offset %d is not in the catalog (found %d)",
				c.name, a.name, epoch, ar.value, ar.broker, ar.epoch, s, off, v)
			return
		}
	}
}

// uploaded records the records of the object uploaded under id (the
// world's S3): a key is never used for two different objects.
func (k *checker) uploaded(id string, recs []simRec) {
	w := k.w
	if prev, ok := w.objects[id]; ok && !slices.Equal(prev, recs) {
		k.fail(KindKeyTwice, "object %s uploaded again with other records (%d records from offset %d, before %d from offset %d)",
			id, len(recs), recs[0].offset, len(prev), prev[0].offset)
	}
	w.objects[id] = append([]simRec(nil), recs...)
}
