package raftnode

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeMetrics are the Prometheus series of one raft node. They always exist
// (so the node never checks for nil); they are exported only when
// Config.Registerer is set.
type nodeMetrics struct {
	term               prometheus.Gauge
	leaderChanges      prometheus.Counter
	commitIndex        prometheus.Gauge
	appliedIndex       prometheus.Gauge
	proposalsCommitted prometheus.Counter
	proposalsFailed    prometheus.Counter
	proposalDuration   prometheus.Histogram
	snapshots          prometheus.Counter
	peerSendFailures   prometheus.Counter
	hasLeader          prometheus.Gauge
	readRounds         prometheus.Counter
	linearizableReads  prometheus.Counter
}

func newNodeMetrics(reg prometheus.Registerer) (*nodeMetrics, error) {
	m := &nodeMetrics{
		term: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "walden_raft_term", Help: "Current raft term of this member.",
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_leader_changes_total", Help: "Number of leader changes seen by this member.",
		}),
		commitIndex: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "walden_raft_commit_index", Help: "Highest log index known to be committed.",
		}),
		appliedIndex: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "walden_raft_applied_index", Help: "Highest log index applied to the state machine.",
		}),
		proposalsCommitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_proposals_committed_total", Help: "Proposals of this member that were committed and applied.",
		}),
		proposalsFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_proposals_failed_total", Help: "Proposals of this member that failed (no leader, dropped, timed out, stopped).",
		}),
		proposalDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "walden_raft_proposal_duration_seconds",
			Help:    "Time from proposal to applied result, for proposals of this member.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_snapshots_total", Help: "Snapshots taken of the state machine (followed by log compaction).",
		}),
		peerSendFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_peer_send_failures_total", Help: "Messages to peers the transport could not deliver.",
		}),
		hasLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "walden_raft_has_leader", Help: "1 while this member knows a leader, else 0.",
		}),
		readRounds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_read_index_rounds_total", Help: "ReadIndex rounds this member ran (each serves every linearizable read that waited for it).",
		}),
		linearizableReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_linearizable_reads_total", Help: "Linearizable reads served by this member's ReadIndex rounds.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	if err := registerAll(reg, m.collectors()...); err != nil {
		return nil, fmt.Errorf("raftnode: register metrics: %w", err)
	}
	return m, nil
}

func (m *nodeMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.term, m.leaderChanges, m.commitIndex, m.appliedIndex, m.proposalsCommitted,
		m.proposalsFailed, m.proposalDuration, m.snapshots, m.peerSendFailures, m.hasLeader, m.readRounds, m.linearizableReads}
}

// unregister removes the series from reg (NewNode failed after creating
// them).
func (m *nodeMetrics) unregister(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	for _, c := range m.collectors() {
		reg.Unregister(c)
	}
}

// TransportMetrics are the Prometheus series of a GRPCTransport. Create them
// with NewTransportMetrics; a nil *TransportMetrics records nothing.
// Undeliverable messages are also reported to the node, which counts them in
// walden_raft_peer_send_failures_total.
type TransportMetrics struct {
	framesSent     *prometheus.CounterVec
	framesReceived prometheus.Counter
	framesRefused  prometheus.Counter
	queueDrops     *prometheus.CounterVec
	reconnects     *prometheus.CounterVec
}

// NewTransportMetrics creates the transport series and registers them with
// reg (when reg is not nil):
//
//	walden_raft_transport_frames_sent_total{peer}
//	walden_raft_transport_frames_received_total
//	walden_raft_transport_frames_refused_total
//	walden_raft_transport_queue_drops_total{peer}
//	walden_raft_transport_reconnects_total{peer}
func NewTransportMetrics(reg prometheus.Registerer) (*TransportMetrics, error) {
	m := &TransportMetrics{
		framesSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_raft_transport_frames_sent_total", Help: "Raft frames written to a peer stream.",
		}, []string{"peer"}),
		framesReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_transport_frames_received_total", Help: "Raft frames received from peers and stepped into raft.",
		}),
		framesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_raft_transport_frames_refused_total", Help: "Raft frames refused (foreign cluster, bad frame).",
		}),
		queueDrops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_raft_transport_queue_drops_total", Help: "Messages dropped because a peer's send queue was full.",
		}, []string{"peer"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_raft_transport_reconnects_total", Help: "Stream (re)connection attempts to a peer.",
		}, []string{"peer"}),
	}
	if reg == nil {
		return m, nil
	}
	if err := registerAll(reg, m.framesSent, m.framesReceived, m.framesRefused, m.queueDrops, m.reconnects); err != nil {
		return nil, fmt.Errorf("raftnode: register transport metrics: %w", err)
	}
	return m, nil
}

// registerAll registers every collector, or none: on an error the ones
// already registered are unregistered again.
func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}

func (m *TransportMetrics) sent(peer string) {
	if m != nil {
		m.framesSent.WithLabelValues(peer).Inc()
	}
}

func (m *TransportMetrics) received() {
	if m != nil {
		m.framesReceived.Inc()
	}
}

func (m *TransportMetrics) refused() {
	if m != nil {
		m.framesRefused.Inc()
	}
}

func (m *TransportMetrics) dropped(peer string) {
	if m != nil {
		m.queueDrops.WithLabelValues(peer).Inc()
	}
}

func (m *TransportMetrics) reconnect(peer string) {
	if m != nil {
		m.reconnects.WithLabelValues(peer).Inc()
	}
}
