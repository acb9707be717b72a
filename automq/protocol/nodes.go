package protocol

import "github.com/twmb/franz-go/pkg/kmsg"

// AutomqGetNodesRequest (key 514, v0) asks for what the controller knows
// of some nodes. Nodes it does not know are left out of the answer.
type AutomqGetNodesRequest struct {
	Version     int16     `json:"-"`
	NodeIDs     []int32   `json:"nodeIds"`
	UnknownTags kmsg.Tags `json:"-"`
}

// AutomqGetNodesResponse lists the nodes the controller knows among those
// asked for.
type AutomqGetNodesResponse struct {
	Version        int16          `json:"-"`
	ErrorCode      int16          `json:"errorCode"`
	ThrottleMillis int32          `json:"throttleTimeMs"`
	Nodes          []NodeMetadata `json:"nodes"`
	UnknownTags    kmsg.Tags      `json:"-"`
}

// NodeMetadata is one node as the controller knows it: its epoch (the
// epoch of its last registration, -1 when none), its WAL configuration,
// its state (e.g. ACTIVE, FENCED) and whether it holds streams open.
type NodeMetadata struct {
	NodeID            int32     `json:"nodeId"`
	NodeEpoch         int64     `json:"nodeEpoch"`
	WALConfig         string    `json:"walConfig"`
	State             string    `json:"state"`
	HasOpeningStreams bool      `json:"hasOpeningStreams"`
	Tags              []Tag     `json:"tags"`
	UnknownTags       kmsg.Tags `json:"-"`
}

func (*AutomqGetNodesRequest) Key() int16           { return KeyAutomqGetNodes }
func (*AutomqGetNodesRequest) MaxVersion() int16    { return 0 }
func (m *AutomqGetNodesRequest) SetVersion(v int16) { m.Version = v }
func (m *AutomqGetNodesRequest) GetVersion() int16  { return m.Version }
func (*AutomqGetNodesRequest) IsFlexible() bool     { return true }

// ResponseKind returns an empty response of the request's version.
func (m *AutomqGetNodesRequest) ResponseKind() kmsg.Response {
	return &AutomqGetNodesResponse{Version: m.Version}
}

// Validate checks the version.
func (m *AutomqGetNodesRequest) Validate() error {
	c := newChecker("AutomqGetNodesRequest", m.Version, 0, 0)
	c.array("nodeIds", len(m.NodeIDs))
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *AutomqGetNodesRequest) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendArray(dst, m.NodeIDs, func(dst []byte, id *int32) []byte { return appendInt32(dst, *id) })
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *AutomqGetNodesRequest) ReadFrom(src []byte) error {
	r := newReader("AutomqGetNodesRequest", m.Version, 0, 0, src)
	n := AutomqGetNodesRequest{Version: m.Version}
	n.NodeIDs = readArray(r, "nodeIds", 4, func(r *reader, id *int32) { *id = r.int32("") })
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

func (*AutomqGetNodesResponse) Key() int16           { return KeyAutomqGetNodes }
func (*AutomqGetNodesResponse) MaxVersion() int16    { return 0 }
func (m *AutomqGetNodesResponse) SetVersion(v int16) { m.Version = v }
func (m *AutomqGetNodesResponse) GetVersion() int16  { return m.Version }
func (*AutomqGetNodesResponse) IsFlexible() bool     { return true }

// Throttle returns the controller's throttle, applied after the response.
func (m *AutomqGetNodesResponse) Throttle() (int32, bool) { return m.ThrottleMillis, true }

// SetThrottle sets the throttle.
func (m *AutomqGetNodesResponse) SetThrottle(ms int32) { m.ThrottleMillis = ms }

// RequestKind returns an empty request of the response's version.
func (m *AutomqGetNodesResponse) RequestKind() kmsg.Request {
	return &AutomqGetNodesRequest{Version: m.Version}
}

// Validate refuses strings the wire cannot carry.
func (m *AutomqGetNodesResponse) Validate() error {
	c := newChecker("AutomqGetNodesResponse", m.Version, 0, 0)
	c.array("nodes", len(m.Nodes))
	for i := range m.Nodes {
		n := &m.Nodes[i]
		c.enter("nodes", i)
		c.string("walConfig", n.WALConfig)
		c.string("state", n.State)
		checkTags(c, "tags", n.Tags)
		c.leave()
	}
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *AutomqGetNodesResponse) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt16(dst, m.ErrorCode)
	dst = appendInt32(dst, m.ThrottleMillis)
	dst = appendArray(dst, m.Nodes, func(dst []byte, n *NodeMetadata) []byte {
		dst = appendInt32(dst, n.NodeID)
		dst = appendInt64(dst, n.NodeEpoch)
		dst = appendCompactString(dst, n.WALConfig)
		dst = appendCompactString(dst, n.State)
		dst = appendBool(dst, n.HasOpeningStreams)
		dst = appendArray(dst, n.Tags, appendTag)
		return appendTags(dst, &n.UnknownTags)
	})
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *AutomqGetNodesResponse) ReadFrom(src []byte) error {
	r := newReader("AutomqGetNodesResponse", m.Version, 0, 0, src)
	n := AutomqGetNodesResponse{Version: m.Version}
	n.ErrorCode = r.int16("errorCode")
	n.ThrottleMillis = r.int32("throttleTimeMs")
	// int32, int64, two strings, a bool, an array and the tagged fields.
	n.Nodes = readArray(r, "nodes", 4+8+1+1+1+1+1, func(r *reader, nd *NodeMetadata) {
		nd.NodeID = r.int32("nodeId")
		nd.NodeEpoch = r.int64("nodeEpoch")
		nd.WALConfig = r.string("walConfig")
		nd.State = r.string("state")
		nd.HasOpeningStreams = r.bool("hasOpeningStreams")
		nd.Tags = readArray(r, "tags", tagMinSize, readTag)
		r.tags(&nd.UnknownTags)
	})
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}
