package server

import (
	"context"
	"github.com/prometheus/client_golang/prometheus"
	"log/slog"
	"time"

	"walden/detect"
	"walden/fsm"
	"walden/lease"
	"walden/metrics"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// brokerState is what the Agent and Brokers services read from the
// replicated state (*fsm.State).
type brokerState interface {
	Broker(id string) (*waldenv1.Broker, bool)
	Brokers() []*waldenv1.Broker
	CheckBroker(brokerID string, epoch uint64, fo *waldenv1.FailoverContext) error
	Events(brokerID string, limit int) []*waldenv1.Event
	PolicyOverrides() *waldenv1.PolicyOverrides
	// Policy is the cluster's effective policy and whether it is seeded.
	Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool)
	// Voters are the voting members' ids; ConfIndex the index of their
	// configuration.
	Voters() []string
	ConfIndex() uint64
	Members() []*waldenv1.Member
	// Changed is closed at the next apply that changes anything.
	Changed() <-chan struct{}
	// Renewal is the read a lease grant makes (detect.Grant).
	Renewal(broker string, epoch uint64) (fsm.Renewal, error)
}

// serviceDeps is what the services share: this member's raft node and
// replicated state, its side of the quorum leases and its decider, the
// config's policy, and the forwarding helpers of the Cluster service.
type serviceDeps struct {
	admin   *adminService
	node    *raftnode.Node
	state   brokerState
	grantor *lease.Grantor
	// slots are this member's renewal slots (renewals.slot): every grant
	// asks its agent to renew on one of them.
	slots *lease.Slots
	// decider is this member's decision loop (its holds, while it leads).
	decider *detect.Decider
	// decisions counts the lease renewals answered (and the decider's
	// decisions); nil counts nothing.
	decisions *metrics.Decisions
	config    *waldenv1.Policy // the policy: section of this member's config
	// driftKeys is the number of keys on which config differs from the
	// cluster's policy (walden_policy_config_drift_keys).
	driftKeys   prometheus.Gauge
	clusterName string
	nodeID      string
	logger      *slog.Logger
	// proposeTimeout bounds a proposal made for an API call without a
	// deadline of its own.
	proposeTimeout time.Duration
	// adminMaxConns is limits.admin.max_conns: every agent keeps a
	// connection to this member (warnAgentConnections).
	adminMaxConns int
}

// policy returns the cluster's effective policy (replicated: the same on
// every member that applied the same entries).
func (d *serviceDeps) policy() *waldenv1.Policy {
	p, _, _ := d.state.Policy()
	return p
}

// isLeader reports whether this member leads, with its status.
func (d *serviceDeps) isLeader() (bool, raftnode.Status) {
	st := d.node.Status()
	return st.LeaderID != "" && st.LeaderID == st.NodeID, st
}

func (d *serviceDeps) propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.proposeTimeout)
		defer cancel()
	}
	return d.node.Propose(ctx, cmd)
}
