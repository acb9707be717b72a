package failover

import (
	"errors"
	"strings"
)

// Errors of a failover; test for them with errors.Is. Controller refusals
// come back as the named errors of package automq/protocol.
var (
	// ErrInvalidConfig means a Config value is unusable; the message names
	// the key.
	ErrInvalidConfig = errors.New("invalid AutoMQ failover config")
	// ErrInvalidRequest means the request itself is malformed.
	ErrInvalidRequest = errors.New("invalid failover request")
	// ErrWrongWAL means the WAL is not the node's: its header names another
	// node, or it was never written while the node has opening streams.
	// Nothing was done.
	ErrWrongWAL = errors.New("the WAL is not the node's")
	// ErrEpochTooOld means the node epoch to fail over is older than the
	// WAL's or the controller's: the node started again since. Nothing was
	// done.
	ErrEpochTooOld = errors.New("the node epoch is older than the node's")
	// ErrDataMayBeLost means streams were left opened because the WAL's
	// records do not continue them: offsets between the controller's end
	// offset and the WAL's first record are in neither S3 nor the WAL. The
	// rest of the failover was done; the WAL was not reset.
	ErrDataMayBeLost = errors.New("data may be lost")
	// ErrObjectExists means an object already exists under a key the
	// failover would write, with other bytes. It was not overwritten.
	ErrObjectExists = errors.New("an object with other bytes exists under the key")
	// ErrOffsetsMoved means the controller's end offsets of the node's
	// streams changed under the failover in a way no earlier run explains.
	// Nothing was committed twice.
	ErrOffsetsMoved = errors.New("the streams' end offsets moved")
	// ErrStopped is what an Observe function returns to stop a failover.
	ErrStopped = errors.New("failover stopped")
)

func joinLines(s []string) string { return strings.Join(s, "; ") }
