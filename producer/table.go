package producer

import (
	"slices"

	waldenv1 "walden/proto/walden/v1"
)

// MaxPerStream bounds a stream's producer table: beyond it the producer
// whose last batch has the lowest offset is forgotten (it must then start
// again with a new producer id: UNKNOWN_PRODUCER).
const MaxPerStream = 256

// Verdict is the outcome of checking an append against a stream's table.
type Verdict int

const (
	// Append: the batch is the producer's next one (or the first batch,
	// sequence 0, of a producer the stream does not know): write it.
	Append Verdict = iota
	// Duplicate: the batch is a retry of the producer's last batch, already
	// stored: acknowledge it with the stored offsets, write nothing.
	Duplicate
	// OutOfOrder: the sequence is neither the next one nor the last
	// batch's (a gap, an older batch, or a retry with another count).
	OutOfOrder
	// Unknown: a sequence other than 0 from a producer the stream does not
	// know.
	Unknown
)

// Table is one stream's producer table: the last batch of each producer.
// It is not safe for concurrent use.
type Table struct {
	m map[uint64]*waldenv1.ProducerState
}

// NewTable returns a table holding copies of states (a stream's table as
// the catalog committed it).
func NewTable(states []*waldenv1.ProducerState) *Table {
	t := &Table{m: make(map[uint64]*waldenv1.ProducerState, len(states))}
	for _, s := range states {
		t.record(s.GetProducerId(), s.GetSequence(), s.GetCount(), s.GetOffset())
	}
	return t
}

// Check judges an append of count records at sequence by producer id (not
// 0). For Duplicate and OutOfOrder it also returns the producer's last
// batch (a copy).
func (t *Table) Check(id, sequence uint64, count uint32) (Verdict, *waldenv1.ProducerState) {
	last := t.m[id]
	switch {
	case last == nil && sequence == 0:
		return Append, nil
	case last == nil:
		return Unknown, nil
	case sequence == last.GetSequence() && count == last.GetCount():
		return Duplicate, clone(last)
	case sequence == last.GetSequence()+uint64(last.GetCount()):
		return Append, nil
	}
	return OutOfOrder, clone(last)
}

// Record notes that producer id's batch of count records starting at
// sequence was stored at offset: it becomes the producer's last batch.
func (t *Table) Record(id, sequence uint64, count uint32, offset uint64) {
	t.record(id, sequence, count, offset)
}

func (t *Table) record(id, sequence uint64, count uint32, offset uint64) {
	if t.m == nil {
		t.m = map[uint64]*waldenv1.ProducerState{}
	}
	t.m[id] = &waldenv1.ProducerState{ProducerId: id, Sequence: sequence, Count: count, Offset: offset}
	for len(t.m) > MaxPerStream {
		// Forget the producer whose last batch is the oldest (the lowest
		// offset; the lowest id among equals), the same way on every
		// member.
		var victim *waldenv1.ProducerState
		for _, s := range t.m {
			if victim == nil || s.GetOffset() < victim.GetOffset() ||
				(s.GetOffset() == victim.GetOffset() && s.GetProducerId() < victim.GetProducerId()) {
				victim = s
			}
		}
		delete(t.m, victim.GetProducerId())
	}
}

// Merge records each producer's last batch of states (a commit's summary
// of one stream's range).
func (t *Table) Merge(states []*waldenv1.ProducerState) {
	for _, s := range states {
		t.record(s.GetProducerId(), s.GetSequence(), s.GetCount(), s.GetOffset())
	}
}

// Len is the number of producers in the table.
func (t *Table) Len() int { return len(t.m) }

// States returns copies of the table's entries sorted by producer id.
func (t *Table) States() []*waldenv1.ProducerState {
	out := make([]*waldenv1.ProducerState, 0, len(t.m))
	for _, s := range t.m {
		out = append(out, clone(s))
	}
	slices.SortFunc(out, func(a, b *waldenv1.ProducerState) int {
		switch {
		case a.GetProducerId() < b.GetProducerId():
			return -1
		case a.GetProducerId() > b.GetProducerId():
			return 1
		}
		return 0
	})
	return out
}

func clone(s *waldenv1.ProducerState) *waldenv1.ProducerState {
	return &waldenv1.ProducerState{ProducerId: s.GetProducerId(), Sequence: s.GetSequence(), Count: s.GetCount(), Offset: s.GetOffset()}
}
