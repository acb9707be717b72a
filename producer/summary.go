package producer

import (
	"slices"

	waldenv1 "walden/proto/walden/v1"
)

// Summary collects, per stream, the last batch of each producer among the
// batches added: what a commit of those batches tells the catalog.
type Summary struct {
	streams map[uint64]map[uint64]*waldenv1.ProducerState
}

// Add notes a batch of count records at baseOffset of stream streamID. A
// payload without producer header adds nothing; a malformed header is an
// error (nothing added).
func (s *Summary) Add(streamID, baseOffset uint64, count uint32, payload []byte) error {
	h, err := HeaderOf(payload)
	if err != nil || h.ID == 0 {
		return err
	}
	if s.streams == nil {
		s.streams = map[uint64]map[uint64]*waldenv1.ProducerState{}
	}
	m := s.streams[streamID]
	if m == nil {
		m = map[uint64]*waldenv1.ProducerState{}
		s.streams[streamID] = m
	}
	if prev := m[h.ID]; prev == nil || prev.GetOffset() < baseOffset {
		m[h.ID] = &waldenv1.ProducerState{ProducerId: h.ID, Sequence: h.Sequence, Count: count, Offset: baseOffset}
	}
	return nil
}

// Streams returns the summary sorted by stream id, each stream's producers
// sorted by producer id (nil when no batch had a producer).
func (s *Summary) Streams() []*waldenv1.StreamProducers {
	var out []*waldenv1.StreamProducers
	for id, m := range s.streams {
		t := &Table{m: m}
		out = append(out, &waldenv1.StreamProducers{StreamId: id, Producers: t.States()})
	}
	slices.SortFunc(out, func(a, b *waldenv1.StreamProducers) int {
		switch {
		case a.GetStreamId() < b.GetStreamId():
			return -1
		case a.GetStreamId() > b.GetStreamId():
			return 1
		}
		return 0
	})
	return out
}
