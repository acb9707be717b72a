package devcontroller

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"walden/automq/object"
)

// Sentinel errors of the state machine's configuration.
var (
	// ErrStreamExists: a stream id was configured twice.
	ErrStreamExists = errors.New("stream already exists")
	// ErrInvalidStream: a configured stream id is negative.
	ErrInvalidStream = errors.New("invalid stream id")
	// ErrInvalidClusterID: the cluster id is empty or holds '/', so it
	// cannot name the objects' key namespace.
	ErrInvalidClusterID = errors.New("invalid cluster id")
	// ErrInvalidNode: a node registration names a negative node id or an
	// unknown node state.
	ErrInvalidNode = errors.New("invalid node registration")
)

// StreamState is a stream's state as AutoMQ's StreamState enum names it.
type StreamState string

// The two stream states.
const (
	StreamClosed StreamState = "CLOSED"
	StreamOpened StreamState = "OPENED"
)

// ObjectState is an S3 object's state at the controller (S3ObjectState).
type ObjectState string

// The object states the development controller uses.
const (
	ObjectPrepared      ObjectState = "PREPARED"
	ObjectCommitted     ObjectState = "COMMITTED"
	ObjectMarkDestroyed ObjectState = "MARK_DESTROYED"
)

// ObjectKind says how a committed object was committed: as a node's
// stream-set object or as one stream's stream object.
type ObjectKind string

// The kinds of committed objects.
const (
	KindStreamSet ObjectKind = "stream_set"
	KindStream    ObjectKind = "stream"
)

// NodeState is a node's state as AutomqGetNodes reports it (AutoMQ's
// NodeState enum).
type NodeState string

// The node states.
const (
	NodeActive             NodeState = "ACTIVE"
	NodeFencedState        NodeState = "FENCED"
	NodeControlledShutdown NodeState = "CONTROLLED_SHUTDOWN"
	NodeUnknown            NodeState = "UNKNOWN"
)

// Valid reports whether s is one of the four node states.
func (s NodeState) Valid() bool {
	switch s {
	case NodeActive, NodeFencedState, NodeControlledShutdown, NodeUnknown:
		return true
	}
	return false
}

// noopObjectID is AutoMQ's NOOP_OBJECT_ID: a commit without a stream-set
// object (only stream objects) names it.
const noopObjectID int64 = -1

// initEpoch and initRangeIndex are what CreateStreams leaves in a new stream
// (S3StreamConstant.INIT_EPOCH, INIT_RANGE_INDEX).
const (
	initEpoch      int64 = -1
	initRangeIndex int32 = -1
)

// Tag is a key/value pair of a node registration.
type Tag struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// node is what StreamControlManager keeps per node (NodeWALMetadataRecord):
// the node epoch its requests are checked against and the failover flag.
type node struct {
	epoch    int64
	failover bool
}

// registration is what NodeControlManager keeps per node for
// AutomqGetNodes (AutomqRegisterNode's NodeMetadata), with the state that
// AutoMQ derives from broker heartbeats.
type registration struct {
	epoch     int64
	walConfig string
	state     NodeState
	tags      []Tag
}

// rangeMeta is one range of a stream (RangeMetadata): the offsets one owner
// wrote under one stream epoch. The current range's end is the stream's end
// offset; earlier ranges keep the end they had when the next one opened.
type rangeMeta struct {
	node  int32
	epoch int64
	start int64
	end   int64
}

// stream is a stream's metadata (StreamRuntimeMetadata).
type stream struct {
	epoch      int64
	rangeIndex int32
	state      StreamState
	start      int64
	end        int64
	ranges     map[int32]rangeMeta
	objects    map[int64]offsets // stream objects: id → offsets
	tags       []Tag             // from the first open that carried any (OpenStreams v1)
}

// offsets is a half-open offset range [Start, End).
type offsets struct{ start, end int64 }

// s3Object is an S3 object at the controller (S3Object, with the stream-set or
// stream object record that committed it).
type s3Object struct {
	state      ObjectState
	deadline   time.Time // prepared: it expires once now is after this
	preparedAt time.Time
	preparedBy int32
	size       int64
	attributes int32
	kind       ObjectKind // set at commit
	node       int32      // the committing node (stream-set objects)
	orderID    int64
	stream     int64 // the stream (stream objects)
	ranges     []ObjectRange
	dataTime   time.Time
	inNodeSet  bool // a stream-set object still in its node's set (not compacted away)
}

// ObjectRange is one stream's offsets inside a committed object.
type ObjectRange struct {
	StreamID    int64 `json:"stream_id"`
	StartOffset int64 `json:"start_offset"`
	EndOffset   int64 `json:"end_offset"`
}

// State is the stream metadata of one AutoMQ 1.4.1 controller quorum: nodes,
// streams with their ranges, and S3 objects. Every method applies one
// request as StreamControlManager and S3ObjectControlManager would: it checks
// everything first and changes nothing when it refuses. Time is passed in;
// State never reads a clock. It is not safe for concurrent use: the caller
// serializes requests as the active controller's event loop does.
type State struct {
	clusterID    string
	nodes        map[int32]*node
	registry     map[int32]*registration
	streams      map[int64]*stream
	objects      map[int64]*s3Object
	nextObjectID int64
}

