package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"walden/automq/protocol"
)

// OpeningStream is a stream a node holds open, as the controller knows it:
// EndOffset is where the next commit of the stream must start.
type OpeningStream struct {
	StreamID    int64
	Epoch       int64
	StartOffset int64
	EndOffset   int64
}

// GetOpeningStreams returns the streams node nodeID holds open. It also
// records nodeEpoch at the controller; with failover set it fences the
// node: the controller refuses the node's own opens and commits
// (NODE_FENCED) until it starts again with a newer epoch. An epoch older
// than the controller's is refused with protocol.ErrNodeEpochExpired.
// Repeated after a lost answer: the same epoch and flag leave the
// controller as the first call did.
func (c *Client) GetOpeningStreams(ctx context.Context, nodeID int32, nodeEpoch int64, failover bool) ([]OpeningStream, error) {
	what := fmt.Sprintf("get the opening streams of node %d (epoch %d, failover %t)", nodeID, nodeEpoch, failover)
	if nodeID < 0 {
		return nil, c.wrap(what, fmt.Errorf("%w: node id %d is negative", ErrInvalidArgument, nodeID))
	}
	resp, err := c.do(ctx, call{api: protocol.KeyGetOpeningStreams, repeatable: true, build: func(v int16) (protocol.Message, error) {
		return &protocol.GetOpeningStreamsRequest{Version: v, NodeID: nodeID, NodeEpoch: nodeEpoch, FailoverMode: failover}, nil
	}})
	if err != nil {
		return nil, c.wrap(what, err)
	}
	r := resp.(*protocol.GetOpeningStreamsResponse)
	out := make([]OpeningStream, len(r.StreamMetadataList))
	for i, s := range r.StreamMetadataList {
		out[i] = OpeningStream{StreamID: s.StreamID, Epoch: s.Epoch, StartOffset: s.StartOffset, EndOffset: s.EndOffset}
	}
	return out, nil
}

// PrepareS3Object reserves count consecutive object ids for node nodeID and
// returns the first. Ids not committed within ttl expire (AutoMQ uses an
// hour). Repeated after a lost answer: the ids the lost answer held are
// never used and expire after ttl, which is harmless.
func (c *Client) PrepareS3Object(ctx context.Context, nodeID int32, count int32, ttl time.Duration) (int64, error) {
	what := fmt.Sprintf("prepare %d object ids for node %d", count, nodeID)
	switch {
	case nodeID < 0:
		return 0, c.wrap(what, fmt.Errorf("%w: node id %d is negative", ErrInvalidArgument, nodeID))
	case count < 1:
		return 0, c.wrap(what, fmt.Errorf("%w: count %d: prepare at least one id", ErrInvalidArgument, count))
	case ttl < time.Millisecond:
		return 0, c.wrap(what, fmt.Errorf("%w: time to live %s is below 1ms", ErrInvalidArgument, ttl))
	}
	resp, err := c.do(ctx, call{api: protocol.KeyPrepareS3Object, repeatable: true, build: func(v int16) (protocol.Message, error) {
		return &protocol.PrepareS3ObjectRequest{Version: v, NodeID: nodeID, PreparedCount: count, TimeToLiveMillis: ttl.Milliseconds()}, nil
	}})
	if err != nil {
		return 0, c.wrap(what, err)
	}
	return resp.(*protocol.PrepareS3ObjectResponse).FirstS3ObjectID, nil
}

// CommitRequest is a CommitStreamSetObject in the caller's terms.
type CommitRequest struct {
	NodeID    int32
	NodeEpoch int64
	// ObjectID is the stream-set object, -1 when only stream objects are
	// committed. OrderID orders the node's stream-set objects (AutoMQ's
	// failover sets it to ObjectID).
	ObjectID   int64
	OrderID    int64
	ObjectSize int64
	// StreamRanges are the stream-set object's streams; each must start
	// at its stream's end offset at the controller.
	StreamRanges []protocol.ObjectStreamRange
	// StreamObjects are objects of one stream each.
	StreamObjects      []protocol.StreamObject
	CompactedObjectIDs []int64
	// FailoverMode commits for a fenced node (a failover).
	FailoverMode bool
	// Attributes of the stream-set object (and each stream object's own):
	// sent at v1; at v0, which cannot carry them, only 0 is accepted.
	Attributes int32
}

// CommitResult is what the controller answered to a commit.
type CommitResult struct {
	// Version is the version of CommitStreamSetObject sent.
	Version int16
	// Attributes is the controller's answer at v1.
	Attributes int32
	// Redundant is set when the controller answered REDUNDANT_OPERATION:
	// the object was committed before (a commit repeated after its answer
	// was lost). Nothing changed; the commit is done.
	Redundant bool
}

