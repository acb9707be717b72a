package broker

import "errors"

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
)

// ErrInvalidConfig wraps a configuration refused by New.
var ErrInvalidConfig = errors.New("broker: invalid configuration")

// ErrStart wraps a failure to bind the API, open the WAL or reach S3.
var ErrStart = errors.New("broker: start")

// ErrFenced means the cluster refused the broker's epoch (NODE_FENCED or
// EPOCH_EXPIRED): the broker stops acknowledging writes until it has
// registered again and recovered.
var ErrFenced = errors.New("broker: fenced")

// ErrNoCoordinator means no coordinator answered a catalog call.
var ErrNoCoordinator = errors.New("broker: no coordinator answered")
