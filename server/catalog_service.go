package server

import (
	"context"
	"fmt"
	"math"

	"walden/fieldlimit"
	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// catalogState is what the Catalog service reads (*fsm.State).
type catalogState interface {
	CheckBroker(brokerID string, epoch uint64, fo *waldenv1.FailoverContext) error
	Stream(id uint64) (*waldenv1.Stream, bool)
	Streams(owner, state string) []*waldenv1.Stream
	OpeningStreams(brokerID string) []*waldenv1.Stream
	StreamObjects(streamID, fromOffset uint64, max int) []*waldenv1.Object
}

// catalogService implements walden.v1.Catalog: writes are proposed through
// raft (a follower's proposal reaches the leader through raft itself) and
// refusals keep their fencing reason; reads are linearizable (ReadIndex,
// then the local state).
type catalogService struct {
	waldenv1.UnimplementedCatalogServer
	d     *serviceDeps
	state catalogState
}

func newCatalogService(d *serviceDeps, state catalogState) *catalogService {
	return &catalogService{d: d, state: state}
}

// checkBrokerRef validates the (broker_id, broker_epoch) pair every catalog
// request carries.
func checkBrokerRef(brokerID string, epoch uint64) error {
	if err := checkBrokerID("broker_id", brokerID); err != nil {
		return err
	}
	if epoch == 0 {
		return invalidArg("broker_epoch", "must be a registered epoch (> 0)")
	}
	return nil
}

// checkStreamID refuses the ids no stream may have: 0 (the value of an id
// left unset) and 2^64-1 (an id next to which offsets and keys wrap).
func checkStreamID(field string, id uint64) error {
	switch id {
	case 0:
		return invalidArg(field, "must not be 0")
	case math.MaxUint64:
		return invalidArg(field, "must be less than 2^64-1")
	}
	return nil
}

// checkRanges validates an object's ranges as the catalog keeps them
// (fsm.CheckObject): each a non-empty section inside the object between
// its header and its index, the sections in ascending positions without
// overlap, each stream once, its offsets ascending, below 2^63 and no more
// than its bytes can hold.
func checkRanges(o *waldenv1.Object) error {
	if fe := fsm.CheckObject(o); fe != nil {
		return invalidArg(fe.Field, fe.Reason)
	}
	return nil
}

// checkFailover validates an optional failover context.
func checkFailover(field string, fo *waldenv1.FailoverContext) error {
	if fo == nil {
		return nil
	}
	switch {
	case fo.GetJobId() == "":
		return invalidArg(field+".job_id", "must not be empty")
	case fo.GetAttempt() == 0:
		return invalidArg(field+".attempt", "must be at least 1")
	case fo.GetToken() == 0:
		return invalidArg(field+".token", "must not be 0")
	}
	return nil
}

func (s *catalogService) write(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	res, err := s.d.propose(ctx, cmd)
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	return res, nil
}

func (s *catalogService) OpenStream(ctx context.Context, req *waldenv1.OpenStreamRequest) (*waldenv1.OpenStreamResponse, error) {
	if err := checkBrokerRef(req.GetBrokerId(), req.GetBrokerEpoch()); err != nil {
		return nil, err
	}
	if err := checkStreamID("stream_id", req.GetStreamId()); err != nil {
		return nil, err
	}
	res, err := s.write(ctx, &waldenv1.Command{Op: &waldenv1.Command_OpenStream{OpenStream: req}})
	if err != nil {
		return nil, err
	}
	return res.GetOpenStream(), nil
}

func (s *catalogService) CommitObject(ctx context.Context, req *waldenv1.CommitObjectRequest) (*waldenv1.CommitObjectResponse, error) {
	if err := checkBrokerRef(req.GetBrokerId(), req.GetBrokerEpoch()); err != nil {
		return nil, err
	}
	if err := checkFailover("failover", req.GetFailover()); err != nil {
		return nil, err
	}
	o := req.GetObject()
	switch {
	case o == nil:
		return nil, invalidArg("object", "required")
	case o.GetObjectId() == "":
		return nil, invalidArg("object.object_id", "must not be empty")
	case o.GetKey() == "":
		return nil, invalidArg("object.key", "must not be empty")
	case len(o.GetRanges()) == 0:
		return nil, invalidArg("object.ranges", "must name at least one stream range")
	}
	if err := checkRanges(o); err != nil {
		return nil, err
	}
	res, err := s.write(ctx, &waldenv1.Command{Op: &waldenv1.Command_CommitObject{CommitObject: req}})
	if err != nil {
		return nil, err
	}
	return res.GetCommitObject(), nil
}

func (s *catalogService) CloseStream(ctx context.Context, req *waldenv1.CloseStreamRequest) (*waldenv1.CloseStreamResponse, error) {
	if err := checkBrokerRef(req.GetBrokerId(), req.GetBrokerEpoch()); err != nil {
		return nil, err
	}
	if err := checkStreamID("stream_id", req.GetStreamId()); err != nil {
		return nil, err
	}
	if req.GetStreamEpoch() == 0 {
		return nil, invalidArg("stream_epoch", "must not be 0")
	}
	if err := checkFailover("failover", req.GetFailover()); err != nil {
		return nil, err
	}
	res, err := s.write(ctx, &waldenv1.Command{Op: &waldenv1.Command_CloseStream{CloseStream: req}})
	if err != nil {
		return nil, err
	}
	return res.GetCloseStream(), nil
}

// read waits until the local state reflects every committed entry.
func (s *catalogService) read(ctx context.Context) error {
	if err := s.d.node.LinearizableRead(ctx); err != nil {
		return s.d.stateErr(ctx, err)
	}
	return nil
}

// GetOpeningStreams answers the broker's opened streams. The broker's epoch
// is checked like a write (a fenced broker is refused NODE_FENCED), unless
// a recovery job asks in failover mode with its current attempt.
func (s *catalogService) GetOpeningStreams(ctx context.Context, req *waldenv1.GetOpeningStreamsRequest) (*waldenv1.GetOpeningStreamsResponse, error) {
	if err := checkBrokerRef(req.GetBrokerId(), req.GetBrokerEpoch()); err != nil {
		return nil, err
	}
	if err := checkFailover("failover", req.GetFailover()); err != nil {
		return nil, err
	}
	if err := s.read(ctx); err != nil {
		return nil, err
	}
	if err := s.state.CheckBroker(req.GetBrokerId(), req.GetBrokerEpoch(), req.GetFailover()); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	return &waldenv1.GetOpeningStreamsResponse{Streams: s.state.OpeningStreams(req.GetBrokerId())}, nil
}

func (s *catalogService) ListStreams(ctx context.Context, req *waldenv1.ListStreamsRequest) (*waldenv1.ListStreamsResponse, error) {
	switch req.GetState() {
	case "", fsm.StreamOpened, fsm.StreamClosed:
	default:
		return nil, invalidArg("state", fmt.Sprintf("%q is not opened or closed", req.GetState()))
	}
	if err := s.read(ctx); err != nil {
		return nil, err
	}
	return &waldenv1.ListStreamsResponse{Streams: s.state.Streams(req.GetOwnerBrokerId(), req.GetState())}, nil
}

func (s *catalogService) DescribeStream(ctx context.Context, req *waldenv1.DescribeStreamRequest) (*waldenv1.DescribeStreamResponse, error) {
	maxObjects, err := fieldlimit.Count("max_objects", uint64(req.GetMaxObjects()), fieldlimit.MaxRepeated)
	if err != nil {
		return nil, fieldErr(err)
	}
	if err := s.read(ctx); err != nil {
		return nil, err
	}
	st, ok := s.state.Stream(req.GetStreamId())
	if !ok {
		return nil, rpcerr.Status(fmt.Errorf("stream %d: %w", req.GetStreamId(), refusal.ErrUnknownStream)).Err()
	}
	return &waldenv1.DescribeStreamResponse{Stream: st, Objects: s.state.StreamObjects(req.GetStreamId(), req.GetFromOffset(), maxObjects)}, nil
}
