package reconcile

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// Stream is a stream of the restored catalog as the plan starts from it.
type Stream struct {
	// End is the stream's committed end offset.
	End uint64
	// Floor is the lowest stream epoch its continuation may carry: its
	// epoch at the backup, or that of the range reconciled last.
	Floor uint64
}

// Candidate is an object written after the backup that checked out
// against its own index: its ranges (those of its index, less the ones a
// partial reconciliation already committed), each stream's producers, and
// what the catalog records of it.
type Candidate struct {
	// Object is the catalog object to commit: id, key, size, broker and
	// epoch (from the key), WAL offsets, CRC32C, and Ranges.
	Object *waldenv1.Object
	// Whole says Ranges are all of the index's (the original object id is
	// kept when every one of them is taken).
	Whole bool
	// Producers are the last batch of each idempotent producer per stream.
	Producers map[uint64][]*waldenv1.ProducerState
}

// Run is a run of contiguous records of one stream at one stream epoch in
// a broker's WAL (a restore job's survey).
type Run struct {
	Broker     string
	Stream     uint64
	Epoch      uint64
	Start, End uint64
}

// Input is what the plan is made from. Candidates are in key order (the
// order in which the plan prefers them); streams the catalog does not know
// start at offset 0 with floor 0.
type Input struct {
	Streams    map[uint64]Stream
	Candidates []Candidate
	Runs       []Run
}

// Output is the plan: the objects to commit, in order (each range starts at
// its stream's end when its turn comes), the stream tails the restore jobs
// commit from their WALs, and what was left and why.
type Output struct {
	Commits []*waldenv1.ReconciledObject
	Tails   []*waldenv1.StreamTail
	// Redundant counts the candidates none of whose ranges was taken
	// because other objects hold their records; Superseded those with a
	// range of a stream epoch that a later one replaced; Unreached those
	// with a range beyond a hole (Gaps says where).
	Redundant, Superseded, Unreached uint64
	// RangesCommitted counts the ranges of Commits; StreamsExtended the
	// streams whose end moves (by objects or a tail).
	RangesCommitted uint64
	StreamsExtended uint32
	// Gaps names the streams whose records beyond their reconciled end
	// could not be reached (an object or a WAL run starts beyond it).
	Gaps []string
}

// edge is a range of a candidate: from start to end at epoch.
type edge struct {
	cand       int
	r          *waldenv1.ObjectRange
	start, end uint64
	epoch      uint64
}

// Plan chooses each stream's continuation beyond the restored catalog.
//
// The rule that makes it safe: the broker that opens a stream at epoch e'
// does so at the stream's committed end o, and from then on nothing of an
// older epoch is committed to it. So a range or WAL run of epoch e' that
// starts at o' proves that nothing of an older epoch from o' on was ever
// committed (or acknowledged: a broker's records beyond the committed end
// are committed by its recovery before the stream reopens): such ranges are
// set aside (superseded) and runs cut at o'. What remains is consistent —
// at any offset, at most one record — and the plan takes the continuation
// that reaches furthest: ranges of objects from the stream's end, each at
// an epoch not below the one before, then, last, the run of a WAL that
// holds the offset reached. A stream epoch below the stream's floor is
// never taken.
//
// It runs in three steps: each stream's ranges and runs are gathered; each
// stream, in id order, is planned on its own (planStream); the candidates
// none of whose ranges was taken are counted by why, and the ranges taken
// are put in an order in which each starts at its stream's end (order).
func Plan(in Input) Output {
	g := gather(in)
	var out Output
	p := planned{
		taken:      map[int][]*waldenv1.ObjectRange{},
		chains:     map[uint64][]edge{},
		superseded: map[int]bool{},
		final:      map[uint64]uint64{},
	}
	for _, id := range g.ids() {
		p.add(&out, id, in.Streams[id], g.edges[id], g.runs[id])
	}
	p.countLeft(&out, in.Candidates)
	out.Commits = order(in.Candidates, p.chains)
	for _, c := range out.Commits {
		out.RangesCommitted += uint64(len(c.GetObject().GetRanges()))
	}
	return out
}

// gathered are the candidates' ranges and the non-empty WAL runs, by
// stream.
type gathered struct {
	edges map[uint64][]edge
	runs  map[uint64][]Run
}

// gather sorts the candidates' ranges (in candidate order) and the WAL runs
// that hold a record by stream.
func gather(in Input) gathered {
	g := gathered{edges: map[uint64][]edge{}, runs: map[uint64][]Run{}}
	for i, c := range in.Candidates {
		for _, r := range c.Object.GetRanges() {
			g.edges[r.GetStreamId()] = append(g.edges[r.GetStreamId()],
				edge{cand: i, r: r, start: r.GetStartOffset(), end: r.GetEndOffset(), epoch: r.GetStreamEpoch()})
		}
	}
	for _, r := range in.Runs {
		if r.Start < r.End {
			g.runs[r.Stream] = append(g.runs[r.Stream], r)
		}
	}
	return g
}

