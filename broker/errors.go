package broker

import "errors"

// Refusal reasons of the data API (google.rpc.ErrorInfo reason, domain
// "walden"). NOT_OWNER and NODE_FENCED are package fencing's reasons.
const (
	// ReasonNotOwner: the broker does not own the stream; ErrorInfo
	// metadata "owner_addr" names the owner's address when known.
	ReasonNotOwner = "NOT_OWNER"
	// ReasonLeaseInvalid: the agent does not confirm the lease now.
	ReasonLeaseInvalid = "LEASE_INVALID"
	// ReasonNodeFenced: the cluster failed the broker over.
	ReasonNodeFenced = "NODE_FENCED"
	// ReasonNotReady: the broker is registering or recovering.
	ReasonNotReady = "NOT_READY"
	// ReasonShuttingDown: the broker is stopping.
	ReasonShuttingDown = "SHUTTING_DOWN"
	// ReasonWALFull: the WAL has no room until the next upload trims it.
	ReasonWALFull = "WAL_FULL"
	// ReasonOutOfOrderSequence: an idempotent append whose sequence is
	// neither its producer's next one nor a retry of its last batch;
	// ErrorInfo metadata "expected_sequence" holds the next one.
	ReasonOutOfOrderSequence = "OUT_OF_ORDER_SEQUENCE"
	// ReasonUnknownProducer: an idempotent append with a sequence other
	// than 0 from a producer the stream does not know (never seen, or
	// forgotten beyond producer.MaxPerStream); the producer starts again
	// with a new producer id.
	ReasonUnknownProducer = "UNKNOWN_PRODUCER"

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
