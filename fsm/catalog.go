package fsm

import (
	"fmt"
	"sort"

	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// Stream states, as spelled in the API.
const (
	StreamOpened = "opened"
	StreamClosed = "closed"
)

// applyOpenStream opens a stream for a broker at its current epoch: a new
// stream is created at stream epoch 1, a closed one gets epoch+1, an opened
// one is taken back by its own owner at a newer broker epoch (epoch+1) and
// answered as is to the same owner and epoch (a retried open); any other
// opened stream is STREAM_NOT_CLOSED.
func (s *State) applyOpenStream(index uint64, op *waldenv1.OpenStreamRequest) (*waldenv1.Result, error) {
	if s.reconcilingLocked() {
		return nil, s.refuseReconciling(fmt.Sprintf("open stream %d", op.GetStreamId()))
	}
	if _, err := s.checkBroker(op.GetBrokerId(), op.GetBrokerEpoch(), nil); err != nil {
		return nil, fmt.Errorf("open stream %d: %w", op.GetStreamId(), err)
	}
	st, ok := s.streams[op.GetStreamId()]
	switch {
	case !ok:
		st = &waldenv1.Stream{StreamId: op.GetStreamId()}
		s.streams[st.StreamId] = st
	case st.GetState() == StreamClosed:
	case st.GetOwnerBrokerId() == op.GetBrokerId() && st.GetOwnerEpoch() == op.GetBrokerEpoch():
		return s.openResult(st), nil
	case st.GetOwnerBrokerId() == op.GetBrokerId() && st.GetOwnerEpoch() < op.GetBrokerEpoch():
	default:
		return nil, refusal.WithMetadata(fmt.Errorf("open stream %d: opened by %q at epoch %d: %w",
			st.GetStreamId(), st.GetOwnerBrokerId(), st.GetOwnerEpoch(), refusal.ErrStreamNotClosed),
			map[string]string{"owner_broker_id": st.GetOwnerBrokerId()})
	}
	if st.GetState() == StreamClosed {
		s.noteReopen(st)
	}
	st.Epoch++
	st.State = StreamOpened
	st.OwnerBrokerId = op.GetBrokerId()
	st.OwnerEpoch = op.GetBrokerEpoch()
	st.UpdatedUnixMs = s.now()
	return s.openResult(st), nil
}

// openResult answers an open with the stream and its producer table, so
// that the new owner checks retried appends against what is committed.
func (s *State) openResult(st *waldenv1.Stream) *waldenv1.Result {
	resp := &waldenv1.OpenStreamResponse{Stream: clone(st)}
	if t := s.producers[st.GetStreamId()]; t != nil {
		resp.Producers = t.States()
	}
	return &waldenv1.Result{Value: &waldenv1.Result_OpenStream{OpenStream: resp}}
}

// checkOwner refuses a write to st by broker brokerID at epoch (or in
// failover mode) that does not own it at streamEpoch.
func checkOwner(st *waldenv1.Stream, brokerID string, epoch, streamEpoch uint64, failover bool) error {
	if st.GetOwnerBrokerId() != brokerID || (!failover && st.GetOwnerEpoch() != epoch) {
		return refusal.WithMetadata(fmt.Errorf("stream %d owned by %q at epoch %d: %w",
			st.GetStreamId(), st.GetOwnerBrokerId(), st.GetOwnerEpoch(), refusal.ErrNotOwner),
			map[string]string{"owner_broker_id": st.GetOwnerBrokerId()})
	}
	if streamEpoch != st.GetEpoch() {
		return fmt.Errorf("stream %d epoch %d, current stream epoch %d: %w",
			st.GetStreamId(), streamEpoch, st.GetEpoch(), refusal.ErrEpochExpired)
	}
	return nil
}

// applyCommitObject commits an uploaded object, all or nothing. The same
// object id again is a redundant success that changes nothing. Otherwise the
// broker's epoch (or the failover context) is checked, and every range must
// name a distinct opened stream owned by the broker at the stream's epoch and
// start exactly at its end offset; the producers' last batches it names
// must lie inside their stream's range. They are merged into the streams'
// producer tables. From level ChecksBounded on, the ranges must also fit
// the object and their offsets their bytes (CheckObject).
func (s *State) applyCommitObject(index uint64, checks uint32, op *waldenv1.CommitObjectRequest) (*waldenv1.Result, error) {
	obj := op.GetObject()
	if obj.GetObjectId() == "" {
		return nil, invalid("commit object: object.object_id is empty")
	}
	if prev, ok := s.objects[obj.GetObjectId()]; ok {
		return s.commitResult(prev, true), nil
	}
	if len(obj.GetRanges()) == 0 {
		return nil, invalid("commit object %s: object.ranges is empty", obj.GetObjectId())
	}
	if checks >= ChecksBounded {
		if fe := CheckObject(obj); fe != nil {
			return nil, invalid("commit object %s: %s", obj.GetObjectId(), fe)
		}
	}
	job, err := s.checkBroker(op.GetBrokerId(), op.GetBrokerEpoch(), op.GetFailover())
	if err != nil {
		return nil, fmt.Errorf("commit object %s: %w", obj.GetObjectId(), err)
	}
	seen := map[uint64]bool{}
	for i, r := range obj.GetRanges() {
		if seen[r.GetStreamId()] {
			return nil, invalid("commit object %s: object.ranges[%d]: stream %d twice", obj.GetObjectId(), i, r.GetStreamId())
		}
		seen[r.GetStreamId()] = true
		if r.GetEndOffset() <= r.GetStartOffset() {
			return nil, invalid("commit object %s: object.ranges[%d]: end_offset %d not beyond start_offset %d",
				obj.GetObjectId(), i, r.GetEndOffset(), r.GetStartOffset())
		}
		st, ok := s.streams[r.GetStreamId()]
		if !ok {
			return nil, fmt.Errorf("commit object %s: stream %d: %w", obj.GetObjectId(), r.GetStreamId(), refusal.ErrUnknownStream)
		}
		if st.GetState() != StreamOpened {
			return nil, fmt.Errorf("commit object %s: stream %d is closed: %w", obj.GetObjectId(), r.GetStreamId(), refusal.ErrStreamNotOpened)
		}
		if err := checkOwner(st, op.GetBrokerId(), op.GetBrokerEpoch(), r.GetStreamEpoch(), job != nil); err != nil {
			return nil, fmt.Errorf("commit object %s: %w", obj.GetObjectId(), err)
		}
		if r.GetStartOffset() != st.GetEndOffset() {
			return nil, refusal.WithMetadata(fmt.Errorf("commit object %s: stream %d range starts at %d, end offset is %d: %w",
				obj.GetObjectId(), r.GetStreamId(), r.GetStartOffset(), st.GetEndOffset(), refusal.ErrOffsetMismatch),
				map[string]string{"stream_id": fmt.Sprint(st.GetStreamId()), "end_offset": fmt.Sprint(st.GetEndOffset())})
		}
	}

	if err := checkProducers(obj, op.GetProducers(), checks); err != nil {
		return nil, err
	}

	o := clone(obj)
	o.BrokerId = op.GetBrokerId()
	o.BrokerEpoch = op.GetBrokerEpoch()
	o.CommittedIndex = index
	o.CommittedUnixMs = s.now()
	o.Failover = job != nil
	o.JobId = ""
	if job != nil {
		o.BrokerEpoch = job.GetToken()
		o.JobId = job.GetJobId()
		job.Objects = append(job.Objects, o.GetObjectId())
		job.UpdatedUnixMs = s.now()
	}
	for _, r := range o.GetRanges() {
		st := s.streams[r.GetStreamId()]
		st.EndOffset = r.GetEndOffset()
		st.Objects++
		st.UpdatedUnixMs = s.now()
		s.streamObjects[st.GetStreamId()] = append(s.streamObjects[st.GetStreamId()], o.GetObjectId())
	}
	s.objects[o.GetObjectId()] = o
	for _, sp := range op.GetProducers() {
		s.producerTable(sp.GetStreamId()).Merge(sp.GetProducers())
	}
	return s.commitResult(o, false), nil
}

// producerTable returns stream id's producer table, created empty when it
// has none.
func (s *State) producerTable(id uint64) *producer.Table {
	t := s.producers[id]
	if t == nil {
		t = producer.NewTable(nil)
		s.producers[id] = t
	}
	return t
}

// checkProducers validates a commit's producer summary against the
// object's ranges: a stream of the object, once; per producer one batch,
// of at least one record, inside the stream's range.
func checkProducers(obj *waldenv1.Object, sps []*waldenv1.StreamProducers, checks uint32) error {
	ranges := map[uint64]*waldenv1.ObjectRange{}
	for _, r := range obj.GetRanges() {
		ranges[r.GetStreamId()] = r
	}
	seenStream := map[uint64]bool{}
	for i, sp := range sps {
		r := ranges[sp.GetStreamId()]
		switch {
		case r == nil:
			return invalid("commit object %s: producers[%d].stream_id: stream %d has no range in the object", obj.GetObjectId(), i, sp.GetStreamId())
		case seenStream[sp.GetStreamId()]:
			return invalid("commit object %s: producers[%d].stream_id: stream %d appears twice", obj.GetObjectId(), i, sp.GetStreamId())
		}
		seenStream[sp.GetStreamId()] = true
		seen := map[uint64]bool{}
		for j, p := range sp.GetProducers() {
			field := fmt.Sprintf("producers[%d].producers[%d]", i, j)
			switch {
			case p.GetProducerId() == 0:
				return invalid("commit object %s: %s.producer_id: must not be 0", obj.GetObjectId(), field)
			case seen[p.GetProducerId()]:
				return invalid("commit object %s: %s.producer_id: producer %d appears twice", obj.GetObjectId(), field, p.GetProducerId())
			case p.GetCount() == 0:
				return invalid("commit object %s: %s.count: must not be 0", obj.GetObjectId(), field)
			case !producerInside(checks, p.GetOffset(), p.GetCount(), r.GetStartOffset(), r.GetEndOffset()):
				return invalid("commit object %s: %s: offsets [%d, %d) outside the stream's range [%d, %d)", obj.GetObjectId(), field,
					p.GetOffset(), p.GetOffset()+uint64(p.GetCount()), r.GetStartOffset(), r.GetEndOffset())
			}
			seen[p.GetProducerId()] = true
		}
	}
	return nil
}

// Producers returns copies of stream id's producer table, sorted by
// producer id.
func (s *State) Producers(id uint64) []*waldenv1.ProducerState {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if t := s.producers[id]; t != nil {
		return t.States()
	}
	return nil
}

func (s *State) commitResult(o *waldenv1.Object, redundant bool) *waldenv1.Result {
	resp := &waldenv1.CommitObjectResponse{Object: clone(o), Redundant: redundant}
	for _, r := range o.GetRanges() {
		if st, ok := s.streams[r.GetStreamId()]; ok {
			resp.Streams = append(resp.Streams, clone(st))
		}
	}
	sort.Slice(resp.Streams, func(i, j int) bool { return resp.Streams[i].GetStreamId() < resp.Streams[j].GetStreamId() })
	return &waldenv1.Result{Value: &waldenv1.Result_CommitObject{CommitObject: resp}}
}

// applyCloseStream closes a stream. Closing a closed stream succeeds and
// changes nothing. Otherwise the broker's epoch (or, for a fenced broker,
// the failover context) is checked, and the broker must own the stream at
// the stream's epoch.
func (s *State) applyCloseStream(index uint64, op *waldenv1.CloseStreamRequest) (*waldenv1.Result, error) {
	st, ok := s.streams[op.GetStreamId()]
	if !ok {
		return nil, fmt.Errorf("close stream %d: %w", op.GetStreamId(), refusal.ErrUnknownStream)
	}
	if st.GetState() == StreamClosed {
		return closeResult(st), nil
	}
	job, err := s.checkBroker(op.GetBrokerId(), op.GetBrokerEpoch(), op.GetFailover())
	if err != nil {
		return nil, fmt.Errorf("close stream %d: %w", op.GetStreamId(), err)
	}
	if err := checkOwner(st, op.GetBrokerId(), op.GetBrokerEpoch(), op.GetStreamEpoch(), job != nil); err != nil {
		return nil, fmt.Errorf("close stream %d: %w", op.GetStreamId(), err)
	}
	st.State = StreamClosed
	st.UpdatedUnixMs = s.now()
	noteFailoverClose(st, job)
	if job != nil {
		job.UpdatedUnixMs = s.now()
	}
	return closeResult(st), nil
}

func closeResult(st *waldenv1.Stream) *waldenv1.Result {
	return &waldenv1.Result{Value: &waldenv1.Result_CloseStream{CloseStream: &waldenv1.CloseStreamResponse{Stream: clone(st)}}}
}

// Stream returns a copy of stream id.
func (s *State) Stream(id uint64) (*waldenv1.Stream, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st, ok := s.streams[id]
	if !ok {
		return nil, false
	}
	return clone(st), true
}

// Streams returns copies of the streams owned by owner (all when empty) in
// state (all when empty), sorted by id.
func (s *State) Streams(owner, state string) []*waldenv1.Stream {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*waldenv1.Stream
	for _, id := range sortedKeys(s.streams) {
		st := s.streams[id]
		if (owner == "" || st.GetOwnerBrokerId() == owner) && (state == "" || st.GetState() == state) {
			out = append(out, clone(st))
		}
	}
	return out
}

// OpeningStreams returns copies of the opened streams owned by brokerID,
// sorted by id: what a recovery of the broker must commit and close.
func (s *State) OpeningStreams(brokerID string) []*waldenv1.Stream {
	if brokerID == "" {
		return nil
	}
	return s.Streams(brokerID, StreamOpened)
}

// StreamObjects returns copies of up to max (all when max <= 0) objects of
// stream streamID whose range of the stream ends after fromOffset, in offset
// order.
func (s *State) StreamObjects(streamID, fromOffset uint64, max int) []*waldenv1.Object {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*waldenv1.Object
	for _, id := range s.streamObjects[streamID] {
		o := s.objects[id]
		for _, r := range o.GetRanges() {
			if r.GetStreamId() == streamID && r.GetEndOffset() > fromOffset {
				out = append(out, clone(o))
				break
			}
		}
		if max > 0 && len(out) >= max {
			break
		}
	}
	return out
}

// Object returns a copy of the committed object id.
func (s *State) Object(id string) (*waldenv1.Object, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	o, ok := s.objects[id]
	if !ok {
		return nil, false
	}
	return clone(o), true
}

// indexStreamObjects rebuilds streamObjects from objects (after a restore):
// each stream's objects ordered by the start offset of their range.
func (s *State) indexStreamObjects() {
	s.streamObjects = map[uint64][]string{}
	type ref struct {
		id    string
		start uint64
	}
	refs := map[uint64][]ref{}
	for _, id := range sortedKeys(s.objects) {
		for _, r := range s.objects[id].GetRanges() {
			refs[r.GetStreamId()] = append(refs[r.GetStreamId()], ref{id, r.GetStartOffset()})
		}
	}
	for sid, rs := range refs {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].start < rs[j].start })
		for _, r := range rs {
			s.streamObjects[sid] = append(s.streamObjects[sid], r.id)
		}
	}
}