// CommitStreamSetObject commits a stream-set object and/or stream objects,
// at v1 when the controller speaks it, else at v0 (and then non-zero
// Attributes are refused with ErrUnsupportedByController before anything
// is sent). Repeated after a lost answer: the controller answers a commit
// of an object it committed already with success or REDUNDANT_OPERATION,
// both a CommitResult.
func (c *Client) CommitStreamSetObject(ctx context.Context, req CommitRequest) (CommitResult, error) {
	what := fmt.Sprintf("commit object %d of node %d (epoch %d, %d stream ranges, %d stream objects)",
		req.ObjectID, req.NodeID, req.NodeEpoch, len(req.StreamRanges), len(req.StreamObjects))
	switch {
	case req.NodeID < 0:
		return CommitResult{}, c.wrap(what, fmt.Errorf("%w: node id %d is negative", ErrInvalidArgument, req.NodeID))
	case req.ObjectID < -1:
		return CommitResult{}, c.wrap(what, fmt.Errorf("%w: object id %d: want an id, or -1 for none", ErrInvalidArgument, req.ObjectID))
	case req.ObjectID == -1 && len(req.StreamRanges) > 0:
		return CommitResult{}, c.wrap(what, fmt.Errorf("%w: stream ranges without a stream-set object (object id -1)", ErrInvalidArgument))
	}
	var sent int16
	resp, err := c.do(ctx, call{api: protocol.KeyCommitStreamSetObject, repeatable: true, build: func(v int16) (protocol.Message, error) {
		sent = v
		m := &protocol.CommitStreamSetObjectRequest{
			Version: v, NodeID: req.NodeID, NodeEpoch: req.NodeEpoch, ObjectID: req.ObjectID, OrderID: req.OrderID,
			ObjectSize: req.ObjectSize, ObjectStreamRanges: req.StreamRanges, StreamObjects: req.StreamObjects,
			CompactedObjectIDs: req.CompactedObjectIDs, FailoverMode: req.FailoverMode, Attributes: req.Attributes,
		}
		return m, m.Validate()
	}})
	res := CommitResult{Version: sent}
	if errors.Is(err, protocol.ErrRedundantOperation) {
		res.Redundant = true
		return res, nil
	}
	if err != nil {
		return CommitResult{}, c.wrap(what, err)
	}
	res.Attributes = resp.(*protocol.CommitStreamSetObjectResponse).Attributes
	return res, nil
}

// CloseStream names a stream to close and the epoch it was opened with.
type CloseStream struct {
	StreamID    int64
	StreamEpoch int64
}

// StreamResult is the controller's answer for one stream of a close.
type StreamResult struct {
	StreamID    int64
	StreamEpoch int64
	// Redundant is set when the controller answered REDUNDANT_OPERATION
	// (closed already); Err is nil then.
	Redundant bool
	// Err is the stream's error code as a *protocol.APIError (naming the
	// stream), nil when it was closed.
	Err error
}

// CloseStreams closes streams of node nodeID as that node (at nodeEpoch),
// each at its epoch; closing a closed stream succeeds. It returns one
// result per stream, in order; when some were refused the error joins
// their errors (errors.Is(err, protocol.ErrStreamFenced)) and the results
// say which. Repeated after a lost answer: a stream closed by the lost
// attempt is answered as closed again, unless a new leader opened it
// meanwhile (STREAM_FENCED: it is no longer the node's).
func (c *Client) CloseStreams(ctx context.Context, nodeID int32, nodeEpoch int64, streams []CloseStream) ([]StreamResult, error) {
	what := fmt.Sprintf("close %d streams of node %d (epoch %d)", len(streams), nodeID, nodeEpoch)
	if nodeID < 0 {
		return nil, c.wrap(what, fmt.Errorf("%w: node id %d is negative", ErrInvalidArgument, nodeID))
	}
	if len(streams) == 0 {
		return nil, nil
	}
	resp, err := c.do(ctx, call{api: protocol.KeyCloseStreams, repeatable: true, build: func(v int16) (protocol.Message, error) {
		m := &protocol.CloseStreamsRequest{Version: v, NodeID: nodeID, NodeEpoch: nodeEpoch,
			CloseStreamRequests: make([]protocol.CloseStreamRequest, len(streams))}
		for i, s := range streams {
			m.CloseStreamRequests[i] = protocol.CloseStreamRequest{StreamID: s.StreamID, StreamEpoch: s.StreamEpoch}
		}
		return m, nil
	}})
	if err != nil {
		return nil, c.wrap(what, err)
	}
	r := resp.(*protocol.CloseStreamsResponse)
	if len(r.CloseStreamResponses) != len(streams) {
		return nil, c.wrap(what, fmt.Errorf("%w: %d results for %d streams", ErrBadAnswer, len(r.CloseStreamResponses), len(streams)))
	}
	out := make([]StreamResult, len(streams))
	var refusedErrs []error
	for i, s := range streams {
		out[i] = StreamResult{StreamID: s.StreamID, StreamEpoch: s.StreamEpoch}
		code := r.CloseStreamResponses[i].ErrorCode
		if code == protocol.ErrRedundantOperation.Code {
			out[i].Redundant = true
			continue
		}
		if e := protocol.ItemError(protocol.KeyCloseStreams, code, streamName(s.StreamID, s.StreamEpoch)); e != nil {
			out[i].Err = e
			refusedErrs = append(refusedErrs, e)
		}
	}
	if len(refusedErrs) > 0 {
		return out, fmt.Errorf("automq controller: %s: %d refused: %w", what, len(refusedErrs), errors.Join(refusedErrs...))
	}
	return out, nil
}

