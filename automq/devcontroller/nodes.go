package devcontroller

import (
	"maps"
	"slices"
)

// OpeningStream is one stream of a GetOpeningStreams answer.
type OpeningStream struct {
	StreamID    int64 `json:"stream_id"`
	Epoch       int64 `json:"epoch"`
	StartOffset int64 `json:"start_offset"`
	EndOffset   int64 `json:"end_offset"`
}

// GetOpeningStreams applies GetOpeningStreams (StreamControlManager
// .getOpeningStreams): an epoch below the node's gets NODE_EPOCH_EXPIRED and
// changes nothing; otherwise the node is recorded (created if unknown) with
// the request's epoch and its failover flag set to failoverMode — true
// fences the node (its later non-failover requests get NODE_FENCED), false
// clears the flag. The answer lists the streams OPENED with the node as
// their current range's owner, in stream id order, each with its end offset
// raised to its start offset as AutoMQ does.
func (s *State) GetOpeningStreams(nodeID int32, nodeEpoch int64, failoverMode bool) ([]OpeningStream, Code) {
	n, ok := s.nodes[nodeID]
	if ok && nodeEpoch < n.epoch {
		return nil, NodeEpochExpired
	}
	if !ok {
		n = &node{}
		s.nodes[nodeID] = n
	}
	n.epoch = nodeEpoch
	n.failover = failoverMode
	return s.openingStreams(nodeID), None
}

// openingStreams lists the streams the node holds OPENED.
func (s *State) openingStreams(nodeID int32) []OpeningStream {
	var out []OpeningStream
	for _, id := range slices.Sorted(maps.Keys(s.streams)) {
		st := s.streams[id]
		if st.state != StreamOpened || st.owner() != nodeID {
			continue
		}
		out = append(out, OpeningStream{
			StreamID:    id,
			Epoch:       st.epoch,
			StartOffset: st.start,
			EndOffset:   max(st.end, st.start),
		})
	}
	return out
}

// NodeInfo is one node of an AutomqGetNodes answer.
type NodeInfo struct {
	NodeRegistration
	HasOpeningStreams bool `json:"has_opening_streams"`
}

// GetNodes applies AutomqGetNodes (NodeControlManager.getMetadata): the
// registered nodes among ids, in the order asked and skipping unknown ones,
// or every registered node in id order when ids is empty.
func (s *State) GetNodes(ids []int32) []NodeInfo {
	if len(ids) == 0 {
		ids = slices.Sorted(maps.Keys(s.registry))
	}
	out := make([]NodeInfo, 0, len(ids))
	for _, id := range ids {
		r, ok := s.registry[id]
		if !ok {
			continue
		}
		out = append(out, NodeInfo{
			NodeRegistration: NodeRegistration{
				NodeID:    id,
				NodeEpoch: r.epoch,
				WALConfig: r.walConfig,
				State:     r.state,
				Tags:      slices.Clone(r.tags),
			},
			HasOpeningStreams: len(s.openingStreams(id)) > 0,
		})
	}
	return out
}
