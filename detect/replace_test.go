package detect

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"walden/lease"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// TestReplacementUnderTheSameNameWaitsOutTheOldGrant (issue 21, finding
// 2), with the real state machine, grantor, observer and holder: the
// cluster runs with lease_ttl 10s; c3 grants b1's lease, then c3 is
// replaced under its name by a member with an empty data dir whose config
// file says lease_ttl 3s, and an operator requests b1's failover. The new
// c3 must not attest before the old c3's grant is over at the agent, else a
// majority of attestations (c2, new c3) coexists with a majority of live
// grants (c1, old c3) and the WAL is read while the broker acknowledges.
func TestReplacementUnderTheSameNameWaitsOutTheOldGrant(t *testing.T) {
	p := policy.Defaults()
	p.LeaseTtlMs, p.FailureTimeoutMs = 10_000, 15_000
	st := newClusterState(t, p)
	epoch := st.register(t, "b1")
	clk := &lease.ManualClock{T: time.Hour}
	agentClock := func() time.Duration { return clk.T } // rates equal: the worst case is the margin alone
	holder := lease.NewHolder(0)
	holder.SetEpoch(epoch)

	grantors := map[string]*lease.Grantor{}
	for _, id := range []string{"c1", "c2", "c3"} {
		g, err := lease.NewGrantor(clk, &lease.MemStore{}, 10*time.Second, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		grantors[id] = g
	}
	clk.Advance(11 * time.Second) // past every quiet period
	grant := func(id string, g *lease.Grantor) bool {
		sent := agentClock()
		resp, err := Grant(st.st, g, id, "b1", epoch)
		if err != nil {
			return false
		}
		v := lease.Voters{Index: resp.GetConfIndex()}
		for _, m := range resp.GetVoters() {
			v.IDs = append(v.IDs, m.GetId())
			v.Incarnations = append(v.Incarnations, m.GetIncarnation())
		}
		holder.Granted(lease.Grant{Coordinator: id, Epoch: epoch, Sent: sent, TTL: time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond}, v)
		return true
	}
	for _, id := range []string{"c1", "c3"} {
		if !grant(id, grantors[id]) {
			t.Fatalf("%s did not grant", id)
		}
	}
	oldGrantEnd := agentClock() + 10*time.Second
	if ok, _ := holder.Valid(agentClock()); !ok {
		t.Fatal("the lease is not valid on c1's and c3's grants")
	}

	// c3 is removed and added again under its name (raft id 3 in this
	// state), and starts with an empty data dir a second later.
	clk.Advance(time.Second)
	for _, cc := range []*raftpb.ConfChangeV2{
		{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(uint64(3))}}},
		{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(uint64(3))}}},
		{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(uint64(3))}}},
	} {
		st.mu.Lock()
		st.index++
		err := st.st.ApplyConfChange(st.index, cc, &waldenv1.ConfChangeContext{Member: &waldenv1.MemberContext{Id: "c3"}}, nil)
		st.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	// c1 renews and names the new configuration: the former c3's grant,
	// still running, is not the new c3's, and c1's alone is no majority.
	grant("c1", grantors["c1"])
	if _, ok := holder.Live(agentClock())["c3"]; ok {
		t.Fatal("the agent counts the former c3's grant as the new c3's")
	}
	if ok, _ := holder.Valid(agentClock()); ok {
		t.Fatalf("valid on c1's grant and the former c3's: %v", holder.Live(agentClock()))
	}
	newC3, err := lease.NewGrantor(clk, &lease.MemStore{}, 3*time.Second, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	o := NewObserver(ObserverConfig{NodeID: "c3", Grantor: newC3, Clock: clk}, st, st.propose, &switchProber{})
	st.must(t, &waldenv1.Command{Op: &waldenv1.Command_RequestFailover{RequestFailover: &waldenv1.RequestFailover{BrokerId: "b1", Epoch: epoch}}})

	var attestedAt time.Duration
	for attestedAt == 0 && clk.T < time.Hour+40*time.Second {
		clk.Advance(100 * time.Millisecond)
		grant("c1", grantors["c1"]) // refused once the failover was requested
		o.Round(context.Background())
		if mine(st.broker("b1"), "c3").GetLeaseExpired() {
			attestedAt = agentClock()
		}
	}
	if attestedAt == 0 {
		t.Fatal("the new c3 never attested")
	}
	if attestedAt <= oldGrantEnd {
		t.Fatalf("the new c3 attested at %s, while the old c3's grant ran at the agent until %s",
			attestedAt-time.Hour, oldGrantEnd-time.Hour)
	}
}
