package raftnode

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	waldenv1 "walden/proto/walden/v1"
)

// Config configures a Node. Zero durations and counts take the defaults of
// DefaultConfig.
type Config struct {
	// ClusterName names the cluster; it is recorded in storage and checked
	// on every transport frame.
	ClusterName string
	// NodeID is this member's id, e.g. "c1".
	NodeID string
	// Version is the walden release this member runs, reported with it in
	// Status (optional).
	Version string
	// InitialCluster lists the founding members. It is used only when the
	// storage is empty: a member listed in it bootstraps the cluster with
	// these members; a member not listed joins an existing cluster (it must
	// have been added with AddMember first) and learns the membership from
	// the leader.
	InitialCluster []*waldenv1.MemberContext
	// TickInterval is the raft logical clock period (default 100ms).
	TickInterval time.Duration
	// ElectionTicks is the election timeout in ticks (default 10).
	ElectionTicks int
	// HeartbeatTicks is the heartbeat interval in ticks (default 1).
	HeartbeatTicks int
	// SnapshotCount: snapshot the state machine and compact the log every
	// SnapshotCount applied entries (default 10000).
	SnapshotCount uint64
	// SnapshotCatchUpEntries entries are kept behind a snapshot so that a
	// slightly slow follower catches up from the log, not a snapshot
	// (default 5000).
	SnapshotCatchUpEntries uint64
	// MaxSizePerMsg limits the bytes of entries in one append message
	// (default 1 MiB).
	MaxSizePerMsg uint64
	// MaxInflightMsgs limits the append messages in flight per follower
	// (default 256).
	MaxInflightMsgs int
	// DataDir is the member's data directory, named in the messages of the
	// faults that stop the member (default: the storage's Path, when it has
	// one).
	DataDir string
	// Logger receives the node's and raft's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer exports the walden_raft_* metrics; nil: not registered.
	Registerer prometheus.Registerer
	// PrepareProposal, when set, completes each command this member
	// proposes (its own copy, with request_id, proposer_id and
	// proposed_unix_ms set) just before it is encoded into the entry. The
	// node does not look into commands; the state machine's package says
	// what to add (fsm.PrepareProposal).
	PrepareProposal func(*waldenv1.Command)
	// VoterChangeWait, when set, spaces voter changes (a promotion, the
	// removal of a voter): the leader refuses one (ErrVoterChangeTooSoon)
	// until VoterChangeWait() has passed since it applied the previous one,
	// or since it started. The server passes the cluster's lease horizon,
	// the longest lease_ttl + drift_margin it ever used, so that no lease
	// granted under the configuration before a change is live when the
	// next one comes (docs/safety.md). Membership changes are then made on
	// the leader only (ErrNotLeader elsewhere), and the leader drops those
	// forwarded to it through raft, which it could not check.
	VoterChangeWait func() time.Duration
}

// DefaultConfig returns a Config with every default set; callers fill in
// ClusterName, NodeID and InitialCluster.
func DefaultConfig() Config {
	return Config{
		TickInterval:           100 * time.Millisecond,
		ElectionTicks:          10,
		HeartbeatTicks:         1,
		SnapshotCount:          10000,
		SnapshotCatchUpEntries: 5000,
		MaxSizePerMsg:          1 << 20,
		MaxInflightMsgs:        256,
	}
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.TickInterval == 0 {
		c.TickInterval = d.TickInterval
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = d.ElectionTicks
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = d.HeartbeatTicks
	}
	if c.SnapshotCount == 0 {
		c.SnapshotCount = d.SnapshotCount
	}
	if c.SnapshotCatchUpEntries == 0 {
		c.SnapshotCatchUpEntries = d.SnapshotCatchUpEntries
	}
	if c.MaxSizePerMsg == 0 {
		c.MaxSizePerMsg = d.MaxSizePerMsg
	}
	if c.MaxInflightMsgs == 0 {
		c.MaxInflightMsgs = d.MaxInflightMsgs
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first unusable setting, naming it. Zero values are
// valid (they take defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.ClusterName == "":
		return fmt.Errorf("%w: cluster_name is empty", ErrInvalidConfig)
	case c.NodeID == "":
		return fmt.Errorf("%w: node_id is empty", ErrInvalidConfig)
	case c.TickInterval < time.Millisecond:
		return fmt.Errorf("%w: tick_interval %s is below 1ms", ErrInvalidConfig, c.TickInterval)
	case c.HeartbeatTicks < 1:
		return fmt.Errorf("%w: heartbeat_ticks %d must be at least 1", ErrInvalidConfig, c.HeartbeatTicks)
	case c.ElectionTicks <= c.HeartbeatTicks:
		return fmt.Errorf("%w: election_ticks %d must exceed heartbeat_ticks %d", ErrInvalidConfig, c.ElectionTicks, c.HeartbeatTicks)
	case c.MaxInflightMsgs < 1:
		return fmt.Errorf("%w: max_inflight_msgs %d must be at least 1", ErrInvalidConfig, c.MaxInflightMsgs)
	}
	seen := make(map[string]bool)
	for i, m := range c.InitialCluster {
		switch {
		case m == nil || m.GetId() == "":
			return fmt.Errorf("%w: initial_cluster[%d].id is empty", ErrInvalidConfig, i)
		case m.GetRaftAddr() == "":
			return fmt.Errorf("%w: initial_cluster[%d].raft (member %q) is empty", ErrInvalidConfig, i, m.GetId())
		case seen[m.GetId()]:
			return fmt.Errorf("%w: initial_cluster[%d].id %q is listed twice", ErrInvalidConfig, i, m.GetId())
		}
		seen[m.GetId()] = true
	}
	return nil
}
