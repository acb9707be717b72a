package raftnode

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// recordingHandler records what a transport hands to its node.
type recordingHandler struct {
	mu          sync.Mutex
	received    []*raftpb.Message
	unreachable map[uint64]int
	snapshots   map[raft.SnapshotStatus]int
}

func newRecordingHandler() *recordingHandler {
	return &recordingHandler{unreachable: make(map[uint64]int), snapshots: make(map[raft.SnapshotStatus]int)}
}

func (h *recordingHandler) Process(_ context.Context, m *raftpb.Message) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.received = append(h.received, m)
	return nil
}

func (h *recordingHandler) ReportUnreachable(id uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unreachable[id]++
}

func (h *recordingHandler) ReportSnapshot(_ uint64, status raft.SnapshotStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.snapshots[status]++
}

func (h *recordingHandler) counts() (received int, unreachable map[uint64]int, snaps map[raft.SnapshotStatus]int) {
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

func (h *recordingHandler) indexes() []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]uint64, len(h.received))
	for i, m := range h.received {
		out[i] = m.GetIndex()
	}
	return out
}

// memPair is two members a and b on one network.
func memPair(t *testing.T, seed int64) (*Network, *MemTransport, *MemTransport, *recordingHandler, *recordingHandler) {
	t.Helper()
	nw := NewNetwork(seed)
	ta, tb := nw.Transport("a"), nw.Transport("b")
	ha, hb := newRecordingHandler(), newRecordingHandler()
	if err := ta.Start(ha); err != nil {
		t.Fatal(err)
	}
	if err := tb.Start(hb); err != nil {
		t.Fatal(err)
	}
	ta.AddPeer(RaftID("b"), "")
	tb.AddPeer(RaftID("a"), "")
	t.Cleanup(func() { _ = ta.Close(); _ = tb.Close() })
	return nw, ta, tb, ha, hb
}

func msgTo(to string, index uint64) *raftpb.Message {
	return &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(RaftID("a")), To: new(RaftID(to)), Index: new(index)}
}

func TestMemnetDeliversInOrderWithJitter(t *testing.T) {
	nw, ta, _, _, hb := memPair(t, 7)
	nw.Delay("a", "b", time.Millisecond, 3*time.Millisecond)
	for i := range 50 {
		ta.Send([]*raftpb.Message{msgTo("b", uint64(i))})
	}
	waitFor(t, 5*time.Second, "50 deliveries", func() bool { n, _, _ := hb.counts(); return n == 50 })
	for i, idx := range hb.indexes() {
		if idx != uint64(i) {
			t.Fatalf("delivery %d carried index %d: order broken", i, idx)
		}
	}
	if !ta.Reachable(RaftID("b")) {
		t.Fatal("b unreachable after deliveries")
	}
}

func TestMemnetDropIsSeededAndPartial(t *testing.T) {
	run := func() int {
		nw, ta, _, _, _ := memPair(t, 99)
		nw.Drop("a", "*", 0.5)
		for i := range 200 {
			ta.Send([]*raftpb.Message{msgTo("b", uint64(i))})
		}
		var got int
		waitFor(t, 5*time.Second, "deliveries to settle", func() bool {
			d, dropped := nw.Counts()
			got = d
			return d+dropped == 200
		})
		return got
	}
	first, second := run(), run()
	if first == 0 || first == 200 {
		t.Fatalf("50%% drop delivered %d of 200", first)
	}
	if first != second {
		t.Fatalf("same seed delivered %d then %d", first, second)
	}
}

func TestMemnetPartitionIsolateHeal(t *testing.T) {
	nw, ta, tb, ha, hb := memPair(t, 1)
	nw.Partition([]string{"a"}, []string{"b"})
	ta.Send([]*raftpb.Message{msgTo("b", 1)})
	snap := &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: new(RaftID("a")), To: new(RaftID("b")),
		Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(5)), Term: new(uint64(1))}}}
	ta.Send([]*raftpb.Message{snap})
	waitFor(t, 5*time.Second, "unreachable and snapshot failure reports", func() bool {
		_, u, s := ha.counts()
		return u[RaftID("b")] == 2 && s[raft.SnapshotFailure] == 1
	})
	if n, _, _ := hb.counts(); n != 0 {
		t.Fatalf("%d messages crossed the partition", n)
	}
	if ta.Reachable(RaftID("b")) {
		t.Fatal("b reachable across a partition")
	}

	nw.Heal()
	nw.Isolate("b")
	tb.Send([]*raftpb.Message{{Type: raftpb.MsgAppResp.Enum(), From: new(RaftID("b")), To: new(RaftID("a"))}})
	waitFor(t, 5*time.Second, "unreachable report from isolated b", func() bool {
		_, u, _ := hb.counts()
		return u[RaftID("a")] == 1
	})

	nw.Heal()
	ta.Send([]*raftpb.Message{snap})
	waitFor(t, 5*time.Second, "snapshot delivered after heal", func() bool {
		n, _, _ := hb.counts()
		_, _, s := ha.counts()
		return n == 1 && s[raft.SnapshotFinish] == 1
	})
	if nw.SnapshotsReceived("b") != 1 {
		t.Fatalf("SnapshotsReceived(b) = %d", nw.SnapshotsReceived("b"))
	}
}

func TestMemnetDownMemberAndRemovedPeer(t *testing.T) {
	nw, ta, tb, ha, _ := memPair(t, 1)
	_ = tb.Close() // b is down
	ta.Send([]*raftpb.Message{msgTo("b", 1)})
	waitFor(t, 5*time.Second, "unreachable report for a down member", func() bool {
		_, u, _ := ha.counts()
		return u[RaftID("b")] == 1
	})
	// b comes back with a new transport: delivery resumes.
	tb2 := nw.Transport("b")
	hb2 := newRecordingHandler()
	if err := tb2.Start(hb2); err != nil {
		t.Fatal(err)
	}
	defer tb2.Close()
	ta.Send([]*raftpb.Message{msgTo("b", 2)})
	waitFor(t, 5*time.Second, "delivery to the restarted member", func() bool { n, _, _ := hb2.counts(); return n == 1 })

	ta.RemovePeer(RaftID("b"))
	ta.Send([]*raftpb.Message{msgTo("b", 3)})
	waitFor(t, 5*time.Second, "unreachable report for a removed peer", func() bool {
		_, u, _ := ha.counts()
		return u[RaftID("b")] == 2
	})
	if n, _, _ := hb2.counts(); n != 1 {
		t.Fatalf("removed peer received %d messages", n)
	}
}
