package reconcile

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	waldenv1 "walden/proto/walden/v1"
)

// cand is a candidate of one range per (stream, epoch, start, end).
func cand(id string, ranges ...[4]uint64) Candidate {
	o := &waldenv1.Object{ObjectId: id, Key: "p/" + id + ".obj", Size: 1000}
	pos := uint64(16)
	for _, r := range ranges {
		o.Ranges = append(o.Ranges, &waldenv1.ObjectRange{StreamId: r[0], StreamEpoch: r[1], StartOffset: r[2], EndOffset: r[3], Position: pos, Length: 32})
		pos += 32
	}
	return Candidate{Object: o, Whole: true, Producers: map[uint64][]*waldenv1.ProducerState{}}
}

// commits are the plan's commits as "id:stream[start,end)@epoch ...".
func commits(out Output) []string {
	var s []string
	for _, c := range out.Commits {
		var rs []string
		for _, r := range c.GetObject().GetRanges() {
			rs = append(rs, fmt.Sprintf("%d[%d,%d)@%d", r.GetStreamId(), r.GetStartOffset(), r.GetEndOffset(), r.GetStreamEpoch()))
		}
		s = append(s, c.GetObject().GetObjectId()+":"+strings.Join(rs, " "))
	}
	return s
}

func tails(out Output) []string {
	var s []string
	for _, t := range out.Tails {
		s = append(s, fmt.Sprintf("%d:%s@%d[%d,%d)", t.GetStreamId(), t.GetBrokerId(), t.GetStreamEpoch(), t.GetFromOffset(), t.GetEndOffset()))
	}
	return s
}

func TestPlan(t *testing.T) {
	for _, c := range []struct {
		name       string
		in         Input
		commits    []string
		tails      []string
		redundant  uint64
		superseded uint64
		unreached  uint64
		gap        string
	}{
		{name: "objects in order",
			in:      Input{Streams: map[uint64]Stream{1: {End: 5, Floor: 1}}, Candidates: []Candidate{cand("B", [4]uint64{1, 1, 8, 12}), cand("A", [4]uint64{1, 1, 5, 8})}},
			commits: []string{"A:1[5,8)@1", "B:1[8,12)@1"}},
		{name: "an uncommitted copy with other boundaries is redundant",
			in: Input{Streams: map[uint64]Stream{1: {End: 5, Floor: 1}}, Candidates: []Candidate{
				cand("A", [4]uint64{1, 1, 5, 10}), cand("B", [4]uint64{1, 1, 5, 8}), cand("C", [4]uint64{1, 1, 8, 12})}},
			commits: []string{"B:1[5,8)@1", "C:1[8,12)@1"}, redundant: 1},
		{name: "a later epoch from the same offset supersedes",
			in: Input{Streams: map[uint64]Stream{1: {End: 5, Floor: 1}}, Candidates: []Candidate{
				cand("A", [4]uint64{1, 1, 5, 9}), cand("D", [4]uint64{1, 2, 5, 7})}},
			commits: []string{"D:1[5,7)@2"}, superseded: 1},
		{name: "an epoch below the stream's floor is never taken",
			in:         Input{Streams: map[uint64]Stream{1: {End: 5, Floor: 3}}, Candidates: []Candidate{cand("A", [4]uint64{1, 2, 5, 9})}},
			superseded: 1},
		{name: "a WAL holds the tail",
			in: Input{Streams: map[uint64]Stream{1: {End: 5, Floor: 1}}, Candidates: []Candidate{cand("A", [4]uint64{1, 1, 5, 8})},
				Runs: []Run{{Broker: "b1", Stream: 1, Epoch: 1, Start: 6, End: 15}}},
			commits: []string{"A:1[5,8)@1"}, tails: []string{"1:b1@1[8,15)"}},
		{name: "an object reaching as far as a WAL is preferred",
			in: Input{Streams: map[uint64]Stream{1: {End: 5, Floor: 1}}, Candidates: []Candidate{cand("A", [4]uint64{1, 1, 5, 8})},
				Runs: []Run{{Broker: "b1", Stream: 1, Epoch: 1, Start: 6, End: 8}}},
			commits: []string{"A:1[5,8)@1"}},
		{name: "a zombie's records beyond a failover are superseded by the next owner's WAL",
			in: Input{Streams: map[uint64]Stream{1: {End: 100, Floor: 1}}, Candidates: []Candidate{cand("job", [4]uint64{1, 1, 100, 200})},
				Runs: []Run{{Broker: "b1", Stream: 1, Epoch: 1, Start: 150, End: 210}, {Broker: "b2", Stream: 1, Epoch: 2, Start: 200, End: 300}}},
			commits: []string{"job:1[100,200)@1"}, tails: []string{"1:b2@2[200,300)"}},
		{name: "a stream the backup did not know starts at 0",
			in:      Input{Candidates: []Candidate{cand("N", [4]uint64{9, 1, 0, 4})}, Runs: []Run{{Broker: "b3", Stream: 9, Epoch: 1, Start: 0, End: 6}}},
			commits: []string{"N:9[0,4)@1"}, tails: []string{"9:b3@1[4,6)"}},
		{name: "records beyond a hole are out of reach",
			in:  Input{Streams: map[uint64]Stream{1: {End: 5, Floor: 1}}, Candidates: []Candidate{cand("A", [4]uint64{1, 1, 7, 9})}},
			gap: "stream 1 stops at 5: an object from 7 (epoch 1) beyond it", unreached: 1},
		{name: "objects whose streams cross are committed in part",
			in:      Input{Candidates: []Candidate{cand("X", [4]uint64{1, 1, 0, 5}, [4]uint64{2, 1, 5, 10}), cand("Y", [4]uint64{1, 1, 5, 10}, [4]uint64{2, 1, 0, 5})}},
			commits: []string{"X+1:1[0,5)@1", "Y:1[5,10)@1 2[0,5)@1", "X+2:2[5,10)@1"}},
		{name: "a range the catalog holds is left out of its object's commit",
			in:      Input{Streams: map[uint64]Stream{2: {End: 5, Floor: 1}}, Candidates: []Candidate{cand("X", [4]uint64{1, 1, 0, 5}, [4]uint64{2, 1, 0, 5})}},
			commits: []string{"X+1:1[0,5)@1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := Plan(c.in)
			if got := commits(out); !slices.Equal(got, c.commits) {
				t.Errorf("commits %q, want %q", got, c.commits)
			}
			if got := tails(out); !slices.Equal(got, c.tails) {
				t.Errorf("tails %q, want %q", got, c.tails)
			}
			if out.Redundant != c.redundant || out.Superseded != c.superseded || out.Unreached != c.unreached {
				t.Errorf("redundant %d superseded %d unreached %d, want %d %d %d", out.Redundant, out.Superseded, out.Unreached,
					c.redundant, c.superseded, c.unreached)
			}
			if gap := strings.Join(out.Gaps, "; "); !strings.HasPrefix(gap, c.gap) || (c.gap == "") != (gap == "") {
				t.Errorf("gaps %q, want %q", gap, c.gap)
			}
		})
	}
}

