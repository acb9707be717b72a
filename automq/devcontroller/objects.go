package devcontroller

import (
	"maps"
	"slices"
	"time"
)

// PrepareObjects applies PrepareS3Object (S3ObjectControlManager
// .prepareObject): count new object ids, consecutive from the next unused id
// (the first is 0), each PREPARED until now + ttl, and returns the first.
// AutoMQ checks no node epoch here. A count of 0 returns the next id and
// reserves nothing, as AutoMQ does; a negative count, which would hand out
// ids again in AutoMQ, gets INVALID_REQUEST.
func (s *State) PrepareObjects(nodeID int32, count int32, ttl time.Duration, now time.Time) (int64, Code) {
	if count < 0 {
		return 0, InvalidRequest
	}
	first := s.nextObjectID
	for i := int64(0); i < int64(count); i++ {
		s.objects[first+i] = &s3Object{
			state:      ObjectPrepared,
			preparedAt: now,
			deadline:   now.Add(ttl),
			preparedBy: nodeID,
		}
	}
	s.nextObjectID = first + int64(count)
	return first, None
}

// expired is S3Object.isExpired: a prepared object whose deadline has
// passed.
func (o *s3Object) expired(now time.Time) bool {
	return o.state == ObjectPrepared && now.After(o.deadline)
}

// Expire marks the prepared objects whose deadline has passed as
// MARK_DESTROYED (S3ObjectControlManager.checkS3ObjectsLifecycle) and
// returns their ids in order. AutoMQ 1.4.1 looks at a prepared object's
// deadline only every 30 minutes or more; the development controller treats
// an object as expired from its deadline on (see CommitStreamSetObject), so
// Expire only makes the snapshot say so.
func (s *State) Expire(now time.Time) []int64 {
	var out []int64
	for _, id := range slices.Sorted(maps.Keys(s.objects)) {
		if o := s.objects[id]; o.expired(now) {
			o.state = ObjectMarkDestroyed
			out = append(out, id)
		}
	}
	return out
}

// CommitRange is one stream's range in a stream-set object
// (ObjectStreamRange). AutoMQ ignores its StreamEpoch.
type CommitRange struct {
	StreamID    int64
	StreamEpoch int64
	StartOffset int64
	EndOffset   int64
}

// CommitStreamObject is one stream object of a commit (StreamObject).
type CommitStreamObject struct {
	ObjectID    int64
	ObjectSize  int64
	StreamID    int64
	StartOffset int64
	EndOffset   int64
	Attributes  int32
}

// Commit is a CommitStreamSetObject request.
type Commit struct {
	NodeID             int32
	NodeEpoch          int64
	ObjectID           int64
	OrderID            int64
	ObjectSize         int64
	Ranges             []CommitRange
	StreamObjects      []CommitStreamObject
	CompactedObjectIDs []int64
	FailoverMode       bool
	Attributes         int32
}

