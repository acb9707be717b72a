package protocol

import "github.com/twmb/franz-go/pkg/kmsg"

// PrepareS3ObjectRequest (key 505, v0) reserves PreparedCount consecutive
// object ids for a node. An id that is not committed within the time to
// live expires (and the controller deletes any object written under it).
type PrepareS3ObjectRequest struct {
	Version          int16     `json:"-"`
	NodeID           int32     `json:"nodeId"`
	PreparedCount    int32     `json:"preparedCount"`
	TimeToLiveMillis int64     `json:"timeToLiveInMs"`
	UnknownTags      kmsg.Tags `json:"-"`
}

// PrepareS3ObjectResponse gives the first of the prepared ids; the others
// follow it.
type PrepareS3ObjectResponse struct {
	Version         int16     `json:"-"`
	ErrorCode       int16     `json:"errorCode"`
	ThrottleMillis  int32     `json:"throttleTimeMs"`
	FirstS3ObjectID int64     `json:"firstS3ObjectId"`
	UnknownTags     kmsg.Tags `json:"-"`
}

func (*PrepareS3ObjectRequest) Key() int16           { return KeyPrepareS3Object }
func (*PrepareS3ObjectRequest) MaxVersion() int16    { return 0 }
func (m *PrepareS3ObjectRequest) SetVersion(v int16) { m.Version = v }
func (m *PrepareS3ObjectRequest) GetVersion() int16  { return m.Version }
func (*PrepareS3ObjectRequest) IsFlexible() bool     { return true }

// ResponseKind returns an empty response of the request's version.
func (m *PrepareS3ObjectRequest) ResponseKind() kmsg.Response {
	return &PrepareS3ObjectResponse{Version: m.Version}
}

