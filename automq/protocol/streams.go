package protocol

import "github.com/twmb/franz-go/pkg/kmsg"

// OpenStreamsRequest (key 502, v0–1) opens streams for a node: each stream
// at the epoch given, which must be the stream's next epoch (or its current
// one, a retried open by the same node). v1 adds the streams' Tags.
type OpenStreamsRequest struct {
	// Version is the message version, 0 or 1.
	Version            int16               `json:"-"`
	NodeID             int32               `json:"nodeId"`
	NodeEpoch          int64               `json:"nodeEpoch"`
	OpenStreamRequests []OpenStreamRequest `json:"openStreamRequests"`
	UnknownTags        kmsg.Tags           `json:"-"`
}

// OpenStreamRequest is one stream of an OpenStreamsRequest.
type OpenStreamRequest struct {
	StreamID    int64 `json:"streamId"`
	StreamEpoch int64 `json:"streamEpoch"`
	// Tags (v1+) label the stream, e.g. its topic and partition.
	Tags        []Tag     `json:"tags,omitempty"`
	UnknownTags kmsg.Tags `json:"-"`
}

// OpenStreamsResponse answers an OpenStreamsRequest, one result per
// stream in the request's order.
type OpenStreamsResponse struct {
	Version             int16                `json:"-"`
	ErrorCode           int16                `json:"errorCode"`
	ThrottleMillis      int32                `json:"throttleTimeMs"`
	OpenStreamResponses []OpenStreamResponse `json:"openStreamResponses"`
	UnknownTags         kmsg.Tags            `json:"-"`
}

// OpenStreamResponse is one stream's result: its error code, and on
// success the offsets it opened at.
type OpenStreamResponse struct {
	ErrorCode   int16     `json:"errorCode"`
	StartOffset int64     `json:"startOffset"`
	NextOffset  int64     `json:"nextOffset"`
	UnknownTags kmsg.Tags `json:"-"`
}

func (*OpenStreamsRequest) Key() int16           { return KeyOpenStreams }
func (*OpenStreamsRequest) MaxVersion() int16    { return 1 }
func (m *OpenStreamsRequest) SetVersion(v int16) { m.Version = v }
func (m *OpenStreamsRequest) GetVersion() int16  { return m.Version }
func (*OpenStreamsRequest) IsFlexible() bool     { return true }

// ResponseKind returns an empty response of the request's version.
func (m *OpenStreamsRequest) ResponseKind() kmsg.Response {
	return &OpenStreamsResponse{Version: m.Version}
}