// ids are the streams with a range or a run, in id order: the streams the
// plan may extend.
func (g gathered) ids() []uint64 {
	ids := map[uint64]bool{}
	for id := range g.edges {
		ids[id] = true
	}
	for id := range g.runs {
		ids[id] = true
	}
	return sortedKeys(ids)
}

// planned is what the streams planned so far decided about the candidates.
type planned struct {
	// taken are the ranges taken from each candidate (by index).
	taken map[int][]*waldenv1.ObjectRange
	// chains are each stream's ranges taken, in order.
	chains map[uint64][]edge
	// superseded are the candidates with a range set aside.
	superseded map[int]bool
	// final is each stream's end once its continuation is committed.
	final map[uint64]uint64
}

// add plans stream id and records its continuation: its end, the ranges
// taken and set aside, its WAL tail and its gap in out.
func (p *planned) add(out *Output, id uint64, st Stream, edges []edge, runs []Run) {
	chain, tail, excluded, gap := planStream(id, st, edges, runs)
	p.final[id] = st.End
	if len(chain) > 0 {
		p.final[id] = chain[len(chain)-1].end
	}
	if tail != nil {
		p.final[id] = tail.GetEndOffset()
	}
	for _, e := range excluded {
		p.superseded[e.cand] = true
	}
	p.chains[id] = chain
	for _, e := range chain {
		p.taken[e.cand] = append(p.taken[e.cand], e.r)
	}
	if tail != nil {
		out.Tails = append(out.Tails, tail)
	}
	if len(chain) > 0 || tail != nil {
		out.StreamsExtended++
	}
	if gap != "" {
		out.Gaps = append(out.Gaps, gap)
	}
}

// countLeft counts the candidates none of whose ranges was taken, by why:
// one of their ranges was set aside (superseded); every record of theirs is
// below its stream's final end, so other objects or a WAL hold them
// (redundant); else a range of theirs lies beyond a hole (unreached).
func (p *planned) countLeft(out *Output, cands []Candidate) {
	for i, c := range cands {
		if len(p.taken[i]) > 0 {
			continue
		}
		switch {
		case p.superseded[i]:
			out.Superseded++
		case p.covers(c):
			out.Redundant++
		default:
			out.Unreached++
		}
	}
}

// covers says whether every range of c ends within its stream's final end.
func (p *planned) covers(c Candidate) bool {
	for _, r := range c.Object.GetRanges() {
		if r.GetEndOffset() > p.final[r.GetStreamId()] {
			return false
		}
	}
	return true
}

// planStream chooses one stream's continuation: the ranges to take in
// order, the WAL tail (or nil), the ranges set aside as superseded, and a
// gap's description when records beyond the continuation are out of reach.
func planStream(id uint64, st Stream, edges []edge, runs []Run) (chain []edge, tail *waldenv1.StreamTail, excluded []edge, gap string) {
	// 1. What a later epoch replaced is set aside (ranges) or cut (runs),
	// and what is below the floor or the catalog's end is left out.
	cut := newCutoffs(edges, runs)
	usable, excluded := splitRanges(st, edges, cut)
	live := liveRuns(st, runs, cut)
	// 2. Every offset the usable ranges reach from the stream's end.
	reached := reach(st, usable)
	// 3. The continuation that reaches furthest, and the ranges that lead
	// to it.
	best := furthest(st, reached, live)
	chain = chainTo(reached, usable, best.at)
	if best.run != nil {
		tail = &waldenv1.StreamTail{StreamId: id, BrokerId: best.run.Broker, StreamEpoch: best.run.Epoch, FromOffset: best.at, EndOffset: best.run.End}
	}
	// 4. Whatever starts beyond its end is out of reach.
	return chain, tail, excluded, gapBeyond(id, best.end, usable, live)
}

// cutoffs are the starts of a stream's ranges and runs with their epochs.
type cutoffs []epochStart

type epochStart struct{ epoch, at uint64 }

func newCutoffs(edges []edge, runs []Run) cutoffs {
	var c cutoffs
	for _, e := range edges {
		c = append(c, epochStart{e.epoch, e.start})
	}
	for _, r := range runs {
		c = append(c, epochStart{r.Epoch, r.Start})
	}
	return c
}

// of is the lowest start of anything of an epoch above epoch: nothing of
// epoch was committed or acknowledged from there on.
func (c cutoffs) of(epoch uint64) uint64 {
	at := uint64(1<<64 - 1)
	for _, s := range c {
		if s.epoch > epoch {
			at = min(at, s.at)
		}
	}
	return at
}

