package agent

import (
	"errors"
	"math"
	"os"

	waldenv1 "walden/proto/walden/v1"
	"walden/wal"
)

// automqNode is the AutoMQ node the registration reports: the configured
// node id and the node epoch in the WAL header, read read-only (nil for a
// broker that is not AutoMQ's). The epoch is 0 when the WAL has no valid
// header yet (a broker that never started) or names another node, which is
// logged: its failover would refuse that WAL.
func (a *Agent) automqNode() *waldenv1.AutomqNode {
	if !a.cfg.Automq.Configured() {
		return nil
	}
	id := *a.cfg.Automq.NodeID
	n := &waldenv1.AutomqNode{NodeId: id}
	h, _, err := wal.ReadHeader(a.cfg.WAL.Path)
	switch {
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, wal.ErrNotWAL):
		a.log.Info("the broker's WAL has no header yet: reporting its AutoMQ node without an epoch", "wal", a.cfg.WAL.Path, "node_id", id)
	case err != nil:
		a.log.Warn("cannot read the broker's WAL header: reporting its AutoMQ node without an epoch", "wal", a.cfg.WAL.Path, "node_id", id, "err", err)
	case int64(h.NodeID) != int64(id):
		a.log.Error("the broker's WAL belongs to another AutoMQ node: its failover would refuse it; check automq.node_id and wal.path",
			"wal", a.cfg.WAL.Path, "node_id", id, "wal_node_id", h.NodeID)
	case h.NodeEpoch > math.MaxInt64:
		a.log.Warn("the node epoch in the broker's WAL header is out of range", "wal", a.cfg.WAL.Path, "node_epoch", h.NodeEpoch)
	default:
		n.NodeEpoch = int64(h.NodeEpoch)
	}
	return n
}
