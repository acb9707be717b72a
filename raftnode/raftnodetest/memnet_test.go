package raftnodetest

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"walden/internal/testutil"
	"walden/raftnode"
)

// memPair is two members a and b on one network.
func memPair(t *testing.T, seed int64) (*Network, *MemTransport, *MemTransport, *RecordingHandler, *RecordingHandler) {
	t.Helper()
	nw := NewNetwork(seed)
	ta, tb := nw.Transport("a"), nw.Transport("b")
	ha, hb := NewRecordingHandler(), NewRecordingHandler()
	if err := ta.Start(ha); err != nil {
		t.Fatal(err)
	}
	if err := tb.Start(hb); err != nil {
		t.Fatal(err)
	}
	ta.AddPeer(raftnode.RaftID("b"), "")
	tb.AddPeer(raftnode.RaftID("a"), "")
	t.Cleanup(func() { _ = ta.Close(); _ = tb.Close() })
	return nw, ta, tb, ha, hb
}

func msgTo(to string, index uint64) *raftpb.Message {
	return &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(raftnode.RaftID("a")), To: new(raftnode.RaftID(to)), Index: new(index)}
}

func TestMemnetDeliversInOrderWithJitter(t *testing.T) {
	nw, ta, _, _, hb := memPair(t, 7)
	nw.Delay("a", "b", time.Millisecond, 3*time.Millisecond)
	for i := range 50 {
		ta.Send([]*raftpb.Message{msgTo("b", uint64(i))})
	}
	testutil.EventuallyTrue(t, 5*time.Second, "50 deliveries", func() bool { n, _, _ := hb.Counts(); return n == 50 })
	for i, idx := range hb.Indexes() {
		if idx != uint64(i) {
			t.Fatalf("delivery %d carried index %d: order broken", i, idx)
		}
	}
	if !ta.Reachable(raftnode.RaftID("b")) {
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
		testutil.EventuallyTrue(t, 5*time.Second, "deliveries to settle", func() bool {
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
	snap := &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: new(raftnode.RaftID("a")), To: new(raftnode.RaftID("b")),
		Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(5)), Term: new(uint64(1))}}}
	ta.Send([]*raftpb.Message{snap})
	testutil.EventuallyTrue(t, 5*time.Second, "unreachable and snapshot failure reports", func() bool {
		_, u, s := ha.Counts()
		return u[raftnode.RaftID("b")] == 2 && s[raft.SnapshotFailure] == 1
	})
	if n, _, _ := hb.Counts(); n != 0 {
		t.Fatalf("%d messages crossed the partition", n)
	}
	if ta.Reachable(raftnode.RaftID("b")) {
		t.Fatal("b reachable across a partition")
	}

	nw.Heal()
	nw.Isolate("b")
	tb.Send([]*raftpb.Message{{Type: raftpb.MsgAppResp.Enum(), From: new(raftnode.RaftID("b")), To: new(raftnode.RaftID("a"))}})
	testutil.EventuallyTrue(t, 5*time.Second, "unreachable report from isolated b", func() bool {
		_, u, _ := hb.Counts()
		return u[raftnode.RaftID("a")] == 1
	})

	nw.Heal()
	ta.Send([]*raftpb.Message{snap})
	testutil.EventuallyTrue(t, 5*time.Second, "snapshot delivered after heal", func() bool {
		n, _, _ := hb.Counts()
		_, _, s := ha.Counts()
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
	testutil.EventuallyTrue(t, 5*time.Second, "unreachable report for a down member", func() bool {
		_, u, _ := ha.Counts()
		return u[raftnode.RaftID("b")] == 1
	})
	// b comes back with a new transport: delivery resumes.
	tb2 := nw.Transport("b")
	hb2 := NewRecordingHandler()
	if err := tb2.Start(hb2); err != nil {
		t.Fatal(err)
	}
	defer tb2.Close()
	ta.Send([]*raftpb.Message{msgTo("b", 2)})
	testutil.EventuallyTrue(t, 5*time.Second, "delivery to the restarted member", func() bool { n, _, _ := hb2.Counts(); return n == 1 })

	ta.RemovePeer(raftnode.RaftID("b"))
	ta.Send([]*raftpb.Message{msgTo("b", 3)})
	testutil.EventuallyTrue(t, 5*time.Second, "unreachable report for a removed peer", func() bool {
		_, u, _ := ha.Counts()
		return u[raftnode.RaftID("b")] == 2
	})
	if n, _, _ := hb2.Counts(); n != 1 {
		t.Fatalf("removed peer received %d messages", n)
	}
}
