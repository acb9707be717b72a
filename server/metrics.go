package server

import (
	"context"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"walden/fsm"
	"walden/metrics"
	"walden/objstore"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// memberMetrics are the series of this member that explain failovers (see
// package metrics), next to the raft, transport and gRPC ones.
type memberMetrics struct {
	recovery  *metrics.Recovery
	failovers *metrics.FailoverWatcher
}

// registerAllCollectors registers cs with reg.
func registerAllCollectors(reg prometheus.Registerer, cs []prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// newMemberMetrics creates the recovery series and the failover watcher and
// registers them with reg.
func newMemberMetrics(reg prometheus.Registerer, state *fsm.State, ready func() bool) (*memberMetrics, error) {
	m := &memberMetrics{recovery: metrics.NewRecovery(), failovers: metrics.NewFailoverWatcher(state, ready)}
	for _, c := range append(m.recovery.Collectors(), m.failovers.Collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// registerClusterCollector exports the state, raft, gossip and policy
// gauges of this member.
func registerClusterCollector(reg prometheus.Registerer, nodeID string, state *fsm.State, node ClusterNode, det *detector) error {
	src := metrics.ClusterSource{
		NodeID:  nodeID,
		Brokers: state.Brokers,
		Jobs:    func() []*waldenv1.Job { return state.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED) },
		Raft: func() metrics.RaftView {
			st := node.Status()
			v := metrics.RaftView{Leader: st.LeaderID != "" && st.LeaderID == st.NodeID}
			for _, m := range st.Members {
				if m.GetMemberRole() == waldenv1.MemberRole_MEMBER_ROLE_LEARNER {
					continue
				}
				v.Voters++
				if m.GetReachable() || m.GetId() == st.NodeID {
					v.Reachable++
				}
			}
			return v
		},
		// The policy: section of this member's file: members whose files
		// differ have configuration drift.
		Policy: func() *waldenv1.Policy { return det.d.config },
	}
	if det.pool != nil {
		pool := det.pool
		src.Gossip = func() []metrics.GossipMember {
			var out []metrics.GossipMember
			for _, m := range pool.Members() { // itself included
				out = append(out, metrics.GossipMember{Role: string(m.Meta.Role), State: m.State.String()})
			}
			return out
		}
	}
	return reg.Register(metrics.NewClusterCollector(src))
}

// meteredStore counts the bytes the recovery uploads.
type meteredStore struct {
	recovery.Store
	m *metrics.Recovery
}

func (s meteredStore) Upload(ctx context.Context, key string, body io.Reader, size int64, progress func(done int64)) (objstore.UploadResult, error) {
	res, err := s.Store.Upload(ctx, key, body, size, progress)
	if err == nil {
		s.m.Uploaded(res.Size)
	}
	return res, err
}

func (s meteredStore) UploadAt(ctx context.Context, key string, body io.ReaderAt, size int64, progress func(done int64)) (objstore.UploadResult, error) {
	res, err := s.Store.UploadAt(ctx, key, body, size, progress)
	if err == nil {
		s.m.Uploaded(res.Size)
	}
	return res, err
}