// history is one stream's life in the old cluster: each stream epoch's
// owner wrote records from where the stream's committed end was when it
// opened it. What it acknowledged is the truth; it uploaded some in
// objects (committed, and sometimes uploaded again with other boundaries
// and never committed), its recovery committed the rest from its WAL, and
// a zombie wrote a few records of its epoch beyond the end the next owner
// opened at (written, never acknowledged). The last owner's records beyond
// its last upload are in its WAL only.
type history struct {
	truth   []uint64 // epoch of each acknowledged offset
	commits []Candidate
	orphans []Candidate
	runs    []Run
}

func genHistory(rng *rand.Rand, stream uint64) *history {
	h := &history{}
	n := 0
	for e := uint64(1); e <= uint64(1+rng.IntN(4)); e++ {
		owner := fmt.Sprintf("b%d", 1+rng.IntN(3))
		start := uint64(len(h.truth))
		k := 1 + rng.IntN(40)
		for range k {
			h.truth = append(h.truth, e)
		}
		end := uint64(len(h.truth))
		// Committed objects cut [start, end), the last maybe by the
		// recovery; sometimes a copy with other boundaries is left.
		for o := start; o < end; {
			step := min(end-o, uint64(1+rng.IntN(10)))
			n++
			h.commits = append(h.commits, cand(fmt.Sprintf("o%03d", n), [4]uint64{stream, e, o, o + step}))
			if rng.IntN(4) == 0 {
				n++
				h.orphans = append(h.orphans, cand(fmt.Sprintf("o%03d", n), [4]uint64{stream, e, o, min(end, o+step+uint64(rng.IntN(5)))}))
			}
			o += step
		}
		// The owner's WAL still holds its records (the recovery reads,
		// never trims), and a zombie's unacknowledged records beyond.
		h.runs = append(h.runs, Run{Broker: owner, Stream: stream, Epoch: e, Start: start + uint64(rng.IntN(int(end-start))), End: end})
		if rng.IntN(3) == 0 {
			h.runs[len(h.runs)-1].End = end + uint64(1+rng.IntN(5))
			if rng.IntN(2) == 0 {
				n++
				h.orphans = append(h.orphans, cand(fmt.Sprintf("o%03d", n), [4]uint64{stream, e, end, end + 1}))
			}
		}
	}
	// The last owner acknowledged records it never uploaded: the last
	// objects are not there, its WAL holds them.
	last := h.runs[len(h.runs)-1]
	if last.End == uint64(len(h.truth)) {
		keep := len(h.commits)
		for keep > 0 && h.commits[keep-1].Object.GetRanges()[0].GetStreamEpoch() == last.Epoch &&
			h.commits[keep-1].Object.GetRanges()[0].GetStartOffset() >= last.Start && rng.IntN(2) == 0 {
			keep--
		}
		h.commits = h.commits[:keep]
	}
	return h
}

