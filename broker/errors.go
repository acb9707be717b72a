package broker

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrorInfo metadata keys of the data API's refusals (the reasons are
// package refusal's: NOT_OWNER, LEASE_INVALID, NODE_FENCED, NOT_READY,
// SHUTTING_DOWN, WAL_FULL, OUT_OF_ORDER_SEQUENCE, UNKNOWN_PRODUCER).
const (
	// MetaOwnerAddr is the ErrorInfo metadata key of the owner's address.
	MetaOwnerAddr = "owner_addr"
	// MetaOwnerBrokerID is the ErrorInfo metadata key of the owner's id.
	MetaOwnerBrokerID = "owner_broker_id"
	// MetaExpectedSequence is the ErrorInfo metadata key of the sequence
	// an out-of-order producer should send next.
	MetaExpectedSequence = "expected_sequence"
	// The ErrorInfo metadata keys of OBJECT_MISSING: the committed range
	// no object backs and its object.
	MetaStreamID    = "stream_id"
	MetaStartOffset = "start_offset"
	MetaEndOffset   = "end_offset"
	MetaObjectID    = "object_id"
	MetaKey         = "key"
)

// ErrInvalidConfig wraps a configuration refused by New.
var ErrInvalidConfig = errors.New("broker: invalid configuration")

// ErrStart wraps a failure to bind the API, open the WAL or reach S3.
var ErrStart = errors.New("broker: start")

// ErrFenced means the cluster refused the broker's epoch (NODE_FENCED or
// EPOCH_EXPIRED): the broker stops acknowledging writes until it has
// registered again and recovered.
var ErrFenced = errors.New("broker: fenced")

// ErrObjectMissing means a read reached a committed range that no object in
// the object store backs (matched by *UnbackedRangeError).
var ErrObjectMissing = errors.New("broker: committed records are in no object of the object store")

// UnbackedRangeError names a committed range of a stream that no object in
// the object store backs: the object the catalog names is not there, or
// the catalog's objects leave a hole (ObjectID empty).
type UnbackedRangeError struct {
	StreamID   uint64
	Start, End uint64
	ObjectID   string
	Key        string
}

func (e *UnbackedRangeError) Error() string {
	if e.ObjectID == "" {
		return fmt.Sprintf("stream %d: offsets [%d, %d) are committed in no object (the catalog's objects leave a hole)", e.StreamID, e.Start, e.End)
	}
	return fmt.Sprintf("stream %d: offsets [%d, %d) are committed in object %s (key %s), which the object store does not hold",
		e.StreamID, e.Start, e.End, e.ObjectID, e.Key)
}

// Is makes errors.Is(err, ErrObjectMissing) true.
func (e *UnbackedRangeError) Is(target error) bool { return target == ErrObjectMissing }

// Metadata is the ErrorInfo metadata of the OBJECT_MISSING refusal.
func (e *UnbackedRangeError) Metadata() map[string]string {
	return map[string]string{MetaStreamID: strconv.FormatUint(e.StreamID, 10), MetaStartOffset: strconv.FormatUint(e.Start, 10),
		MetaEndOffset: strconv.FormatUint(e.End, 10), MetaObjectID: e.ObjectID, MetaKey: e.Key}
}

// ErrNoCoordinator means no coordinator answered a catalog call.
var ErrNoCoordinator = errors.New("broker: no coordinator answered")
