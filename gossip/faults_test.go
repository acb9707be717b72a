package gossip

import (
	"fmt"
	"math"
	"testing"
	"time"

	"walden/internal/testutil"
)

func TestFaultsDecide(t *testing.T) {
	f := NewFaults(1)
	if drop, delay := f.packet("127.0.0.1:1"); drop || delay != 0 {
		t.Fatalf("no fault set: drop %v delay %v", drop, delay)
	}
	f.Set("127.0.0.1:1", LinkFault{Drop: 0.2, Delay: 10 * time.Millisecond, Jitter: 5 * time.Millisecond})
	const n = 20000
	drops := 0
	for range n {
		drop, delay := f.packet("127.0.0.1:1")
		if drop {
			drops++
			continue
		}
		if delay < 10*time.Millisecond || delay > 15*time.Millisecond {
			t.Fatalf("delay %v outside [10ms, 15ms]", delay)
		}
	}
	if share := float64(drops) / n; math.Abs(share-0.2) > 0.02 {
		t.Errorf("dropped %.3f of packets, want about 0.2", share)
	}
	if s := f.Stats(); s.PacketsDropped != uint64(drops) || s.PacketsDelayed != uint64(n-drops) {
		t.Errorf("stats %+v, want %d dropped and %d delayed", s, drops, n-drops)
	}
	if f.streamBlocked("127.0.0.1:1") {
		t.Error("streams blocked without BlockStreams")
	}

	// A link's own fault wins over AllLinks; other links get AllLinks.
	f.Set(AllLinks, Cut())
	if drop, _ := f.packet("127.0.0.1:2"); !drop || !f.streamBlocked("127.0.0.1:2") {
		t.Error("AllLinks cut does not apply to another link")
	}
	if f.streamBlocked("127.0.0.1:1") {
		t.Error("AllLinks overrode the link's own fault")
	}
	f.Clear("127.0.0.1:1")
	if !f.streamBlocked("127.0.0.1:1") {
		t.Error("after Clear, AllLinks does not apply")
	}
	f.ClearAll()
	if drop, delay := f.packet("127.0.0.1:2"); drop || delay != 0 || f.streamBlocked("127.0.0.1:2") {
		t.Error("ClearAll left a fault")
	}
}

// TestCutLinkIsBridgedByIndirectProbes cuts the link between a coordinator
// and an agent in both directions: the other member relays the probes, so
// the agent is never declared dead. Cutting the agent off from everyone then
// gets it declared dead, which shows that the quiet window was long enough.
func TestCutLinkIsBridgedByIndirectProbes(t *testing.T) {
	h := newHarness(t)
	faults := map[string]*Faults{}
	pools, want := threePools(t, h, func(c *Config) {
		c.ProbeInterval = 200 * time.Millisecond
		c.ProbeTimeout = 100 * time.Millisecond
		c.Faults = NewFaults(uint64(len(faults) + 1))
		faults[c.NodeName] = c.Faults
	})
	for _, p := range pools {
		testutil.Eventually(t, 10*time.Second, "cluster formed", func() error { return seesAlive(p, want) })
	}
	coord, agent := pools[0], pools[1]
	events := collect(coord)

	faults["coordinator/c1"].Set(agent.Addr(), Cut())
	faults["agent/b1"].Set(coord.Addr(), Cut())
	// Detection takes about probe_interval + suspicion_mult*probe_interval
	// (800ms); watch for many times that.
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		if ev, ok := events.find(func(ev Event) bool { return ev.Kind == EventLeave && ev.Node == "agent/b1" }); ok {
			t.Fatalf("false failure with one link cut: %+v", ev)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m := aliveSet(coord); m["agent/b1"].State != StateAlive {
		t.Fatalf("coordinator sees the cut-off agent as %+v", m["agent/b1"])
	}
	if s := faults["coordinator/c1"].Stats(); s.PacketsDropped == 0 {
		t.Fatalf("the cut dropped nothing: %+v", s)
	}

	// Now the agent is cut off from everyone: a real failure, seen by both.
	faults["agent/b1"].Set(AllLinks, Cut())
	faults["agent/b2"].Set(agent.Addr(), Cut())
	testutil.Eventually(t, 20*time.Second, "isolated agent declared dead", func() error {
		ev, ok := events.find(func(ev Event) bool { return ev.Kind == EventLeave && ev.Node == "agent/b1" })
		if !ok {
			return fmt.Errorf("no leave event")
		}
		if ev.State != StateDead {
			return fmt.Errorf("leave event %+v", ev)
		}
		return nil
	})
}

func TestDelayShowsInProbeRTT(t *testing.T) {
	h := newHarness(t)
	slow := func(c *Config) {
		c.ProbeInterval = 200 * time.Millisecond
		c.ProbeTimeout = 150 * time.Millisecond
	}
	ca := fastConfig(t, "demo", "coordinator/c1", coordMeta("c1"), &h.logs)
	slow(&ca)
	ca.Faults = NewFaults(7)
	a := h.start(ca)
	events := collect(a)
	cb := fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs)
	slow(&cb)
	cb.Join = []string{a.Addr()}
	b := h.start(cb)

	const delay = 30 * time.Millisecond
	ca.Faults.Set(b.Addr(), LinkFault{Delay: delay, Jitter: 10 * time.Millisecond})
	start := time.Now()
	testutil.Eventually(t, 10*time.Second, "a probe RTT that includes the injected delay", func() error {
		if _, ok := events.find(func(ev Event) bool {
			return ev.Kind == EventPing && ev.Node == "agent/b1" && ev.At.After(start) && ev.RTT >= delay
		}); !ok {
			return fmt.Errorf("no ping of agent/b1 with RTT >= %v", delay)
		}
		return nil
	})
	if s := ca.Faults.Stats(); s.PacketsDelayed == 0 || s.PacketsDropped != 0 {
		t.Errorf("fault stats %+v", s)
	}
}