// Validate checks the version.
func (m *PrepareS3ObjectRequest) Validate() error {
	return newChecker("PrepareS3ObjectRequest", m.Version, 0, 0).err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *PrepareS3ObjectRequest) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt32(dst, m.NodeID)
	dst = appendInt32(dst, m.PreparedCount)
	dst = appendInt64(dst, m.TimeToLiveMillis)
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *PrepareS3ObjectRequest) ReadFrom(src []byte) error {
	r := newReader("PrepareS3ObjectRequest", m.Version, 0, 0, src)
	n := PrepareS3ObjectRequest{Version: m.Version}
	n.NodeID = r.int32("nodeId")
	n.PreparedCount = r.int32("preparedCount")
	n.TimeToLiveMillis = r.int64("timeToLiveInMs")
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

func (*PrepareS3ObjectResponse) Key() int16           { return KeyPrepareS3Object }
func (*PrepareS3ObjectResponse) MaxVersion() int16    { return 0 }
func (m *PrepareS3ObjectResponse) SetVersion(v int16) { m.Version = v }
func (m *PrepareS3ObjectResponse) GetVersion() int16  { return m.Version }
func (*PrepareS3ObjectResponse) IsFlexible() bool     { return true }

// Throttle returns the controller's throttle, applied after the response.
func (m *PrepareS3ObjectResponse) Throttle() (int32, bool) { return m.ThrottleMillis, true }

// SetThrottle sets the throttle.
func (m *PrepareS3ObjectResponse) SetThrottle(ms int32) { m.ThrottleMillis = ms }

// RequestKind returns an empty request of the response's version.
func (m *PrepareS3ObjectResponse) RequestKind() kmsg.Request {
	return &PrepareS3ObjectRequest{Version: m.Version}
}

// Validate checks the version.
func (m *PrepareS3ObjectResponse) Validate() error {
	return newChecker("PrepareS3ObjectResponse", m.Version, 0, 0).err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *PrepareS3ObjectResponse) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt16(dst, m.ErrorCode)
	dst = appendInt32(dst, m.ThrottleMillis)
	dst = appendInt64(dst, m.FirstS3ObjectID)
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *PrepareS3ObjectResponse) ReadFrom(src []byte) error {
	r := newReader("PrepareS3ObjectResponse", m.Version, 0, 0, src)
	n := PrepareS3ObjectResponse{Version: m.Version}
	n.ErrorCode = r.int16("errorCode")
	n.ThrottleMillis = r.int32("throttleTimeMs")
	n.FirstS3ObjectID = r.int64("firstS3ObjectId")
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

// CommitStreamSetObjectRequest (key 506, v0–1) commits a stream-set object
// (ObjectID, or -1 for none) and stream objects of a node, advancing each
// stream's end offset: every range must start at the stream's end offset at
// the controller. With FailoverMode the node's fence is not checked (the
// failover commits for a fenced node). v1 adds the objects' Attributes.
type CommitStreamSetObjectRequest struct {
	Version            int16               `json:"-"`
	NodeID             int32               `json:"nodeId"`
	NodeEpoch          int64               `json:"nodeEpoch"`
	ObjectID           int64               `json:"objectId"`
	OrderID            int64               `json:"orderId"`
	ObjectSize         int64               `json:"objectSize"`
	ObjectStreamRanges []ObjectStreamRange `json:"objectStreamRanges"`
	StreamObjects      []StreamObject      `json:"streamObjects"`
	CompactedObjectIDs []int64             `json:"compactedObjectIds"`
	FailoverMode       bool                `json:"failoverMode"`
	// Attributes (v1+) of the stream-set object: object type, bucket
	// index, deep-delete mark.
	Attributes  int32     `json:"attributes,omitempty"`
	UnknownTags kmsg.Tags `json:"-"`
}

// ObjectStreamRange is one stream's records in a stream-set object:
// [StartOffset, EndOffset).
type ObjectStreamRange struct {
	StreamID    int64     `json:"streamId"`
	StreamEpoch int64     `json:"streamEpoch"`
	StartOffset int64     `json:"startOffset"`
	EndOffset   int64     `json:"endOffset"`
	UnknownTags kmsg.Tags `json:"-"`
}

// StreamObject is an object holding one stream's records [StartOffset,
// EndOffset).
type StreamObject struct {
	ObjectID    int64 `json:"objectId"`
	ObjectSize  int64 `json:"objectSize"`
	StreamID    int64 `json:"streamId"`
	StartOffset int64 `json:"startOffset"`
	EndOffset   int64 `json:"endOffset"`
	// Attributes (v1+) of the object.
	Attributes  int32     `json:"attributes,omitempty"`
	UnknownTags kmsg.Tags `json:"-"`
}

// CommitStreamSetObjectResponse answers a commit; v1 adds Attributes.
type CommitStreamSetObjectResponse struct {
	Version        int16     `json:"-"`
	ErrorCode      int16     `json:"errorCode"`
	ThrottleMillis int32     `json:"throttleTimeMs"`
	Attributes     int32     `json:"attributes,omitempty"`
	UnknownTags    kmsg.Tags `json:"-"`
}

func (*CommitStreamSetObjectRequest) Key() int16           { return KeyCommitStreamSetObject }
func (*CommitStreamSetObjectRequest) MaxVersion() int16    { return 1 }
func (m *CommitStreamSetObjectRequest) SetVersion(v int16) { m.Version = v }
func (m *CommitStreamSetObjectRequest) GetVersion() int16  { return m.Version }
func (*CommitStreamSetObjectRequest) IsFlexible() bool     { return true }

// ResponseKind returns an empty response of the request's version.
func (m *CommitStreamSetObjectRequest) ResponseKind() kmsg.Response {
	return &CommitStreamSetObjectResponse{Version: m.Version}
}

// Validate refuses Attributes other than 0 at v0, in the request or in any
// stream object.
func (m *CommitStreamSetObjectRequest) Validate() error {
	c := newChecker("CommitStreamSetObjectRequest", m.Version, 0, 1)
	c.array("objectStreamRanges", len(m.ObjectStreamRanges))
	c.array("streamObjects", len(m.StreamObjects))
	c.array("compactedObjectIds", len(m.CompactedObjectIDs))
	for i := range m.StreamObjects {
		c.enter("streamObjects", i)
		c.absent("attributes", 1, m.StreamObjects[i].Attributes == 0, m.StreamObjects[i].Attributes)
		c.leave()
	}
	c.absent("attributes", 1, m.Attributes == 0, m.Attributes)
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *CommitStreamSetObjectRequest) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt32(dst, m.NodeID)
	dst = appendInt64(dst, m.NodeEpoch)
	dst = appendInt64(dst, m.ObjectID)
	dst = appendInt64(dst, m.OrderID)
	dst = appendInt64(dst, m.ObjectSize)
	dst = appendArray(dst, m.ObjectStreamRanges, func(dst []byte, s *ObjectStreamRange) []byte {
		dst = appendInt64(dst, s.StreamID)
		dst = appendInt64(dst, s.StreamEpoch)
		dst = appendInt64(dst, s.StartOffset)
		dst = appendInt64(dst, s.EndOffset)
		return appendTags(dst, &s.UnknownTags)
	})
	dst = appendArray(dst, m.StreamObjects, func(dst []byte, s *StreamObject) []byte {
		dst = appendInt64(dst, s.ObjectID)
		dst = appendInt64(dst, s.ObjectSize)
		dst = appendInt64(dst, s.StreamID)
		dst = appendInt64(dst, s.StartOffset)
		dst = appendInt64(dst, s.EndOffset)
		if m.Version >= 1 {
			dst = appendInt32(dst, s.Attributes)
		}
		return appendTags(dst, &s.UnknownTags)
	})
	dst = appendArray(dst, m.CompactedObjectIDs, func(dst []byte, id *int64) []byte { return appendInt64(dst, *id) })
	dst = appendBool(dst, m.FailoverMode)
	if m.Version >= 1 {
		dst = appendInt32(dst, m.Attributes)
	}
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *CommitStreamSetObjectRequest) ReadFrom(src []byte) error {
	r := newReader("CommitStreamSetObjectRequest", m.Version, 0, 1, src)
	n := CommitStreamSetObjectRequest{Version: m.Version}
	n.NodeID = r.int32("nodeId")
	n.NodeEpoch = r.int64("nodeEpoch")
	n.ObjectID = r.int64("objectId")
	n.OrderID = r.int64("orderId")
	n.ObjectSize = r.int64("objectSize")
	n.ObjectStreamRanges = readArray(r, "objectStreamRanges", 33, func(r *reader, s *ObjectStreamRange) {
		s.StreamID = r.int64("streamId")
		s.StreamEpoch = r.int64("streamEpoch")
		s.StartOffset = r.int64("startOffset")
		s.EndOffset = r.int64("endOffset")
		r.tags(&s.UnknownTags)
	})
	objectSize := 41 // five int64 and the tagged-field byte
	if m.Version >= 1 {
		objectSize += 4
	}
	n.StreamObjects = readArray(r, "streamObjects", objectSize, func(r *reader, s *StreamObject) {
		s.ObjectID = r.int64("objectId")
		s.ObjectSize = r.int64("objectSize")
		s.StreamID = r.int64("streamId")
		s.StartOffset = r.int64("startOffset")
		s.EndOffset = r.int64("endOffset")
		if m.Version >= 1 {
			s.Attributes = r.int32("attributes")
		}
		r.tags(&s.UnknownTags)
	})
	n.CompactedObjectIDs = readArray(r, "compactedObjectIds", 8, func(r *reader, id *int64) { *id = r.int64("") })
	n.FailoverMode = r.bool("failoverMode")
	if m.Version >= 1 {
		n.Attributes = r.int32("attributes")
	}
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}

