package devcontroller

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"walden/automq/protocol"
)

// apply applies one AutoMQ request on voter v and returns its answer. The
// active voter applies it to the shared state under the controller's lock
// (one request at a time, as the active controller's event loop); a
// standby answers NOT_CONTROLLER as AutoMQ's does: for OpenStreams and
// CloseStreams in each stream's answer (each stream is its own controller
// event there), for the others as the top-level error.
func (c *Controller) apply(v *voter, req kmsg.Request) kmsg.Response {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	c.state.Expire(now)
	standby := v.id != c.active
	switch r := req.(type) {
	case *protocol.OpenStreamsRequest:
		return c.openStreams(v, r, standby)
	case *protocol.CloseStreamsRequest:
		return c.closeStreams(v, r, standby)
	}
	if standby {
		c.count(req.Key(), NotController)
		c.log.Info("standby voter answers NOT_CONTROLLER", "voter", v.id, "active", c.active, "api", protocol.NameForKey(req.Key()))
		return errorResponse(req, NotController)
	}
	switch r := req.(type) {
	case *protocol.PrepareS3ObjectRequest:
		first, code := c.state.PrepareObjects(r.NodeID, r.PreparedCount, time.Duration(r.TimeToLiveMillis)*time.Millisecond, now)
		c.count(r.Key(), code)
		c.log.Info("PrepareS3Object", "node_id", r.NodeID, "count", r.PreparedCount, "ttl_ms", r.TimeToLiveMillis,
			"first_object_id", first, "code", code.String())
		return &protocol.PrepareS3ObjectResponse{Version: r.Version, ErrorCode: int16(code), FirstS3ObjectID: first}
	case *protocol.CommitStreamSetObjectRequest:
		code := c.state.CommitStreamSetObject(commitOf(r), now)
		c.count(r.Key(), code)
		c.log.Info("CommitStreamSetObject", "node_id", r.NodeID, "node_epoch", r.NodeEpoch, "object_id", r.ObjectID,
			"object_size", r.ObjectSize, "ranges", len(r.ObjectStreamRanges), "stream_objects", len(r.StreamObjects),
			"failover_mode", r.FailoverMode, "code", code.String())
		return &protocol.CommitStreamSetObjectResponse{Version: r.Version, ErrorCode: int16(code)}
	case *protocol.GetOpeningStreamsRequest:
		streams, code := c.state.GetOpeningStreams(r.NodeID, r.NodeEpoch, r.FailoverMode)
		c.count(r.Key(), code)
		c.log.Info("GetOpeningStreams", "node_id", r.NodeID, "node_epoch", r.NodeEpoch, "failover_mode", r.FailoverMode,
			"opening_streams", len(streams), "code", code.String())
		resp := &protocol.GetOpeningStreamsResponse{Version: r.Version, ErrorCode: int16(code), StreamMetadataList: []protocol.StreamMetadata{}}
		for _, s := range streams {
			resp.StreamMetadataList = append(resp.StreamMetadataList, protocol.StreamMetadata{
				StreamID: s.StreamID, Epoch: s.Epoch, StartOffset: s.StartOffset, EndOffset: s.EndOffset,
			})
		}
		return resp
	case *protocol.AutomqGetNodesRequest:
		nodes := c.state.GetNodes(r.NodeIDs)
		c.count(r.Key(), None)
		c.log.Debug("AutomqGetNodes", "asked", len(r.NodeIDs), "answered", len(nodes))
		resp := &protocol.AutomqGetNodesResponse{Version: r.Version, Nodes: []protocol.NodeMetadata{}}
		for _, n := range nodes {
			m := protocol.NodeMetadata{NodeID: n.NodeID, NodeEpoch: n.NodeEpoch, WALConfig: n.WALConfig,
				State: string(n.State), HasOpeningStreams: n.HasOpeningStreams, Tags: []protocol.Tag{}}
			for _, t := range n.Tags {
				m.Tags = append(m.Tags, protocol.Tag{Key: t.Key, Value: t.Value})
			}
			resp.Nodes = append(resp.Nodes, m)
		}
		return resp
	}
	// serves() let through only the keys above.
	c.log.Error("no handler for an API it serves", "api", protocol.NameForKey(req.Key()))
	return errorResponse(req, UnknownServerError)
}

