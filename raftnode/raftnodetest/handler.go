package raftnodetest

import (
	"context"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"walden/raftnode"
)

var _ raftnode.Handler = (*RecordingHandler)(nil)

// RecordingHandler is a raftnode.Handler that records what a transport
// hands to its node: the messages in order, the unreachable reports by peer,
// the snapshot reports by status and the removal reports by peer.
type RecordingHandler struct {
	mu          sync.Mutex
	received    []*raftpb.Message
	unreachable map[uint64]int
	snapshots   map[raft.SnapshotStatus]int
	removed     map[uint64]uint64
	refuse      error
}

// NewRecordingHandler returns an empty RecordingHandler.
func NewRecordingHandler() *RecordingHandler {
	return &RecordingHandler{unreachable: make(map[uint64]int), snapshots: make(map[raft.SnapshotStatus]int), removed: make(map[uint64]uint64)}
}

// Refuse makes Process refuse every later message with err (nil accepts
// them again).
func (h *RecordingHandler) Refuse(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refuse = err
}

// Process records m, or refuses it (Refuse).
func (h *RecordingHandler) Process(_ context.Context, m *raftpb.Message) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refuse != nil {
		return h.refuse
	}
	h.received = append(h.received, m)
	return nil
}

// ReportRemoved records that peer id refused this member's messages for
// its removal at index.
func (h *RecordingHandler) ReportRemoved(id, index uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removed[id] = index
}

// Removed returns a copy of the removal reports: the removal index by peer.
func (h *RecordingHandler) Removed() map[uint64]uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[uint64]uint64, len(h.removed))
	for k, v := range h.removed {
		out[k] = v
	}
	return out
}

// ReportUnreachable counts an unreachable report for id.
func (h *RecordingHandler) ReportUnreachable(id uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unreachable[id]++
}

// ReportSnapshot counts a snapshot report by status.
func (h *RecordingHandler) ReportSnapshot(_ uint64, status raft.SnapshotStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.snapshots[status]++
}

// Counts returns the number of messages received and copies of the
// unreachable and snapshot counts.
func (h *RecordingHandler) Counts() (received int, unreachable map[uint64]int, snaps map[raft.SnapshotStatus]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	u := make(map[uint64]int)
	for k, v := range h.unreachable {
		u[k] = v
	}
	s := make(map[raft.SnapshotStatus]int)
	for k, v := range h.snapshots {
		s[k] = v
	}
	return len(h.received), u, s
}

// Indexes returns the index of every message received, in order.
func (h *RecordingHandler) Indexes() []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]uint64, len(h.received))
	for i, m := range h.received {
		out[i] = m.GetIndex()
	}
	return out
}