// TestPlanFindsTheTruth: over random histories, from a backup taken after
// any commit, the plan continues every stream exactly with the records
// acknowledged — every offset at the epoch that acknowledged it, none
// missing, no zombie's record — and commits in an order the catalog
// accepts.
func TestPlanFindsTheTruth(t *testing.T) {
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 7))
		h := genHistory(rng, 1)
		cut := rng.IntN(len(h.commits) + 1)
		st := Stream{}
		if cut > 0 {
			r := h.commits[cut-1].Object.GetRanges()[0]
			st = Stream{End: r.GetEndOffset(), Floor: r.GetStreamEpoch()}
		}
		in := Input{Streams: map[uint64]Stream{1: st}, Runs: h.runs}
		in.Candidates = append(append(in.Candidates, h.commits[cut:]...), h.orphans...)
		slices.SortFunc(in.Candidates, func(a, b Candidate) int { return strings.Compare(a.Object.GetKey(), b.Object.GetKey()) })
		out := Plan(in)
		// Replay the commits as the catalog would, then the tail.
		end, floor := st.End, st.Floor
		got := map[uint64]uint64{}
		for _, c := range out.Commits {
			r := c.GetObject().GetRanges()[0]
			if r.GetStartOffset() != end || r.GetStreamEpoch() < floor {
				t.Fatalf("seed %d: commit %v at end %d floor %d\n%s", seed, commits(out), end, floor, describe(h, in))
			}
			for o := r.GetStartOffset(); o < r.GetEndOffset(); o++ {
				got[o] = r.GetStreamEpoch()
			}
			end, floor = r.GetEndOffset(), r.GetStreamEpoch()
		}
		for _, tl := range out.Tails {
			if tl.GetFromOffset() != end || tl.GetStreamEpoch() < floor {
				t.Fatalf("seed %d: tail %v at end %d floor %d", seed, tails(out), end, floor)
			}
			for o := tl.GetFromOffset(); o < tl.GetEndOffset(); o++ {
				got[o] = tl.GetStreamEpoch()
			}
			end = tl.GetEndOffset()
		}
		if end < uint64(len(h.truth)) {
			t.Fatalf("seed %d: the plan stops at %d, %d offsets were acknowledged; commits %q tails %q gaps %q\n%s",
				seed, end, len(h.truth), commits(out), tails(out), out.Gaps, describe(h, in))
		}
		for o := st.End; o < uint64(len(h.truth)); o++ {
			if got[o] != h.truth[o] {
				t.Fatalf("seed %d: offset %d at epoch %d, acknowledged at epoch %d; commits %q tails %q\n%s",
					seed, o, got[o], h.truth[o], commits(out), tails(out), describe(h, in))
			}
		}
	}
}

func describe(h *history, in Input) string {
	var b strings.Builder
	fmt.Fprintf(&b, "truth %v\nstream %+v\n", h.truth, in.Streams[1])
	for _, c := range in.Candidates {
		r := c.Object.GetRanges()[0]
		fmt.Fprintf(&b, "candidate %s [%d,%d)@%d\n", c.Object.GetObjectId(), r.GetStartOffset(), r.GetEndOffset(), r.GetStreamEpoch())
	}
	for _, r := range in.Runs {
		fmt.Fprintf(&b, "run %s [%d,%d)@%d\n", r.Broker, r.Start, r.End, r.Epoch)
	}
	return b.String()
}