func (c *Controller) openStreams(v *voter, r *protocol.OpenStreamsRequest, standby bool) kmsg.Response {
	resp := &protocol.OpenStreamsResponse{Version: r.Version, OpenStreamResponses: make([]protocol.OpenStreamResponse, 0, len(r.OpenStreamRequests))}
	for _, s := range r.OpenStreamRequests {
		var o Opened
		code := NotController
		if !standby {
			tags := make([]Tag, 0, len(s.Tags))
			for _, t := range s.Tags {
				tags = append(tags, Tag{Key: t.Key, Value: t.Value})
			}
			o, code = c.state.OpenStream(r.NodeID, r.NodeEpoch, s.StreamID, s.StreamEpoch, tags...)
		}
		c.count(r.Key(), code)
		c.log.Info("OpenStreams", "voter", v.id, "node_id", r.NodeID, "node_epoch", r.NodeEpoch, "stream_id", s.StreamID,
			"stream_epoch", s.StreamEpoch, "next_offset", o.NextOffset, "code", code.String())
		resp.OpenStreamResponses = append(resp.OpenStreamResponses, protocol.OpenStreamResponse{
			ErrorCode: int16(code), StartOffset: o.StartOffset, NextOffset: o.NextOffset,
		})
	}
	return resp
}

func (c *Controller) closeStreams(v *voter, r *protocol.CloseStreamsRequest, standby bool) kmsg.Response {
	resp := &protocol.CloseStreamsResponse{Version: r.Version, CloseStreamResponses: make([]protocol.CloseStreamResponse, 0, len(r.CloseStreamRequests))}
	for _, s := range r.CloseStreamRequests {
		code := NotController
		if !standby {
			code = c.state.CloseStream(r.NodeID, r.NodeEpoch, s.StreamID, s.StreamEpoch)
		}
		c.count(r.Key(), code)
		c.log.Info("CloseStreams", "voter", v.id, "node_id", r.NodeID, "node_epoch", r.NodeEpoch, "stream_id", s.StreamID,
			"stream_epoch", s.StreamEpoch, "code", code.String())
		resp.CloseStreamResponses = append(resp.CloseStreamResponses, protocol.CloseStreamResponse{ErrorCode: int16(code)})
	}
	return resp
}

// commitOf converts a CommitStreamSetObject request for the state machine.
func commitOf(r *protocol.CommitStreamSetObjectRequest) Commit {
	c := Commit{
		NodeID:             r.NodeID,
		NodeEpoch:          r.NodeEpoch,
		ObjectID:           r.ObjectID,
		OrderID:            r.OrderID,
		ObjectSize:         r.ObjectSize,
		CompactedObjectIDs: append([]int64(nil), r.CompactedObjectIDs...),
		FailoverMode:       r.FailoverMode,
		Attributes:         r.Attributes,
	}
	for _, x := range r.ObjectStreamRanges {
		c.Ranges = append(c.Ranges, CommitRange{StreamID: x.StreamID, StreamEpoch: x.StreamEpoch, StartOffset: x.StartOffset, EndOffset: x.EndOffset})
	}
	for _, so := range r.StreamObjects {
		c.StreamObjects = append(c.StreamObjects, CommitStreamObject{
			ObjectID: so.ObjectID, ObjectSize: so.ObjectSize, StreamID: so.StreamID,
			StartOffset: so.StartOffset, EndOffset: so.EndOffset, Attributes: so.Attributes,
		})
	}
	return c
}

// count records an answer; the caller holds c.mu.
func (c *Controller) count(key int16, code Code) {
	c.requests[requestKey{api: protocol.NameForKey(key), code: code}]++
}