// OpenStream names a stream to open, the epoch to open it at (the
// stream's next epoch) and its tags (sent at v1 only).
type OpenStream struct {
	StreamID    int64
	StreamEpoch int64
	Tags        []protocol.Tag
}

// OpenResult is the controller's answer for one stream of an open.
type OpenResult struct {
	StreamID    int64
	StreamEpoch int64
	// StartOffset and NextOffset are where the opened stream starts and
	// where its next record goes.
	StartOffset int64
	NextOffset  int64
	// Err is the stream's error code as a *protocol.APIError (naming the
	// stream), nil when it was opened.
	Err error
}

// OpenStreams opens streams for node nodeID at nodeEpoch, at v1 when the
// controller speaks it (tags are refused at v0 with
// ErrUnsupportedByController). It returns one result per stream, in
// order; when some were refused the error joins their errors
// (errors.Is(err, protocol.ErrStreamNotClosed)). It is not repeated after a
// lost answer (an open moves the stream to a new epoch and owner):
// ErrOutcomeUnknown says so, and the caller opens again at the same epoch,
// which the controller answers for the same node as the first open.
func (c *Client) OpenStreams(ctx context.Context, nodeID int32, nodeEpoch int64, streams []OpenStream) ([]OpenResult, error) {
	what := fmt.Sprintf("open %d streams for node %d (epoch %d)", len(streams), nodeID, nodeEpoch)
	if nodeID < 0 {
		return nil, c.wrap(what, fmt.Errorf("%w: node id %d is negative", ErrInvalidArgument, nodeID))
	}
	if len(streams) == 0 {
		return nil, nil
	}
	resp, err := c.do(ctx, call{api: protocol.KeyOpenStreams, repeatable: false, build: func(v int16) (protocol.Message, error) {
		m := &protocol.OpenStreamsRequest{Version: v, NodeID: nodeID, NodeEpoch: nodeEpoch,
			OpenStreamRequests: make([]protocol.OpenStreamRequest, len(streams))}
		for i, s := range streams {
			m.OpenStreamRequests[i] = protocol.OpenStreamRequest{StreamID: s.StreamID, StreamEpoch: s.StreamEpoch, Tags: s.Tags}
		}
		return m, m.Validate()
	}})
	if err != nil {
		return nil, c.wrap(what, err)
	}
	r := resp.(*protocol.OpenStreamsResponse)
	if len(r.OpenStreamResponses) != len(streams) {
		return nil, c.wrap(what, fmt.Errorf("%w: %d results for %d streams", ErrBadAnswer, len(r.OpenStreamResponses), len(streams)))
	}
	out := make([]OpenResult, len(streams))
	var refusedErrs []error
	for i, s := range streams {
		a := r.OpenStreamResponses[i]
		out[i] = OpenResult{StreamID: s.StreamID, StreamEpoch: s.StreamEpoch}
		if e := protocol.ItemError(protocol.KeyOpenStreams, a.ErrorCode, streamName(s.StreamID, s.StreamEpoch)); e != nil {
			out[i].Err = e
			refusedErrs = append(refusedErrs, e)
			continue
		}
		out[i].StartOffset, out[i].NextOffset = a.StartOffset, a.NextOffset
	}
	if len(refusedErrs) > 0 {
		return out, fmt.Errorf("automq controller: %s: %d refused: %w", what, len(refusedErrs), errors.Join(refusedErrs...))
	}
	return out, nil
}

// Node is a node as the controller knows it.
type Node struct {
	NodeID int32
	// NodeEpoch is the epoch of the node's last registration, -1 when
	// none.
	NodeEpoch         int64
	WALConfig         string
	State             string
	HasOpeningStreams bool
	Tags              []protocol.Tag
}

// GetNodes returns what the controller knows of the nodes ids (nodes it
// does not know are left out). Repeated after a lost answer: it changes
// nothing.
func (c *Client) GetNodes(ctx context.Context, ids []int32) ([]Node, error) {
	what := fmt.Sprintf("get nodes %v", ids)
	resp, err := c.do(ctx, call{api: protocol.KeyAutomqGetNodes, repeatable: true, build: func(v int16) (protocol.Message, error) {
		return &protocol.AutomqGetNodesRequest{Version: v, NodeIDs: ids}, nil
	}})
	if err != nil {
		return nil, c.wrap(what, err)
	}
	r := resp.(*protocol.AutomqGetNodesResponse)
	out := make([]Node, len(r.Nodes))
	for i, n := range r.Nodes {
		out[i] = Node{NodeID: n.NodeID, NodeEpoch: n.NodeEpoch, WALConfig: n.WALConfig, State: n.State,
			HasOpeningStreams: n.HasOpeningStreams, Tags: n.Tags}
	}
	return out, nil
}

func streamName(id, epoch int64) string { return fmt.Sprintf("stream %d (epoch %d)", id, epoch) }

// wrap says what the call was about; the error keeps every sentinel.
func (c *Client) wrap(what string, err error) error {
	return fmt.Errorf("automq controller: %s: %w", what, err)
}