func (*CommitStreamSetObjectResponse) Key() int16           { return KeyCommitStreamSetObject }
func (*CommitStreamSetObjectResponse) MaxVersion() int16    { return 1 }
func (m *CommitStreamSetObjectResponse) SetVersion(v int16) { m.Version = v }
func (m *CommitStreamSetObjectResponse) GetVersion() int16  { return m.Version }
func (*CommitStreamSetObjectResponse) IsFlexible() bool     { return true }

// Throttle returns the controller's throttle, applied after the response.
func (m *CommitStreamSetObjectResponse) Throttle() (int32, bool) { return m.ThrottleMillis, true }

// SetThrottle sets the throttle.
func (m *CommitStreamSetObjectResponse) SetThrottle(ms int32) { m.ThrottleMillis = ms }

// RequestKind returns an empty request of the response's version.
func (m *CommitStreamSetObjectResponse) RequestKind() kmsg.Request {
	return &CommitStreamSetObjectRequest{Version: m.Version}
}

// Validate refuses Attributes other than 0 at v0.
func (m *CommitStreamSetObjectResponse) Validate() error {
	c := newChecker("CommitStreamSetObjectResponse", m.Version, 0, 1)
	c.absent("attributes", 1, m.Attributes == 0, m.Attributes)
	return c.err
}

// AppendTo appends the body; nothing when Validate fails.
func (m *CommitStreamSetObjectResponse) AppendTo(dst []byte) []byte {
	if m.Validate() != nil {
		return dst
	}
	dst = appendInt16(dst, m.ErrorCode)
	dst = appendInt32(dst, m.ThrottleMillis)
	if m.Version >= 1 {
		dst = appendInt32(dst, m.Attributes)
	}
	return appendTags(dst, &m.UnknownTags)
}

// ReadFrom decodes a body of m.Version; m is unchanged on error.
func (m *CommitStreamSetObjectResponse) ReadFrom(src []byte) error {
	r := newReader("CommitStreamSetObjectResponse", m.Version, 0, 1, src)
	n := CommitStreamSetObjectResponse{Version: m.Version}
	n.ErrorCode = r.int16("errorCode")
	n.ThrottleMillis = r.int32("throttleTimeMs")
	if m.Version >= 1 {
		n.Attributes = r.int32("attributes")
	}
	r.tags(&n.UnknownTags)
	if err := r.complete(); err != nil {
		return err
	}
	*m = n
	return nil
}
