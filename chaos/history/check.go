package history

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"walden/refusal"
)

// Linearizability verdicts.
const (
	Linearizable    = "ok"
	NotLinearizable = "illegal"
	CheckTimedOut   = "unknown"
)

// cell is one record of a stream's content, linked to the one before it:
// states share their prefix, and a step appends in O(1).
type cell struct {
	prev *cell
	id   string
}

// streamState is the model's state of one stream: its content (n records,
// the last one tail), a hash of it, and the lowest stream epoch an append
// may still be acknowledged under.
type streamState struct {
	n     uint64
	tail  *cell
	hash  uint64
	floor uint64
}

func (s streamState) push(ids []string) streamState {
	for _, id := range ids {
		h := fnv.New64a()
		var b [8]byte
		for i := range b {
			b[i] = byte(s.hash >> (8 * i))
		}
		h.Write(b[:])
		h.Write([]byte(id))
		s.hash = h.Sum64()
		s.tail = &cell{prev: s.tail, id: id}
		s.n++
	}
	return s
}

// slice returns the ids at offsets [from, to) (to ≤ n).
func (s streamState) slice(from, to uint64) []string {
	out := make([]string, to-from)
	c := s.tail
	for off := s.n; off > from; off-- {
		if off <= to {
			out[off-1-from] = c.id
		}
		c = c.prev
	}
	return out
}

// step returns the states op may lead to from s (none: op cannot happen
// in s).
func step(s streamState, op *Op) []streamState {
	switch op.Kind {
	case KindAppend:
		switch op.Outcome {
		case Ok:
			if op.StreamEpoch < s.floor {
				return nil
			}
			if op.Duplicate {
				// A retry answered with where an earlier attempt
				// stored the same records: they are there already.
				end := op.Base + uint64(len(op.IDs))
				if end > s.n || !slices.Equal(s.slice(op.Base, end), op.IDs) {
					return nil
				}
				next := s
				next.floor = max(next.floor, op.StreamEpoch)
				return []streamState{next}
			}
			if op.Base != s.n {
				return nil
			}
			next := s.push(op.IDs)
			next.floor = max(next.floor, op.StreamEpoch)
			return []streamState{next}
		case Maybe, Unknown:
			// It took effect at one of its Bases, or not at all.
			if slices.Contains(op.Bases, s.n) {
				return []streamState{s, s.push(op.IDs)}
			}
			return []streamState{s}
		}
		return []streamState{s}
	case KindRead:
		if len(op.ReadIDs) == 0 {
			// Nothing read: the stream ends at From, unless an owner
			// had more to give.
			if op.Owner && op.From < s.n {
				return nil
			}
			return []streamState{s}
		}
		end := op.From + uint64(len(op.ReadIDs))
		if end > s.n {
			return nil
		}
		// The owner serves everything up to the stream's end, Max at most.
		if op.Owner && end != min(s.n, op.From+uint64(op.Max)) {
			return nil
		}
		got := s.slice(op.From, end)
		for i, id := range op.ReadIDs {
			if got[i] != id {
				return nil
			}
		}
		return []streamState{s}
	case KindStream:
		if op.EndOffset > s.n {
			return nil
		}
		switch op.State {
		case "closed":
			s.floor = max(s.floor, op.Epoch+1)
		case "opened":
			s.floor = max(s.floor, op.Epoch)
		}
		return []streamState{s}
	}
	return []streamState{s}
}

// Model is the Porcupine model of walden streams, partitioned by stream.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[uint64][]porcupine.Operation{}
			var keys []uint64
			for _, o := range h {
				id := o.Input.(*Op).Stream
				if _, ok := by[id]; !ok {
					keys = append(keys, id)
				}
				by[id] = append(by[id], o)
			}
			sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, by[k])
			}
			return out
		},
		Init: func() []any { return []any{streamState{}} },
		Step: func(state, input, _ any) []any {
			var out []any
			for _, s := range step(state.(streamState), input.(*Op)) {
				out = append(out, s)
			}
			return out
		},
		Equal: func(a, b any) bool {
			x, y := a.(streamState), b.(streamState)
			return x.n == y.n && x.hash == y.hash && x.floor == y.floor
		},
		Hash: func(a any) uint64 {
			x := a.(streamState)
			return x.hash ^ x.n*0x9e3779b97f4a7c15 ^ x.floor<<32
		},
		DescribeOperation: func(input, _ any) string { return describe(input.(*Op)) },
		DescribeState: func(state any) string {
			s := state.(streamState)
			return fmt.Sprintf("%d records, epoch floor %d", s.n, s.floor)
		},
	}
	return nm.ToModel()
}