// Validate refuses Tags at v0 and strings the wire cannot carry.
func (m *OpenStreamsRequest) Validate() error {
	c := newChecker("OpenStreamsRequest", m.Version, 0, 1)
	c.array("openStreamRequests", len(m.OpenStreamRequests))
	for i := range m.OpenStreamRequests {
		s := &m.OpenStreamRequests[i]
		c.enter("openStreamRequests", i)
		c.absent("tags", 1, len(s.Tags) == 0, s.Tags)
		checkTags(c, "tags", s.Tags)
		c.leave()
	}
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *OpenStreamsRequest) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt32(dst, m.NodeID)
	dst = appendInt64(dst, m.NodeEpoch)
	dst = appendArray(dst, m.OpenStreamRequests, func(dst []byte, s *OpenStreamRequest) []byte {
		dst = appendInt64(dst, s.StreamID)
		dst = appendInt64(dst, s.StreamEpoch)
		if m.Version >= 1 {
			dst = appendArray(dst, s.Tags, appendTag)
		}
		return appendTags(dst, &s.UnknownTags)
	})
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *OpenStreamsRequest) ReadFrom(src []byte) error {
	r := newReader("OpenStreamsRequest", m.Version, 0, 1, src)
	n := OpenStreamsRequest{Version: m.Version}
	n.NodeID = r.int32("nodeId")
	n.NodeEpoch = r.int64("nodeEpoch")
	minSize := 17 // two int64 and the tagged-field byte
	if m.Version >= 1 {
		minSize++
	}
	n.OpenStreamRequests = readArray(r, "openStreamRequests", minSize, func(r *reader, s *OpenStreamRequest) {
		s.StreamID = r.int64("streamId")
		s.StreamEpoch = r.int64("streamEpoch")
		if m.Version >= 1 {
			s.Tags = readArray(r, "tags", tagMinSize, readTag)
		}
		r.tags(&s.UnknownTags)
	})
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

func (*OpenStreamsResponse) Key() int16           { return KeyOpenStreams }
func (*OpenStreamsResponse) MaxVersion() int16    { return 1 }
func (m *OpenStreamsResponse) SetVersion(v int16) { m.Version = v }
func (m *OpenStreamsResponse) GetVersion() int16  { return m.Version }
func (*OpenStreamsResponse) IsFlexible() bool     { return true }

// Throttle returns the controller's throttle, applied after the response.
func (m *OpenStreamsResponse) Throttle() (int32, bool) { return m.ThrottleMillis, true }

// SetThrottle sets the throttle.
func (m *OpenStreamsResponse) SetThrottle(ms int32) { m.ThrottleMillis = ms }

// RequestKind returns an empty request of the response's version.
func (m *OpenStreamsResponse) RequestKind() kmsg.Request {
	return &OpenStreamsRequest{Version: m.Version}
}

// Validate checks the version.
func (m *OpenStreamsResponse) Validate() error {
	c := newChecker("OpenStreamsResponse", m.Version, 0, 1)
	c.array("openStreamResponses", len(m.OpenStreamResponses))
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *OpenStreamsResponse) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt16(dst, m.ErrorCode)
	dst = appendInt32(dst, m.ThrottleMillis)
	dst = appendArray(dst, m.OpenStreamResponses, func(dst []byte, s *OpenStreamResponse) []byte {
		dst = appendInt16(dst, s.ErrorCode)
		dst = appendInt64(dst, s.StartOffset)
		dst = appendInt64(dst, s.NextOffset)
		return appendTags(dst, &s.UnknownTags)
	})
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *OpenStreamsResponse) ReadFrom(src []byte) error {
	r := newReader("OpenStreamsResponse", m.Version, 0, 1, src)
	n := OpenStreamsResponse{Version: m.Version}
	n.ErrorCode = r.int16("errorCode")
	n.ThrottleMillis = r.int32("throttleTimeMs")
	n.OpenStreamResponses = readArray(r, "openStreamResponses", 19, func(r *reader, s *OpenStreamResponse) {
		s.ErrorCode = r.int16("errorCode")
		s.StartOffset = r.int64("startOffset")
		s.NextOffset = r.int64("nextOffset")
		r.tags(&s.UnknownTags)
	})
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

// CloseStreamsRequest (key 503, v0) closes streams of a node, each at the
// stream epoch it was opened with. Closing a closed stream succeeds.
type CloseStreamsRequest struct {
	Version             int16                `json:"-"`
	NodeID              int32                `json:"nodeId"`
	NodeEpoch           int64                `json:"nodeEpoch"`
	CloseStreamRequests []CloseStreamRequest `json:"closeStreamRequests"`
	UnknownTags         kmsg.Tags            `json:"-"`
}

// CloseStreamRequest is one stream of a CloseStreamsRequest.
type CloseStreamRequest struct {
	StreamID    int64     `json:"streamId"`
	StreamEpoch int64     `json:"streamEpoch"`
	UnknownTags kmsg.Tags `json:"-"`
}

// CloseStreamsResponse answers a CloseStreamsRequest, one result per
// stream in the request's order.
type CloseStreamsResponse struct {
	Version              int16                 `json:"-"`
	ErrorCode            int16                 `json:"errorCode"`
	ThrottleMillis       int32                 `json:"throttleTimeMs"`
	CloseStreamResponses []CloseStreamResponse `json:"closeStreamResponses"`
	UnknownTags          kmsg.Tags             `json:"-"`
}

// CloseStreamResponse is one stream's result.
type CloseStreamResponse struct {
	ErrorCode   int16     `json:"errorCode"`
	UnknownTags kmsg.Tags `json:"-"`
}

func (*CloseStreamsRequest) Key() int16           { return KeyCloseStreams }
func (*CloseStreamsRequest) MaxVersion() int16    { return 0 }
func (m *CloseStreamsRequest) SetVersion(v int16) { m.Version = v }
func (m *CloseStreamsRequest) GetVersion() int16  { return m.Version }
func (*CloseStreamsRequest) IsFlexible() bool     { return true }

// ResponseKind returns an empty response of the request's version.
func (m *CloseStreamsRequest) ResponseKind() kmsg.Response {
	return &CloseStreamsResponse{Version: m.Version}
}

// Validate checks the version.
func (m *CloseStreamsRequest) Validate() error {
	c := newChecker("CloseStreamsRequest", m.Version, 0, 0)
	c.array("closeStreamRequests", len(m.CloseStreamRequests))
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *CloseStreamsRequest) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt32(dst, m.NodeID)
	dst = appendInt64(dst, m.NodeEpoch)
	dst = appendArray(dst, m.CloseStreamRequests, func(dst []byte, s *CloseStreamRequest) []byte {
		dst = appendInt64(dst, s.StreamID)
		dst = appendInt64(dst, s.StreamEpoch)
		return appendTags(dst, &s.UnknownTags)
	})
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *CloseStreamsRequest) ReadFrom(src []byte) error {
	r := newReader("CloseStreamsRequest", m.Version, 0, 0, src)
	n := CloseStreamsRequest{Version: m.Version}
	n.NodeID = r.int32("nodeId")
	n.NodeEpoch = r.int64("nodeEpoch")
	n.CloseStreamRequests = readArray(r, "closeStreamRequests", 17, func(r *reader, s *CloseStreamRequest) {
		s.StreamID = r.int64("streamId")
		s.StreamEpoch = r.int64("streamEpoch")
		r.tags(&s.UnknownTags)
	})
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

func (*CloseStreamsResponse) Key() int16           { return KeyCloseStreams }
func (*CloseStreamsResponse) MaxVersion() int16    { return 0 }
func (m *CloseStreamsResponse) SetVersion(v int16) { m.Version = v }
func (m *CloseStreamsResponse) GetVersion() int16  { return m.Version }
func (*CloseStreamsResponse) IsFlexible() bool     { return true }

// Throttle returns the controller's throttle, applied after the response.
func (m *CloseStreamsResponse) Throttle() (int32, bool) { return m.ThrottleMillis, true }

// SetThrottle sets the throttle.
func (m *CloseStreamsResponse) SetThrottle(ms int32) { m.ThrottleMillis = ms }

// RequestKind returns an empty request of the response's version.
func (m *CloseStreamsResponse) RequestKind() kmsg.Request {
	return &CloseStreamsRequest{Version: m.Version}
}

// Validate checks the version.
func (m *CloseStreamsResponse) Validate() error {
	c := newChecker("CloseStreamsResponse", m.Version, 0, 0)
	c.array("closeStreamResponses", len(m.CloseStreamResponses))
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *CloseStreamsResponse) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt16(dst, m.ErrorCode)
	dst = appendInt32(dst, m.ThrottleMillis)
	dst = appendArray(dst, m.CloseStreamResponses, func(dst []byte, s *CloseStreamResponse) []byte {
		dst = appendInt16(dst, s.ErrorCode)
		return appendTags(dst, &s.UnknownTags)
	})
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *CloseStreamsResponse) ReadFrom(src []byte) error {
	r := newReader("CloseStreamsResponse", m.Version, 0, 0, src)
	n := CloseStreamsResponse{Version: m.Version}
	n.ErrorCode = r.int16("errorCode")
	n.ThrottleMillis = r.int32("throttleTimeMs")
	n.CloseStreamResponses = readArray(r, "closeStreamResponses", 3, func(r *reader, s *CloseStreamResponse) {
		s.ErrorCode = r.int16("errorCode")
		r.tags(&s.UnknownTags)
	})
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

// GetOpeningStreamsRequest (key 508, v0) asks for the streams a node holds
// open. It also registers the node's epoch at the controller, and with
// FailoverMode it fences the node: the controller then refuses the node's
// own opens and commits (NODE_FENCED) until it starts again.
type GetOpeningStreamsRequest struct {
	Version      int16     `json:"-"`
	NodeID       int32     `json:"nodeId"`
	NodeEpoch    int64     `json:"nodeEpoch"`
	FailoverMode bool      `json:"failoverMode"`
	UnknownTags  kmsg.Tags `json:"-"`
}

// GetOpeningStreamsResponse lists the node's open streams.
type GetOpeningStreamsResponse struct {
	Version            int16            `json:"-"`
	ErrorCode          int16            `json:"errorCode"`
	ThrottleMillis     int32            `json:"throttleTimeMs"`
	StreamMetadataList []StreamMetadata `json:"streamMetadataList"`
	UnknownTags        kmsg.Tags        `json:"-"`
}

// StreamMetadata is one open stream: its id, epoch and offsets at the
// controller (EndOffset is where the next commit must start).
type StreamMetadata struct {
	StreamID    int64     `json:"streamId"`
	Epoch       int64     `json:"epoch"`
	StartOffset int64     `json:"startOffset"`
	EndOffset   int64     `json:"endOffset"`
	UnknownTags kmsg.Tags `json:"-"`
}

func (*GetOpeningStreamsRequest) Key() int16           { return KeyGetOpeningStreams }
func (*GetOpeningStreamsRequest) MaxVersion() int16    { return 0 }
func (m *GetOpeningStreamsRequest) SetVersion(v int16) { m.Version = v }
func (m *GetOpeningStreamsRequest) GetVersion() int16  { return m.Version }
func (*GetOpeningStreamsRequest) IsFlexible() bool     { return true }

// ResponseKind returns an empty response of the request's version.
func (m *GetOpeningStreamsRequest) ResponseKind() kmsg.Response {
	return &GetOpeningStreamsResponse{Version: m.Version}
}

// Validate checks the version.
func (m *GetOpeningStreamsRequest) Validate() error {
	return newChecker("GetOpeningStreamsRequest", m.Version, 0, 0).err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *GetOpeningStreamsRequest) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt32(dst, m.NodeID)
	dst = appendInt64(dst, m.NodeEpoch)
	dst = appendBool(dst, m.FailoverMode)
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *GetOpeningStreamsRequest) ReadFrom(src []byte) error {
	r := newReader("GetOpeningStreamsRequest", m.Version, 0, 0, src)
	n := GetOpeningStreamsRequest{Version: m.Version}
	n.NodeID = r.int32("nodeId")
	n.NodeEpoch = r.int64("nodeEpoch")
	n.FailoverMode = r.bool("failoverMode")
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

func (*GetOpeningStreamsResponse) Key() int16           { return KeyGetOpeningStreams }
func (*GetOpeningStreamsResponse) MaxVersion() int16    { return 0 }
func (m *GetOpeningStreamsResponse) SetVersion(v int16) { m.Version = v }
func (m *GetOpeningStreamsResponse) GetVersion() int16  { return m.Version }
func (*GetOpeningStreamsResponse) IsFlexible() bool     { return true }

// Throttle returns the controller's throttle, applied after the response.
func (m *GetOpeningStreamsResponse) Throttle() (int32, bool) { return m.ThrottleMillis, true }

// SetThrottle sets the throttle.
func (m *GetOpeningStreamsResponse) SetThrottle(ms int32) { m.ThrottleMillis = ms }

// RequestKind returns an empty request of the response's version.
func (m *GetOpeningStreamsResponse) RequestKind() kmsg.Request {
	return &GetOpeningStreamsRequest{Version: m.Version}
}

// Validate checks the version.
func (m *GetOpeningStreamsResponse) Validate() error {
	c := newChecker("GetOpeningStreamsResponse", m.Version, 0, 0)
	c.array("streamMetadataList", len(m.StreamMetadataList))
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *GetOpeningStreamsResponse) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt16(dst, m.ErrorCode)
	dst = appendInt32(dst, m.ThrottleMillis)
	dst = appendArray(dst, m.StreamMetadataList, func(dst []byte, s *StreamMetadata) []byte {
		dst = appendInt64(dst, s.StreamID)
		dst = appendInt64(dst, s.Epoch)
		dst = appendInt64(dst, s.StartOffset)
		dst = appendInt64(dst, s.EndOffset)
		return appendTags(dst, &s.UnknownTags)
	})
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *GetOpeningStreamsResponse) ReadFrom(src []byte) error {
	r := newReader("GetOpeningStreamsResponse", m.Version, 0, 0, src)
	n := GetOpeningStreamsResponse{Version: m.Version}
	n.ErrorCode = r.int16("errorCode")
	n.ThrottleMillis = r.int32("throttleTimeMs")
	n.StreamMetadataList = readArray(r, "streamMetadataList", 33, func(r *reader, s *StreamMetadata) {
		s.StreamID = r.int64("streamId")
		s.Epoch = r.int64("epoch")
		s.StartOffset = r.int64("startOffset")
		s.EndOffset = r.int64("endOffset")
		r.tags(&s.UnknownTags)
	})
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}