// splitRanges sets aside (excluded) the ranges of an epoch below the floor
// and those that run past the start of a later epoch; of the rest, those
// that end beyond the catalog's end are usable, in the order in which the
// continuation considers them.
func splitRanges(st Stream, edges []edge, cut cutoffs) (usable, excluded []edge) {
	for _, e := range edges {
		switch {
		case e.epoch < st.Floor:
			excluded = append(excluded, e)
		case e.end > cut.of(e.epoch):
			excluded = append(excluded, e)
		case e.end <= st.End:
			// Below the catalog's end: nothing to take.
		default:
			usable = append(usable, e)
		}
	}
	sort.SliceStable(usable, func(i, j int) bool {
		a, b := usable[i], usable[j]
		if a.start != b.start {
			return a.start < b.start
		}
		if a.epoch != b.epoch {
			return a.epoch < b.epoch
		}
		// Of two objects holding the same records, the later key: an
		// upload that was never committed is usually followed by one of
		// the same records that was (a broker's retry after a restart, a
		// recovery job under a later token), and keeping the committed one
		// keeps its id.
		return a.cand > b.cand
	})
	return usable, excluded
}

// liveRuns are the runs the continuation may end with: not below the
// floor, cut where a later epoch starts, and still holding records beyond
// the catalog's end.
func liveRuns(st Stream, runs []Run, cut cutoffs) []Run {
	var live []Run
	for _, r := range runs {
		if r.Epoch < st.Floor {
			continue
		}
		r.End = min(r.End, cut.of(r.Epoch))
		if r.Start < r.End && r.End > st.End {
			live = append(live, r)
		}
	}
	return live
}

// node is an offset the ranges reach: the lowest epoch it is reached at
// (the most ranges may follow it) and the range that reaches it there.
type node struct {
	epoch uint64
	via   int // index in usable, -1 for the start
	from  uint64
}

// reach reaches every offset it can from the stream's end by the usable
// ranges (in their order), each range at an epoch not below the one before.
func reach(st Stream, usable []edge) map[uint64]*node {
	reached := map[uint64]*node{st.End: {epoch: st.Floor, via: -1}}
	for i, e := range usable {
		n := reached[e.start]
		if n == nil || e.epoch < n.epoch {
			continue
		}
		if m := reached[e.end]; m == nil || e.epoch < m.epoch {
			reached[e.end] = &node{epoch: e.epoch, via: i, from: e.start}
		}
	}
	return reached
}

// continuation is how far a stream goes on: by ranges to at, then, with
// run, by that WAL's records to end.
type continuation struct {
	at, end uint64
	run     *Run
}

// beats says whether c is the better continuation than d: further; then
// from objects alone; then from more objects (offsets are visited in
// order); then the higher epoch's WAL, the broker id.
func (c continuation) beats(d continuation) bool {
	switch {
	case c.end != d.end:
		return c.end > d.end
	case (c.run == nil) != (d.run == nil):
		return c.run == nil
	case c.run == nil:
		return false
	case c.at != d.at:
		return c.at > d.at
	case c.run.Epoch != d.run.Epoch:
		return c.run.Epoch > d.run.Epoch
	default:
		return c.run.Broker < d.run.Broker
	}
}

// furthest is the continuation that reaches furthest: an offset reached,
// or one and a live run that holds it at an epoch not below the one it is
// reached at. Objects are preferred to a WAL that reaches as far, a higher
// epoch to a lower one.
func furthest(st Stream, reached map[uint64]*node, live []Run) continuation {
	best := continuation{at: st.End, end: st.End}
	for _, o := range sortedKeys(reached) {
		n := reached[o]
		if c := (continuation{at: o, end: o}); c.beats(best) {
			best = c
		}
		for k := range live {
			r := &live[k]
			if r.Start <= o && o < r.End && r.Epoch >= n.epoch {
				if c := (continuation{at: o, end: r.End, run: r}); c.beats(best) {
					best = c
				}
			}
		}
	}
	return best
}