func describe(op *Op) string {
	switch op.Kind {
	case KindAppend:
		if op.Outcome == Ok {
			return fmt.Sprintf("append %d records → ok at %d (stream epoch %d, %s)", len(op.IDs), op.Base, op.StreamEpoch, op.Broker)
		}
		return fmt.Sprintf("append %d records → %s %s (%s)", len(op.IDs), op.Outcome, op.Reason, op.Broker)
	case KindRead:
		return fmt.Sprintf("read from %d → %d records (%s, owner %v)", op.From, len(op.ReadIDs), op.Broker, op.Owner)
	case KindStream:
		return fmt.Sprintf("catalog: %s epoch %d by %s, end %d", op.State, op.Epoch, op.OwnerID, op.EndOffset)
	}
	return op.Kind
}

// resolve decides, from what the reads saw, where the appends without an
// acknowledgement may have taken effect. The records read at offsets that
// no acknowledged append covers form runs; each run is tiled by the record
// lists of unacknowledged appends (longest lists tried first), and every
// unacknowledged append carrying a tile's list may have taken effect at
// the tile's offset (Op.Bases): the model lets it take effect there or not
// at all, and the reads decide. An unacknowledged append placed nowhere
// did not take effect (the history ends with full reads of every stream,
// so its records would have been seen) and is dropped. Left free, each of
// them could take effect or not at every point of the history, and the
// check would take time exponential in their number.
func resolve(ops []Op) []Op {
	type key struct {
		stream uint64
		off    uint64
	}
	content := map[key]string{}
	covered := map[key]bool{}
	groups := map[string][]int{}     // stream and record list → unacknowledged appends
	lists := map[uint64][][]string{} // stream → distinct record lists
	for i, op := range ops {
		switch {
		case op.Kind == KindRead:
			for j, id := range op.ReadIDs {
				k := key{op.Stream, op.From + uint64(j)}
				if _, ok := content[k]; !ok {
					content[k] = id
				}
			}
		case op.Kind == KindAppend && op.Outcome == Ok && !op.Duplicate:
			// (A duplicate answer's records were stored by an
			// earlier, unacknowledged attempt: left to place.)
			for j := range op.IDs {
				covered[key{op.Stream, op.Base + uint64(j)}] = true
			}
		case op.Kind == KindAppend && (op.Outcome == Maybe || op.Outcome == Unknown) && len(op.IDs) > 0:
			g := fmt.Sprint(op.Stream, "\x00", strings.Join(op.IDs, "\x00"))
			if len(groups[g]) == 0 {
				lists[op.Stream] = append(lists[op.Stream], op.IDs)
			}
			groups[g] = append(groups[g], i)
		}
	}
	for _, l := range lists {
		sort.SliceStable(l, func(a, b int) bool { return len(l[a]) > len(l[b]) })
	}
	// The runs of records no acknowledgement covers, per stream.
	var extra []key
	for k := range content {
		if !covered[k] && len(lists[k.stream]) > 0 {
			extra = append(extra, k)
		}
	}
	sort.Slice(extra, func(a, b int) bool {
		if extra[a].stream != extra[b].stream {
			return extra[a].stream < extra[b].stream
		}
		return extra[a].off < extra[b].off
	})
	bases := map[int][]uint64{}
	tile := func(stream, start uint64, run []string) {
		// choice[i] is the list that starts a tiling of run[i:] (-1: none).
		cand := lists[stream]
		choice := make([]int, len(run)+1)
		for i := len(run) - 1; i >= 0; i-- {
			choice[i] = -1
			for li, l := range cand {
				end := i + len(l)
				if end > len(run) || (end < len(run) && choice[end] < 0) || !slices.Equal(run[i:end], l) {
					continue
				}
				choice[i] = li
				break
			}
		}
		choice[len(run)] = 0
		if len(run) == 0 || choice[0] < 0 {
			return
		}
		for i := 0; i < len(run); {
			l := cand[choice[i]]
			for _, op := range groups[fmt.Sprint(stream, "\x00", strings.Join(l, "\x00"))] {
				bases[op] = append(bases[op], start+uint64(i))
			}
			i += len(l)
		}
	}
	for i := 0; i < len(extra); {
		j := i
		run := []string{content[extra[i]]}
		for j+1 < len(extra) && extra[j+1].stream == extra[i].stream && extra[j+1].off == extra[j].off+1 {
			j++
			run = append(run, content[extra[j]])
		}
		tile(extra[i].stream, extra[i].off, run)
		i = j + 1
	}
	out := make([]Op, 0, len(ops))
	for i, op := range ops {
		if op.Kind == KindAppend && op.Outcome != Ok {
			if len(bases[i]) == 0 {
				continue
			}
			op.Bases = bases[i]
		}
		out = append(out, op)
	}
	return out
}