// CommitStreamSetObject applies CommitStreamSetObject (StreamControlManager
// .commitStreamSetObject). It checks, in AutoMQ's order, and refuses with the
// first failure, changing nothing:
//  1. the node epoch, with the failover flag unless FailoverMode is set (a
//     fenced node's commit passes only in failover mode);
//  2. a single compacted id equal to ObjectID replaces that committed
//     object's attributes (OBJECT_NOT_EXIST, OBJECT_NOT_COMMITED) and does
//     nothing else;
//  3. the stream-set object, unless ObjectID is −1: never prepared, expired
//     (now after its deadline) or destroyed gets OBJECT_NOT_EXIST; already
//     committed is a redundant commit, answered with success and no change
//     (AutoMQ 1.4.1 answers NONE, not REDUNDANT_OPERATION, here);
//  4. compacted objects: each must exist and not be destroyed
//     (COMPACTED_OBJECTS_NOT_FOUND) and be a stream-set object of this node
//     (AutoMQ fails with an internal error otherwise: UNKNOWN_SERVER_ERROR);
//  5. stream objects of existing streams, as in 3 — one already committed
//     makes the whole commit a redundant success with no change;
//  6. without compacted objects, every range and stream object: the stream
//     exists (STREAM_NOT_EXIST), is OPENED (STREAM_NOT_OPENED), its current
//     range is the node's (STREAM_INNER_ERROR otherwise, as AutoMQ answers)
//     and the range starts at the stream's end offset or at or below its
//     start offset (OFFSET_NOT_MATCHED). Every range is checked against the
//     state before the commit.
//
// Then the objects are committed, the compacted ones destroyed, and each
// stream's end offset moves to its ranges' and stream objects' end (never
// back). Stream objects of streams that no longer exist are destroyed.
func (s *State) CommitStreamSetObject(c Commit, now time.Time) Code {
	if code := s.nodeEpochCheck(c.NodeID, c.NodeEpoch, !c.FailoverMode); code != None {
		return code
	}
	if len(c.CompactedObjectIDs) == 1 && c.ObjectID == c.CompactedObjectIDs[0] {
		return s.replaceAttributes(c.ObjectID, c.Attributes)
	}
	switch code := s.committable(c.ObjectID, now); code {
	case None:
	case RedundantOperation:
		return None
	default:
		return code
	}
	orderID := c.OrderID
	dataTime := now
	for _, id := range c.CompactedObjectIDs {
		if o, ok := s.objects[id]; !ok || o.state == ObjectMarkDestroyed {
			return CompactedObjectsNotFound
		}
	}
	for i, id := range c.CompactedObjectIDs {
		o := s.objects[id]
		if !o.inNodeSet || o.node != c.NodeID {
			return UnknownServerError
		}
		if i == 0 || o.dataTime.Before(dataTime) {
			dataTime = o.dataTime
		}
	}
	if orderID == -1 && len(c.CompactedObjectIDs) > 0 {
		orderID = s.objects[c.CompactedObjectIDs[0]].orderID
		for _, id := range c.CompactedObjectIDs[1:] {
			orderID = min(orderID, s.objects[id].orderID)
		}
	}
	for _, so := range c.StreamObjects {
		if _, ok := s.streams[so.StreamID]; !ok {
			continue
		}
		switch code := s.committable(so.ObjectID, now); code {
		case None:
		case RedundantOperation:
			return None
		default:
			return code
		}
	}
	if len(c.CompactedObjectIDs) == 0 {
		if code := s.advanceCheck(c); code != None {
			return code
		}
	}

	// Every check passed: apply.
	for _, id := range c.CompactedObjectIDs {
		o := s.objects[id]
		o.state = ObjectMarkDestroyed
		o.inNodeSet = false
	}
	if c.ObjectID != noopObjectID {
		o := s.objects[c.ObjectID]
		o.state = ObjectCommitted
		o.size = c.ObjectSize
		o.attributes = c.Attributes
		o.kind = KindStreamSet
		o.node = c.NodeID
		o.orderID = orderID
		o.dataTime = dataTime
		o.inNodeSet = true
		o.ranges = make([]ObjectRange, 0, len(c.Ranges))
		for _, r := range c.Ranges {
			o.ranges = append(o.ranges, ObjectRange{StreamID: r.StreamID, StartOffset: r.StartOffset, EndOffset: r.EndOffset})
		}
	}
	if len(c.CompactedObjectIDs) == 0 {
		for _, r := range c.Ranges {
			if st, ok := s.streams[r.StreamID]; ok {
				st.advanceEnd(r.EndOffset)
			}
		}
	}
	for _, so := range c.StreamObjects {
		o := s.objects[so.ObjectID]
		st, ok := s.streams[so.StreamID]
		if !ok {
			// The stream was deleted: AutoMQ destroys the object at once.
			if o != nil && o.state != ObjectMarkDestroyed {
				o.state = ObjectMarkDestroyed
			}
			continue
		}
		o.state = ObjectCommitted
		o.size = so.ObjectSize
		o.attributes = so.Attributes
		o.kind = KindStream
		o.node = c.NodeID
		o.stream = so.StreamID
		o.dataTime = now
		o.ranges = []ObjectRange{{StreamID: so.StreamID, StartOffset: so.StartOffset, EndOffset: so.EndOffset}}
		st.objects[so.ObjectID] = offsets{start: so.StartOffset, end: so.EndOffset}
		st.advanceEnd(so.EndOffset)
	}
	return None
}

// committable is S3ObjectControlManager.commitObject's check: −1 needs no
// object, an unknown, expired or destroyed one gets OBJECT_NOT_EXIST, a
// committed one REDUNDANT_OPERATION.
func (s *State) committable(id int64, now time.Time) Code {
	if id == noopObjectID {
		return None
	}
	o, ok := s.objects[id]
	switch {
	case !ok:
		return ObjectNotExist
	case o.state == ObjectCommitted:
		return RedundantOperation
	case o.state != ObjectPrepared || o.expired(now):
		return ObjectNotExist
	}
	return None
}

// replaceAttributes is S3ObjectControlManager.replaceCommittedObject.
func (s *State) replaceAttributes(id int64, attributes int32) Code {
	o, ok := s.objects[id]
	if !ok {
		return ObjectNotExist
	}
	if o.state != ObjectCommitted {
		return ObjectNotCommitted
	}
	o.attributes = attributes
	return None
}

// advanceCheck is StreamControlManager.streamAdvanceCheck over the commit's
// ranges and then its stream objects.
func (s *State) advanceCheck(c Commit) Code {
	check := func(streamID, start int64) Code {
		st, ok := s.streams[streamID]
		if !ok {
			return StreamNotExist
		}
		if st.state != StreamOpened {
			return StreamNotOpened
		}
		r, ok := st.currentRange()
		if !ok || r.node != c.NodeID {
			return StreamInnerError
		}
		if st.end != start && start > st.start {
			return OffsetNotMatched
		}
		return None
	}
	for _, r := range c.Ranges {
		if code := check(r.StreamID, r.StartOffset); code != None {
			return code
		}
	}
	for _, so := range c.StreamObjects {
		if code := check(so.StreamID, so.StartOffset); code != None {
			return code
		}
	}
	return None
}