// TestPlanFindsTheTruthAcrossStreams: as TestPlanFindsTheTruth with
// objects holding two streams each (their commits paired in order), so
// that the commits must be ordered across streams and some taken in part.
func TestPlanFindsTheTruthAcrossStreams(t *testing.T) {
	for seed := range uint64(1000) {
		rng := rand.New(rand.NewPCG(seed, 11))
		hs := []*history{genHistory(rng, 1), genHistory(rng, 2)}
		merge := func(a, b []Candidate, prefix string) []Candidate {
			var out []Candidate
			for i := 0; i < max(len(a), len(b)); i++ {
				var rs [][4]uint64
				for _, l := range [][]Candidate{a, b} {
					if i < len(l) {
						r := l[i].Object.GetRanges()[0]
						rs = append(rs, [4]uint64{r.GetStreamId(), r.GetStreamEpoch(), r.GetStartOffset(), r.GetEndOffset()})
					}
				}
				out = append(out, cand(fmt.Sprintf("%s%03d", prefix, i), rs...))
			}
			return out
		}
		commitsAll := merge(hs[0].commits, hs[1].commits, "c")
		orphans := merge(hs[0].orphans, hs[1].orphans, "x")
		cut := rng.IntN(len(commitsAll) + 1)
		streams := map[uint64]Stream{}
		for _, c := range commitsAll[:cut] {
			for _, r := range c.Object.GetRanges() {
				streams[r.GetStreamId()] = Stream{End: r.GetEndOffset(), Floor: r.GetStreamEpoch()}
			}
		}
		in := Input{Streams: streams, Runs: append(append([]Run(nil), hs[0].runs...), hs[1].runs...)}
		in.Candidates = append(append(in.Candidates, commitsAll[cut:]...), orphans...)
		rng.Shuffle(len(in.Candidates), func(i, j int) { in.Candidates[i], in.Candidates[j] = in.Candidates[j], in.Candidates[i] })
		out := Plan(in)
		end := map[uint64]uint64{1: streams[1].End, 2: streams[2].End}
		floor := map[uint64]uint64{1: streams[1].Floor, 2: streams[2].Floor}
		got := map[uint64]map[uint64]uint64{1: {}, 2: {}}
		ids := map[string]bool{}
		for _, c := range out.Commits {
			if ids[c.GetObject().GetObjectId()] {
				t.Fatalf("seed %d: object id %s committed twice: %q", seed, c.GetObject().GetObjectId(), commits(out))
			}
			ids[c.GetObject().GetObjectId()] = true
			for _, r := range c.GetObject().GetRanges() {
				s := r.GetStreamId()
				if r.GetStartOffset() != end[s] || r.GetStreamEpoch() < floor[s] {
					t.Fatalf("seed %d: commits %q: stream %d at end %d floor %d", seed, commits(out), s, end[s], floor[s])
				}
				for o := r.GetStartOffset(); o < r.GetEndOffset(); o++ {
					got[s][o] = r.GetStreamEpoch()
				}
				end[s], floor[s] = r.GetEndOffset(), r.GetStreamEpoch()
			}
		}
		for _, tl := range out.Tails {
			s := tl.GetStreamId()
			if tl.GetFromOffset() != end[s] || tl.GetStreamEpoch() < floor[s] {
				t.Fatalf("seed %d: tail %v at end %d floor %d", seed, tails(out), end[s], floor[s])
			}
			for o := tl.GetFromOffset(); o < tl.GetEndOffset(); o++ {
				got[s][o] = tl.GetStreamEpoch()
			}
			end[s] = tl.GetEndOffset()
		}
		for i, h := range hs {
			s := uint64(i + 1)
			if end[s] < uint64(len(h.truth)) {
				t.Fatalf("seed %d: stream %d stops at %d, %d acknowledged; commits %q tails %q gaps %q", seed, s, end[s], len(h.truth),
					commits(out), tails(out), out.Gaps)
			}
			for o := streams[s].End; o < uint64(len(h.truth)); o++ {
				if got[s][o] != h.truth[o] {
					t.Fatalf("seed %d: stream %d offset %d at epoch %d, acknowledged at %d", seed, s, o, got[s][o], h.truth[o])
				}
			}
		}
	}
}
