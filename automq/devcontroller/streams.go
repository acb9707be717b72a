package devcontroller

import (
	"maps"
	"slices"
)

// Opened is a successful OpenStreams answer for one stream.
type Opened struct {
	StartOffset int64 `json:"start_offset"`
	NextOffset  int64 `json:"next_offset"`
}

// OpenStream applies one stream of OpenStreams (StreamControlManager
// .openStream). In order:
//   - the node epoch check with the failover flag (NODE_EPOCH_NOT_EXIST,
//     NODE_EPOCH_EXPIRED, NODE_FENCED);
//   - an unknown stream gets STREAM_NOT_EXIST;
//   - a request epoch below the stream's gets STREAM_FENCED;
//   - the stream's own epoch is a retry: the current range's owner gets
//     success (a CLOSED stream is OPENED again under the same epoch and
//     range), another node STREAM_FENCED, a stream without a range
//     STREAM_INNER_ERROR;
//   - a higher epoch while the stream is OPENED — by any node, its owner
//     included — gets STREAM_NOT_CLOSED;
//   - otherwise the stream opens under the request's epoch (the opener picks
//     it; AutoMQ's brokers pass the partition leader epoch) with a new range
//     owned by the node, starting at the stream's end offset (0 for the first
//     range, never below the start offset). The ranges that the stream's
//     first contiguous run of stream objects covers, except the last, are
//     removed. Tags (OpenStreams v1) are kept on a stream that has none yet.
func (s *State) OpenStream(nodeID int32, nodeEpoch, streamID, streamEpoch int64, tags ...Tag) (Opened, Code) {
	if code := s.nodeEpochCheck(nodeID, nodeEpoch, true); code != None {
		return Opened{}, code
	}
	st, ok := s.streams[streamID]
	if !ok {
		return Opened{}, StreamNotExist
	}
	switch {
	case st.epoch > streamEpoch:
		return Opened{}, StreamFenced
	case st.epoch == streamEpoch:
		return s.retryOpen(st, nodeID)
	case st.state == StreamOpened:
		return Opened{}, StreamNotClosed
	}
	// NODE_LOCKED (a locked last owner) is not modelled: nothing locks nodes
	// in the failover path.
	removable := st.removableRanges()
	newIndex := st.rangeIndex + 1
	next := int64(0)
	if newIndex > 0 {
		if last, ok := st.ranges[st.rangeIndex]; ok {
			last.end = st.end
			st.ranges[st.rangeIndex] = last
		}
		next = st.end
	}
	next = max(next, st.start)
	st.ranges[newIndex] = rangeMeta{node: nodeID, epoch: streamEpoch, start: next, end: next}
	for _, idx := range removable {
		delete(st.ranges, idx)
	}
	st.epoch = streamEpoch
	st.rangeIndex = newIndex
	st.state = StreamOpened
	if len(st.tags) == 0 && len(tags) > 0 {
		st.tags = slices.Clone(tags)
	}
	return Opened{StartOffset: st.start, NextOffset: next}, None
}

// retryOpen is StreamControlManager.retryOpen: the same epoch again.
func (s *State) retryOpen(st *stream, nodeID int32) (Opened, Code) {
	r, ok := st.currentRange()
	if !ok {
		return Opened{}, StreamInnerError
	}
	if r.node != nodeID {
		return Opened{}, StreamFenced
	}
	st.state = StreamOpened
	return Opened{StartOffset: st.start, NextOffset: max(st.start, st.end)}, None
}

// removableRanges is StreamRuntimeMetadata.checkRemovableRanges, computed
// before a new range is added: the indexes of the ranges, except the current
// one, that lie inside the first contiguous run of the stream's stream
// objects (ordered by start offset).
func (st *stream) removableRanges() []int32 {
	if len(st.objects) == 0 {
		return nil
	}
	byStart := slices.SortedFunc(maps.Values(st.objects), func(a, b offsets) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	covered := byStart[0]
	for _, o := range byStart[1:] {
		if o.start != covered.end {
			break
		}
		covered.end = o.end
	}
	idx := slices.Sorted(maps.Keys(st.ranges))
	if len(idx) == 0 {
		return nil
	}
	var out []int32
	for _, i := range idx[:len(idx)-1] {
		r := st.ranges[i]
		if covered.start <= r.start && r.end <= covered.end {
			out = append(out, i)
		}
	}
	return out
}

// CloseStream applies one stream of CloseStreams (StreamControlManager
// .closeStream). The node epoch is checked without the failover flag — a
// failover closes as the fenced node. Then the ownership check: an unknown
// stream gets STREAM_NOT_EXIST, a request epoch below the stream's
// STREAM_FENCED, above it STREAM_INNER_ERROR, a stream without a current
// range STREAM_INNER_ERROR, a current range owned by another node
// STREAM_FENCED. A CLOSED stream answers success and stays as it is;
// otherwise the stream becomes CLOSED with its epoch, range and offsets
// unchanged.
func (s *State) CloseStream(nodeID int32, nodeEpoch, streamID, streamEpoch int64) Code {
	if code := s.nodeEpochCheck(nodeID, nodeEpoch, false); code != None {
		return code
	}
	st, code := s.ownedStream(nodeID, streamID, streamEpoch)
	if code != None {
		return code
	}
	st.state = StreamClosed
	return None
}

// ownedStream is StreamControlManager.streamOwnershipCheck.
func (s *State) ownedStream(nodeID int32, streamID, streamEpoch int64) (*stream, Code) {
	st, ok := s.streams[streamID]
	if !ok {
		return nil, StreamNotExist
	}
	switch {
	case st.epoch > streamEpoch:
		return nil, StreamFenced
	case st.epoch < streamEpoch:
		return nil, StreamInnerError
	}
	r, ok := st.currentRange()
	if !ok {
		return nil, StreamInnerError
	}
	if r.node != nodeID {
		return nil, StreamFenced
	}
	return st, None
}
