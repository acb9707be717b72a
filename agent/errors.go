package agent

import "errors"

// ErrNotRegistered is returned by Check before the cluster has answered the
// broker's registration: the broker has no epoch yet and must not
// acknowledge writes.
var ErrNotRegistered = errors.New("agent: broker not registered")

// ErrLeaseExpired is returned by Check when the lease could not be confirmed
// in time (lease_ttl minus the safety margin since the last renewal that
// succeeded was sent): the broker must stop acknowledging writes until a
// renewal succeeds again.
var ErrLeaseExpired = errors.New("agent: lease not confirmed")

// ErrFenced is returned by Check when the cluster refused the broker's epoch
// (NODE_FENCED or EPOCH_EXPIRED): the broker was failed over. The agent
// registers again and the broker gets a new epoch; it must re-read the epoch
// (Lease or OnEpochChange) and reopen its streams before it writes again.
var ErrFenced = errors.New("agent: broker fenced")

// ErrStopped is returned by WaitRegistered and Check once the agent has
// stopped.
var ErrStopped = errors.New("agent: stopped")

// ErrInvalidConfig wraps a configuration refused by New.
var ErrInvalidConfig = errors.New("agent: invalid configuration")

// ErrStart wraps a failure to bind the local endpoint or to join gossip.
var ErrStart = errors.New("agent: start")
