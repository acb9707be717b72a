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
func Plan(in Input) Output {
	byStream := map[uint64][]edge{}
	runsOf := map[uint64][]Run{}
	for i, c := range in.Candidates {
		for _, r := range c.Object.GetRanges() {
			byStream[r.GetStreamId()] = append(byStream[r.GetStreamId()],
				edge{cand: i, r: r, start: r.GetStartOffset(), end: r.GetEndOffset(), epoch: r.GetStreamEpoch()})
		}
	}
	for _, r := range in.Runs {
		if r.Start < r.End {
			runsOf[r.Stream] = append(runsOf[r.Stream], r)
		}
	}
	ids := map[uint64]bool{}
	for id := range byStream {
		ids[id] = true
	}
	for id := range runsOf {
		ids[id] = true
	}
	var out Output
	taken := map[int][]*waldenv1.ObjectRange{} // candidate → its ranges taken
	chains := map[uint64][]edge{}
	superseded := map[int]bool{}
	final := map[uint64]uint64{}
	for _, id := range sortedIDs(ids) {
		st := in.Streams[id]
		chain, tail, excluded, gap := planStream(id, st, byStream[id], runsOf[id])
		final[id] = st.End
		if len(chain) > 0 {
			final[id] = chain[len(chain)-1].end
		}
		if tail != nil {
			final[id] = tail.GetEndOffset()
		}
		for _, e := range excluded {
			superseded[e.cand] = true
		}
		chains[id] = chain
		for _, e := range chain {
			taken[e.cand] = append(taken[e.cand], e.r)
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
	for i := range in.Candidates {
		if len(taken[i]) > 0 {
			continue
		}
		covered := true
		for _, r := range in.Candidates[i].Object.GetRanges() {
			if r.GetEndOffset() > final[r.GetStreamId()] {
				covered = false
			}
		}
		switch {
		case superseded[i]:
			out.Superseded++
		case covered:
			out.Redundant++
		default:
			out.Unreached++
		}
	}
	out.Commits = order(in.Candidates, chains)
	for _, c := range out.Commits {
		out.RangesCommitted += uint64(len(c.GetObject().GetRanges()))
	}
	return out
}

// planStream chooses one stream's continuation: the ranges to take in
// order, the WAL tail (or nil), the ranges set aside as superseded, and a
// gap's description when records beyond the continuation are out of reach.
func planStream(id uint64, st Stream, edges []edge, runs []Run) (chain []edge, tail *waldenv1.StreamTail, excluded []edge, gap string) {
	// cutoff(e): the lowest start of anything of an epoch above e.
	type start struct{ epoch, at uint64 }
	var starts []start
	for _, e := range edges {
		starts = append(starts, start{e.epoch, e.start})
	}
	for _, r := range runs {
		starts = append(starts, start{r.Epoch, r.Start})
	}
	cutoff := func(epoch uint64) uint64 {
		c := uint64(1<<64 - 1)
		for _, s := range starts {
			if s.epoch > epoch {
				c = min(c, s.at)
			}
		}
		return c
	}
	var usable []edge
	for _, e := range edges {
		switch {
		case e.epoch < st.Floor:
			excluded = append(excluded, e)
		case e.end > cutoff(e.epoch):
			excluded = append(excluded, e)
		case e.end <= st.End:
			// Below the catalog's end: nothing to take.
		default:
			usable = append(usable, e)
		}
	}
	var live []Run
	for _, r := range runs {
		if r.Epoch < st.Floor {
			continue
		}
		r.End = min(r.End, cutoff(r.Epoch))
		if r.Start < r.End && r.End > st.End {
			live = append(live, r)
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
	// Reach every offset from the end by ranges, each node with the lowest
	// epoch it can be reached at (the most ranges may follow it).
	type node struct {
		epoch uint64
		via   int // index in usable, -1 for the start
		from  uint64
	}
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
	// The furthest continuation: a node, or a node and a WAL run that holds
	// its offset at an epoch not below the node's. Objects are preferred to
	// a WAL that reaches as far, a higher epoch to a lower one.
	offsets := make([]uint64, 0, len(reached))
	for o := range reached {
		offsets = append(offsets, o)
	}
	sort.Slice(offsets, func(i, j int) bool { return offsets[i] < offsets[j] })
	best, bestEnd := st.End, st.End
	var bestRun *Run
	// better: further; then from objects alone; then from more objects
	// (offsets are visited in order); then the higher epoch's WAL, the
	// broker id.
	better := func(o, end uint64, r *Run) bool {
		switch {
		case end != bestEnd:
			return end > bestEnd
		case (r == nil) != (bestRun == nil):
			return r == nil
		case r == nil:
			return false
		case o != best:
			return o > best
		case r.Epoch != bestRun.Epoch:
			return r.Epoch > bestRun.Epoch
		default:
			return r.Broker < bestRun.Broker
		}
	}
	for _, o := range offsets {
		n := reached[o]
		if better(o, o, nil) {
			best, bestEnd, bestRun = o, o, nil
		}
		for k := range live {
			r := &live[k]
			if r.Start <= o && o < r.End && r.Epoch >= n.epoch && better(o, r.End, r) {
				best, bestEnd, bestRun = o, r.End, r
			}
		}
	}
	for o := best; reached[o].via >= 0; o = reached[o].from {
		chain = append(chain, usable[reached[o].via])
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	if bestRun != nil {
		tail = &waldenv1.StreamTail{StreamId: id, BrokerId: bestRun.Broker, StreamEpoch: bestRun.Epoch, FromOffset: best, EndOffset: bestRun.End}
	}
	// Anything that starts beyond the continuation's end is out of reach.
	var beyond []string
	for _, e := range usable {
		if e.start > bestEnd {
			beyond = append(beyond, fmt.Sprintf("an object from %d (epoch %d)", e.start, e.epoch))
			break
		}
	}
	for _, r := range live {
		if r.Start > bestEnd {
			beyond = append(beyond, fmt.Sprintf("%s's WAL from %d (epoch %d)", r.Broker, r.Start, r.Epoch))
			break
		}
	}
	if len(beyond) > 0 {
		gap = fmt.Sprintf("stream %d stops at %d: %s beyond it, the records between are in no object and no WAL", id, bestEnd, strings.Join(beyond, " and "))
	}
	return chain, tail, excluded, gap
}

// order returns the commits: each candidate with the ranges taken from it,
// in an order in which every range starts at its stream's end. A candidate
// whose ranges are all next in their streams is committed whole (under its
// own id when they are all of its index's); when none is, the first
// candidate with a range next is committed in part, under an id naming
// its streams, and the rest of it later.
func order(cands []Candidate, chains map[uint64][]edge) []*waldenv1.ReconciledObject {
	pos := map[uint64]int{}
	left := map[int]map[uint64]*waldenv1.ObjectRange{}
	for id, chain := range chains {
		for _, e := range chain {
			if left[e.cand] == nil {
				left[e.cand] = map[uint64]*waldenv1.ObjectRange{}
			}
			left[e.cand][id] = e.r
		}
	}
	next := func(stream uint64, r *waldenv1.ObjectRange) bool {
		c := chains[stream]
		return pos[stream] < len(c) && c[pos[stream]].r == r
	}
	var out []*waldenv1.ReconciledObject
	emit := func(i int, streams []uint64, whole bool) {
		c := cands[i]
		o := cloneObject(c.Object)
		o.Ranges = nil
		var prods []*waldenv1.StreamProducers
		for _, sid := range streams {
			o.Ranges = append(o.Ranges, left[i][sid])
			if ps := c.Producers[sid]; len(ps) > 0 {
				prods = append(prods, &waldenv1.StreamProducers{StreamId: sid, Producers: ps})
			}
			delete(left[i], sid)
			pos[sid]++
		}
		sort.Slice(o.Ranges, func(a, b int) bool { return o.Ranges[a].GetPosition() < o.Ranges[b].GetPosition() })
		if !whole || !c.Whole || len(o.Ranges) != len(c.Object.GetRanges()) {
			o.ObjectId = partialID(c.Object.GetObjectId(), streams)
		}
		out = append(out, &waldenv1.ReconciledObject{Object: o, Producers: prods})
	}
	for {
		progress, remaining := false, false
		for i := range cands {
			if len(left[i]) == 0 {
				continue
			}
			remaining = true
			streams := sortedStreams(left[i])
			ready := true
			for _, sid := range streams {
				if !next(sid, left[i][sid]) {
					ready = false
				}
			}
			if ready {
				emit(i, streams, true)
				progress = true
			}
		}
		if !remaining {
			return out
		}
		if progress {
			continue
		}
		// Every stream's next range is in some candidate: commit the first
		// one's ready ranges on their own.
		for i := range cands {
			var ready []uint64
			for _, sid := range sortedStreams(left[i]) {
				if next(sid, left[i][sid]) {
					ready = append(ready, sid)
				}
			}
			if len(ready) > 0 {
				emit(i, ready, false)
				break
			}
		}
	}
}

// partialID is the id of a commit of some of an object's ranges.
func partialID(id string, streams []uint64) string {
	parts := make([]string, len(streams))
	for i, s := range streams {
		parts[i] = strconv.FormatUint(s, 10)
	}
	return id + "+" + strings.Join(parts, "+")
}

func sortedStreams(m map[uint64]*waldenv1.ObjectRange) []uint64 {
	out := make([]uint64, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func sortedIDs(m map[uint64]bool) []uint64 {
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