// NewState returns the metadata of a quorum whose streams were created with
// the given ids and never opened: CLOSED, epoch −1, no range, offsets 0, as
// AutoMQ's CreateStreams leaves them. clusterID names the object keys'
// namespace in snapshots.
func NewState(clusterID string, streamIDs []int64) (*State, error) {
	if _, err := object.Key(clusterID, 0); err != nil {
		return nil, fmt.Errorf("devcontroller: cluster id %q cannot name an object namespace: %w", clusterID, ErrInvalidClusterID)
	}
	s := &State{
		clusterID: clusterID,
		nodes:     make(map[int32]*node),
		registry:  make(map[int32]*registration),
		streams:   make(map[int64]*stream),
		objects:   make(map[int64]*s3Object),
	}
	for _, id := range streamIDs {
		if err := s.CreateStream(id); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// CreateStream adds a stream as AutoMQ's CreateStreams leaves it. The
// development controller does not serve CreateStreams (its ids are chosen by
// the controller there); streams come from configuration.
func (s *State) CreateStream(id int64) error {
	if id < 0 {
		return fmt.Errorf("devcontroller: stream %d: %w", id, ErrInvalidStream)
	}
	if _, ok := s.streams[id]; ok {
		return fmt.Errorf("devcontroller: stream %d: %w", id, ErrStreamExists)
	}
	s.streams[id] = &stream{
		epoch:      initEpoch,
		rangeIndex: initRangeIndex,
		state:      StreamClosed,
		ranges:     make(map[int32]rangeMeta),
		objects:    make(map[int64]offsets),
	}
	return nil
}

// NodeRegistration is a node as AutomqGetNodes reports it.
type NodeRegistration struct {
	NodeID    int32     `json:"node_id"`
	NodeEpoch int64     `json:"node_epoch"`
	WALConfig string    `json:"wal_config"`
	State     NodeState `json:"state"`
	Tags      []Tag     `json:"tags,omitempty"`
}

// RegisterNode records a node for AutomqGetNodes as AutomqRegisterNode does
// (NodeControlManager.register): an epoch lower than the registered one gets
// NODE_EPOCH_EXPIRED. Open-source AutoMQ 1.4.1 brokers never send
// AutomqRegisterNode, so a real 1.4.1 controller lists no node; the
// development controller registers the nodes its configuration names. An
// empty State means ACTIVE, the state AutoMQ derives from heartbeats.
func (s *State) RegisterNode(r NodeRegistration) (Code, error) {
	if r.NodeID < 0 {
		return InvalidRequest, fmt.Errorf("devcontroller: node %d: %w", r.NodeID, ErrInvalidNode)
	}
	if r.State == "" {
		r.State = NodeActive
	}
	if !r.State.Valid() {
		return InvalidRequest, fmt.Errorf("devcontroller: node %d state %q: %w", r.NodeID, r.State, ErrInvalidNode)
	}
	if old, ok := s.registry[r.NodeID]; ok && old.epoch > r.NodeEpoch {
		return NodeEpochExpired, nil
	}
	s.registry[r.NodeID] = &registration{
		epoch:     r.NodeEpoch,
		walConfig: r.WALConfig,
		state:     r.State,
		tags:      slices.Clone(r.Tags),
	}
	return None, nil
}

// SetNodeState changes a registered node's state (what heartbeats do in
// AutoMQ). It reports whether the node is registered.
func (s *State) SetNodeState(nodeID int32, state NodeState) (bool, error) {
	if !state.Valid() {
		return false, fmt.Errorf("devcontroller: node %d state %q: %w", nodeID, state, ErrInvalidNode)
	}
	r, ok := s.registry[nodeID]
	if !ok {
		return false, nil
	}
	r.state = state
	return true, nil
}

// nodeEpochCheck is StreamControlManager.nodeEpochCheck: an unknown node
// gets NODE_EPOCH_NOT_EXIST, an epoch below the node's NODE_EPOCH_EXPIRED,
// and with checkFailover a node whose failover flag is set NODE_FENCED.
func (s *State) nodeEpochCheck(nodeID int32, nodeEpoch int64, checkFailover bool) Code {
	n, ok := s.nodes[nodeID]
	if !ok {
		return NodeEpochNotExist
	}
	if n.epoch > nodeEpoch {
		return NodeEpochExpired
	}
	if checkFailover && n.failover {
		return NodeFenced
	}
	return None
}

// currentRange returns the stream's current range, if it has one.
func (st *stream) currentRange() (rangeMeta, bool) {
	r, ok := st.ranges[st.rangeIndex]
	return r, ok
}

// owner returns the node of the stream's current range, −1 without one.
func (st *stream) owner() int32 {
	if r, ok := st.currentRange(); ok {
		return r.node
	}
	return -1
}

// advanceEnd moves the stream's end offset forward, never back (AutoMQ's
// StreamRuntimeMetadata.endOffset keeps the larger).
func (st *stream) advanceEnd(end int64) {
	if end > st.end {
		st.end = end
	}
}