// chainTo is the ranges that reach offset at from the stream's end, in
// order.
func chainTo(reached map[uint64]*node, usable []edge, at uint64) []edge {
	var chain []edge
	for o := at; reached[o].via >= 0; o = reached[o].from {
		chain = append(chain, usable[reached[o].via])
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	return chain
}

// gapBeyond describes the first range and the first run that start beyond
// the continuation's end, or is empty when there are none.
func gapBeyond(id, end uint64, usable []edge, live []Run) string {
	var beyond []string
	for _, e := range usable {
		if e.start > end {
			beyond = append(beyond, fmt.Sprintf("an object from %d (epoch %d)", e.start, e.epoch))
			break
		}
	}
	for _, r := range live {
		if r.Start > end {
			beyond = append(beyond, fmt.Sprintf("%s's WAL from %d (epoch %d)", r.Broker, r.Start, r.Epoch))
			break
		}
	}
	if len(beyond) == 0 {
		return ""
	}
	return fmt.Sprintf("stream %d stops at %d: %s beyond it, the records between are in no object and no WAL", id, end, strings.Join(beyond, " and "))
}

// order returns the commits: each candidate with the ranges taken from it,
// in an order in which every range starts at its stream's end. A candidate
// whose ranges are all next in their streams is committed whole (under its
// own id when they are all of its index's); when none is, the first
// candidate with a range next is committed in part, under an id naming
// its streams, and the rest of it later.
func order(cands []Candidate, chains map[uint64][]edge) []*waldenv1.ReconciledObject {
	o := newOrdering(cands, chains)
	for {
		progress, remaining := o.emitWhole()
		if !remaining {
			return o.out
		}
		if !progress {
			// Every stream's next range is in some candidate: commit the
			// first one's ready ranges on their own.
			o.emitFirstPart()
		}
	}
}

// ordering is order's progress: each stream's position in its chain, the
// ranges of each candidate still to commit, and the commits so far.
type ordering struct {
	cands  []Candidate
	chains map[uint64][]edge
	pos    map[uint64]int
	left   map[int]map[uint64]*waldenv1.ObjectRange
	out    []*waldenv1.ReconciledObject
}

func newOrdering(cands []Candidate, chains map[uint64][]edge) *ordering {
	o := &ordering{cands: cands, chains: chains, pos: map[uint64]int{}, left: map[int]map[uint64]*waldenv1.ObjectRange{}}
	for id, chain := range chains {
		for _, e := range chain {
			if o.left[e.cand] == nil {
				o.left[e.cand] = map[uint64]*waldenv1.ObjectRange{}
			}
			o.left[e.cand][id] = e.r
		}
	}
	return o
}

// next says whether r is stream's next range to commit.
func (o *ordering) next(stream uint64, r *waldenv1.ObjectRange) bool {
	c := o.chains[stream]
	return o.pos[stream] < len(c) && c[o.pos[stream]].r == r
}

// nextStreams are the streams, in id order, whose next range candidate i
// holds.
func (o *ordering) nextStreams(i int) []uint64 {
	var ready []uint64
	for _, sid := range sortedKeys(o.left[i]) {
		if o.next(sid, o.left[i][sid]) {
			ready = append(ready, sid)
		}
	}
	return ready
}

// emitWhole commits, in candidate order, every candidate whose ranges left
// are all next in their streams. It says whether it committed any, and
// whether any candidate had ranges left.
func (o *ordering) emitWhole() (progress, remaining bool) {
	for i := range o.cands {
		if len(o.left[i]) == 0 {
			continue
		}
		remaining = true
		if streams := sortedKeys(o.left[i]); len(o.nextStreams(i)) == len(streams) {
			o.emit(i, streams, true)
			progress = true
		}
	}
	return progress, remaining
}

// emitFirstPart commits the ranges of the first candidate that holds a
// stream's next range, those that are next.
func (o *ordering) emitFirstPart() {
	for i := range o.cands {
		if ready := o.nextStreams(i); len(ready) > 0 {
			o.emit(i, ready, false)
			return
		}
	}
}

// emit commits the ranges of candidate i in streams, with their producers;
// whole says they are all its ranges left.
func (o *ordering) emit(i int, streams []uint64, whole bool) {
	c := o.cands[i]
	obj := cloneObject(c.Object)
	obj.Ranges = nil
	var prods []*waldenv1.StreamProducers
	for _, sid := range streams {
		obj.Ranges = append(obj.Ranges, o.left[i][sid])
		if ps := c.Producers[sid]; len(ps) > 0 {
			prods = append(prods, &waldenv1.StreamProducers{StreamId: sid, Producers: ps})
		}
		delete(o.left[i], sid)
		o.pos[sid]++
	}
	sort.Slice(obj.Ranges, func(a, b int) bool { return obj.Ranges[a].GetPosition() < obj.Ranges[b].GetPosition() })
	if !whole || !c.Whole || len(obj.Ranges) != len(c.Object.GetRanges()) {
		obj.ObjectId = partialID(c.Object.GetObjectId(), streams)
	}
	o.out = append(o.out, &waldenv1.ReconciledObject{Object: obj, Producers: prods})
}

// partialID is the id of a commit of some of an object's ranges.
func partialID(id string, streams []uint64) string {
	parts := make([]string, len(streams))
	for i, s := range streams {
		parts[i] = strconv.FormatUint(s, 10)
	}
	return id + "+" + strings.Join(parts, "+")
}

// sortedKeys are m's keys in increasing order.
func sortedKeys[V any](m map[uint64]V) []uint64 {
	out := make([]uint64, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func cloneObject(o *waldenv1.Object) *waldenv1.Object {
	return proto.Clone(o).(*waldenv1.Object)
}