// Operations turns the stream operations of a history into Porcupine's.
// Appends without an acknowledgement are resolved first (see resolve):
// those that took effect keep their answer's time as the latest instant
// they could (a refusal came back after the write), or the end of the
// history when no answer came.
func Operations(ops []Op) []porcupine.Operation {
	var end int64
	for _, op := range ops {
		end = max(end, op.Return)
	}
	ops = resolve(append([]Op(nil), ops...))
	var out []porcupine.Operation
	for i := range ops {
		op := &ops[i]
		if op.Stream == 0 || (op.Kind != KindAppend && op.Kind != KindRead && op.Kind != KindStream) {
			continue
		}
		ret := op.Return
		if op.Kind == KindAppend && op.Outcome == Unknown {
			ret = end + 1
		}
		out = append(out, porcupine.Operation{ClientId: int(op.Stream % 1000), Input: op, Call: op.Call, Output: op, Return: ret})
	}
	return out
}

// Check runs the linearizability check (bounded by timeout) and, when the
// history is not linearizable and vizPath is set, writes Porcupine's
// visualization there.
func Check(ops []Op, timeout time.Duration, vizPath string) (string, error) {
	model := Model()
	res, info := porcupine.CheckOperationsVerbose(model, Operations(ops), timeout)
	switch res {
	case porcupine.Ok:
		return Linearizable, nil
	case porcupine.Illegal:
		if vizPath != "" {
			if err := porcupine.VisualizePath(model, info, vizPath); err != nil {
				return NotLinearizable, fmt.Errorf("history: visualization: %w", err)
			}
		}
		return NotLinearizable, nil
	}
	return CheckTimedOut, nil
}

// Counts are the direct checks of a history.
type Counts struct {
	Appends      int `json:"appends"`
	AppendsOK    int `json:"appends_ok"`
	Reads        int `json:"reads"`
	LeaseInvalid int `json:"lease_invalid"`
	// StaleWrites counts appends acknowledged under a stream epoch the
	// client had already seen closed or superseded in the catalog, or by a
	// broker epoch it had already seen fenced or superseded, before it
	// sent the append.
	StaleWrites int      `json:"stale_writes"`
	StaleWrite  []string `json:"stale_write_examples,omitempty"`
	// StaleLeases counts agent answers "valid" for a broker epoch the
	// client had already seen fenced or superseded.
	StaleLeases int `json:"stale_leases"`
}

// Count computes the direct checks.
func Count(ops []Op) Counts {
	var c Counts
	// For each stream and broker, the observations by return time.
	type seen struct {
		ret   int64
		floor uint64 // epochs below it are over
	}
	streamSeen := map[uint64][]seen{}
	brokerSeen := map[string][]seen{}
	for _, op := range ops {
		switch op.Kind {
		case KindStream:
			f := op.Epoch
			if op.State == "closed" {
				f++
			}
			streamSeen[op.Stream] = append(streamSeen[op.Stream], seen{op.Return, f})
		case KindBroker:
			f := op.Epoch
			if op.Fenced {
				f++
			}
			brokerSeen[op.Broker] = append(brokerSeen[op.Broker], seen{op.Return, f})
		}
	}
	floorAt := func(ss []seen, t int64) uint64 {
		var f uint64
		for _, s := range ss {
			if s.ret < t {
				f = max(f, s.floor)
			}
		}
		return f
	}
	for _, op := range ops {
		switch op.Kind {
		case KindAppend:
			c.Appends++
			if op.Reason == string(refusal.LeaseInvalid) {
				c.LeaseInvalid++
			}
			if op.Outcome != Ok {
				continue
			}
			c.AppendsOK++
			sf, bf := floorAt(streamSeen[op.Stream], op.Call), floorAt(brokerSeen[op.Broker], op.Call)
			if op.StreamEpoch < sf || op.BrokerEpoch < bf {
				c.StaleWrites++
				if len(c.StaleWrite) < 5 {
					c.StaleWrite = append(c.StaleWrite, fmt.Sprintf("stream %d offset %d acknowledged by %s under stream epoch %d, broker epoch %d, at %.3fs (floors seen: stream %d, broker %d)",
						op.Stream, op.Base, op.Broker, op.StreamEpoch, op.BrokerEpoch, float64(op.Return)/1e9, sf, bf))
				}
			}
		case KindRead:
			c.Reads++
		case KindLease:
			if op.Valid && op.Epoch < floorAt(brokerSeen[op.Broker], op.Call) {
				c.StaleLeases++
			}
		}
	}
	return c
}
