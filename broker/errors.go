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

	// MetaOwnerAddr is the ErrorInfo metadata key of the owner's address.
	MetaOwnerAddr = "owner_addr"
	// MetaOwnerBrokerID is the ErrorInfo metadata key of the owner's id.
	MetaOwnerBrokerID = "owner_broker_id"
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

// ErrCorruptFrame means a batch payload does not hold well-framed records.
var ErrCorruptFrame = errors.New("broker: malformed record framing")
