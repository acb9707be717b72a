package devcontroller

import (
	"maps"
	"slices"
	"time"

	"walden/automq/object"
)

// Snapshot is a copy of the whole state for inspection: what the HTTP
// endpoint serves and what a verifier reads to find every committed record
// through the objects and the streams' end offsets. Lists are ordered by id.
type Snapshot struct {
	ClusterID    string       `json:"cluster_id"`
	NextObjectID int64        `json:"next_object_id"`
	Nodes        []NodeView   `json:"nodes"`
	Streams      []StreamView `json:"streams"`
	Objects      []ObjectView `json:"objects"`
	Registered   []NodeInfo   `json:"registered_nodes"`
}

// NodeView is a node as the stream metadata knows it (from its
// GetOpeningStreams): its epoch and failover flag.
type NodeView struct {
	NodeID       int32 `json:"node_id"`
	NodeEpoch    int64 `json:"node_epoch"`
	FailoverMode bool  `json:"failover_mode"`
	// OpeningStreams counts the streams the node holds OPENED.
	OpeningStreams int `json:"opening_streams"`
}

// StreamView is a stream with its ranges.
type StreamView struct {
	StreamID    int64       `json:"stream_id"`
	Epoch       int64       `json:"epoch"`
	State       StreamState `json:"state"`
	Owner       int32       `json:"owner"` // the current range's node, −1 before the first open
	StartOffset int64       `json:"start_offset"`
	EndOffset   int64       `json:"end_offset"`
	RangeIndex  int32       `json:"range_index"`
	Ranges      []RangeView `json:"ranges"`
	// StreamObjects lists the ids of the stream's committed stream objects.
	StreamObjects []int64 `json:"stream_objects,omitempty"`
	// Tags are the stream's tags (its topic and partition in AutoMQ).
	Tags []Tag `json:"tags,omitempty"`
}

// RangeView is one range of a stream. The current range's end is the
// stream's end offset.
type RangeView struct {
	Index       int32 `json:"index"`
	NodeID      int32 `json:"node_id"`
	Epoch       int64 `json:"epoch"`
	StartOffset int64 `json:"start_offset"`
	EndOffset   int64 `json:"end_offset"`
}

// ObjectView is an S3 object the controller knows: prepared, committed or
// destroyed. Kind, Size, Ranges and the committing NodeID are set once it is
// committed.
type ObjectView struct {
	ObjectID   int64         `json:"object_id"`
	Key        string        `json:"key"`
	State      ObjectState   `json:"state"`
	Kind       ObjectKind    `json:"kind,omitempty"`
	Size       int64         `json:"size"`
	Attributes int32         `json:"attributes"`
	NodeID     int32         `json:"node_id"`
	OrderID    int64         `json:"order_id"`
	Ranges     []ObjectRange `json:"ranges,omitempty"`
	PreparedBy int32         `json:"prepared_by"`
	PreparedAt time.Time     `json:"prepared_at"`
	ExpiresAt  time.Time     `json:"expires_at"`
}

// Snapshot copies the state.
func (s *State) Snapshot() Snapshot {
	snap := Snapshot{
		ClusterID:    s.clusterID,
		NextObjectID: s.nextObjectID,
		Nodes:        []NodeView{},
		Streams:      []StreamView{},
		Objects:      []ObjectView{},
		Registered:   s.GetNodes(nil),
	}
	for _, id := range slices.Sorted(maps.Keys(s.nodes)) {
		n := s.nodes[id]
		snap.Nodes = append(snap.Nodes, NodeView{
			NodeID:         id,
			NodeEpoch:      n.epoch,
			FailoverMode:   n.failover,
			OpeningStreams: len(s.openingStreams(id)),
		})
	}
	for _, id := range slices.Sorted(maps.Keys(s.streams)) {
		snap.Streams = append(snap.Streams, s.streamView(id))
	}
	for _, id := range slices.Sorted(maps.Keys(s.objects)) {
		o := s.objects[id]
		key, _ := object.Key(s.clusterID, id) // ids are never negative; the cluster id is checked by NewState
		snap.Objects = append(snap.Objects, ObjectView{
			ObjectID:   id,
			Key:        key,
			State:      o.state,
			Kind:       o.kind,
			Size:       o.size,
			Attributes: o.attributes,
			NodeID:     o.node,
			OrderID:    o.orderID,
			Ranges:     slices.Clone(o.ranges),
			PreparedBy: o.preparedBy,
			PreparedAt: o.preparedAt,
			ExpiresAt:  o.deadline,
		})
	}
	return snap
}

// streamView copies one stream.
func (s *State) streamView(id int64) StreamView {
	st := s.streams[id]
	v := StreamView{
		StreamID:    id,
		Epoch:       st.epoch,
		State:       st.state,
		Owner:       st.owner(),
		StartOffset: st.start,
		EndOffset:   st.end,
		RangeIndex:  st.rangeIndex,
		Ranges:      []RangeView{},
	}
	for _, idx := range slices.Sorted(maps.Keys(st.ranges)) {
		r := st.ranges[idx]
		end := r.end
		if idx == st.rangeIndex {
			end = max(st.end, r.start)
		}
		v.Ranges = append(v.Ranges, RangeView{Index: idx, NodeID: r.node, Epoch: r.epoch, StartOffset: r.start, EndOffset: end})
	}
	v.StreamObjects = slices.Sorted(maps.Keys(st.objects))
	v.Tags = slices.Clone(st.tags)
	return v
}
