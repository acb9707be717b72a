package gossip

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"walden/internal/testutil"
)

// Fast timings for loopback tests. Suspicion lasts at least
// SuspicionMult*ProbeInterval = 300ms; deadlines below are generous multiples
// of that, because the machine may be busy.
func fastConfig(t *testing.T, cluster, name string, meta Meta, logs *lockedBuffer) Config {
	t.Helper()
	c := DefaultConfig()
	c.ClusterName = cluster
	c.NodeName = name
	c.Meta = meta
	c.BindAddr = "127.0.0.1:0"
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.SuspicionMult = 3
	c.GossipInterval = 20 * time.Millisecond
	c.GossipToTheDeadTime = 5 * time.Second
	c.PushPullInterval = time.Second
	c.TCPTimeout = 2 * time.Second
	c.RejoinInterval = 0
	c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return c
}

func agentMeta(id string) Meta {
	return Meta{Role: RoleAgent, ID: id, AgentAddr: "127.0.0.1:75" + id[len(id)-1:] + "1"}
}

func coordMeta(id string) Meta {
	return Meta{Role: RoleCoordinator, ID: id, AdminAddr: "127.0.0.1:70" + id[len(id)-1:] + "1"}
}

// harness starts pools and collects their events; it dumps the captured
// logs when the test fails.
type harness struct {
	t    *testing.T
	logs lockedBuffer
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("captured logs:\n%s", h.logs.String())
		}
	})
	return h
}

func (h *harness) start(c Config) *Pool {
	h.t.Helper()
	p, err := Start(c)
	if err != nil {
		h.t.Fatalf("Start(%s): %v", c.NodeName, err)
	}
	h.t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// collector reads a pool's events continuously.
type collector struct {
	mu     sync.Mutex
	events []Event
	done   chan struct{}
}

func collect(p *Pool) *collector {
	c := &collector{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for ev := range p.Events() {
			c.mu.Lock()
			c.events = append(c.events, ev)
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *collector) find(match func(Event) bool) (Event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range c.events {
		if match(ev) {
			return ev, true
		}
	}
	return Event{}, false
}

// aliveSet returns the names of p's alive members.
func aliveSet(p *Pool) map[string]Member {
	out := map[string]Member{}
	for _, m := range p.Members() {
		if m.State == StateAlive {
			out[m.Name] = m
		}
	}
	return out
}

func seesAlive(p *Pool, want map[string]Meta) error {
	alive := aliveSet(p)
	if len(alive) != len(want) {
		return fmt.Errorf("%s sees %d alive members %v, want %d", p.LocalNode().Name, len(alive), keys(alive), len(want))
	}
	for name, meta := range want {
		m, ok := alive[name]
		if !ok {
			return fmt.Errorf("%s does not see %s alive (sees %v)", p.LocalNode().Name, name, keys(alive))
		}
		if m.Meta != meta {
			return fmt.Errorf("%s sees %s with meta %+v, want %+v", p.LocalNode().Name, name, m.Meta, meta)
		}
	}
	return nil
}

func keys(m map[string]Member) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func withCluster(m Meta, cluster string) Meta {
	m.ClusterName = cluster
	return m
}

// threePools starts coordinator/c1, agent/b1 and agent/b2 of cluster
// "demo", the last two joining the first.
func threePools(t *testing.T, h *harness, tweak func(*Config)) (pools []*Pool, want map[string]Meta) {
	t.Helper()
	specs := []struct {
		name string
		meta Meta
	}{
		{"coordinator/c1", coordMeta("c1")},
		{"agent/b1", agentMeta("b1")},
		{"agent/b2", agentMeta("b2")},
	}
	want = map[string]Meta{}
	for i, s := range specs {
		c := fastConfig(t, "demo", s.name, s.meta, &h.logs)
		if i > 0 {
			c.Join = []string{pools[0].Addr()}
		}
		if tweak != nil {
			tweak(&c)
		}
		pools = append(pools, h.start(c))
		want[s.name] = withCluster(s.meta, "demo")
	}
	return pools, want
}

// demoMembers is what every member of coordinator/c1, agent/b1 and agent/b2
// of cluster "demo" should see.
func demoMembers() map[string]Meta {
	return map[string]Meta{
		"coordinator/c1": withCluster(coordMeta("c1"), "demo"),
		"agent/b1":       withCluster(agentMeta("b1"), "demo"),
		"agent/b2":       withCluster(agentMeta("b2"), "demo"),
	}
}

func TestPoolsJoinAndSeeEachOther(t *testing.T) {
	h := newHarness(t)
	a := h.start(fastConfig(t, "demo", "coordinator/c1", coordMeta("c1"), &h.logs))
	events := collect(a)
	b := h.start(fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs))
	c := h.start(fastConfig(t, "demo", "agent/b2", agentMeta("b2"), &h.logs))
	// b joins through Join, c joins b (not a): a learns of c by gossip.
	if n, err := b.Join([]string{a.Addr()}); n != 1 || err != nil {
		t.Fatalf("b.Join(a) = %d, %v", n, err)
	}
	if n, err := c.Join([]string{b.Addr()}); n != 1 || err != nil {
		t.Fatalf("c.Join(b) = %d, %v", n, err)
	}
	want := demoMembers()
	for _, p := range []*Pool{a, b, c} {
		testutil.Eventually(t, 10*time.Second, "all three alive with metadata", func() error { return seesAlive(p, want) })
	}

	for _, name := range []string{"coordinator/c1", "agent/b1", "agent/b2"} {
		testutil.Eventually(t, 10*time.Second, "join event of "+name, func() error {
			ev, ok := events.find(func(ev Event) bool { return ev.Kind == EventJoin && ev.Node == name })
			if !ok {
				return fmt.Errorf("no join event")
			}
			if ev.Meta != want[name] || ev.State != StateAlive || ev.Addr == "" || ev.At.IsZero() {
				return fmt.Errorf("join event %+v", ev)
			}
			return nil
		})
	}
	// Probes report round trips.
	testutil.Eventually(t, 10*time.Second, "a ping event with an RTT", func() error {
		if _, ok := events.find(func(ev Event) bool { return ev.Kind == EventPing && ev.RTT > 0 && ev.Node != "coordinator/c1" }); !ok {
			return fmt.Errorf("no ping event")
		}
		return nil
	})

	ln := b.LocalNode()
	if ln.Name != "agent/b1" || ln.Addr != b.Addr() || ln.Meta != want["agent/b1"] || ln.State != StateAlive {
		t.Errorf("LocalNode() = %+v", ln)
	}
	if s := a.Stats(); s.Refused != 0 {
		t.Errorf("refused = %d in a single-cluster pool", s.Refused)
	}

	// Metadata updates reach the others as an Update event.
	upd := agentMeta("b1")
	upd.AdminAddr = "127.0.0.1:9999"
	if err := b.UpdateMeta(upd, 5*time.Second); err != nil {
		t.Fatalf("UpdateMeta: %v", err)
	}
	want["agent/b1"] = withCluster(upd, "demo")
	testutil.Eventually(t, 10*time.Second, "metadata update seen", func() error { return seesAlive(a, want) })
	testutil.Eventually(t, 10*time.Second, "update event", func() error {
		if _, ok := events.find(func(ev Event) bool {
			return ev.Kind == EventUpdate && ev.Node == "agent/b1" && ev.Meta.AdminAddr == "127.0.0.1:9999"
		}); !ok {
			return fmt.Errorf("no update event")
		}
		return nil
	})
	if err := b.UpdateMeta(Meta{Role: RoleAgent, ID: "b9"}, time.Second); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("UpdateMeta changing the id = %v, want ErrInvalidConfig", err)
	}
}

// quietMemberlist starts a bare memberlist node with no walden metadata and
// no delegates: a process of another application on the same network.
func quietMemberlist(t *testing.T, name string) *memberlist.Memberlist {
	t.Helper()
	c := memberlist.DefaultLocalConfig()
	c.Name = name
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.GossipInterval = 20 * time.Millisecond
	c.PushPullInterval = time.Second
	c.Logger = log.New(io.Discard, "", 0)
	ml, err := memberlist.Create(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ml.Shutdown() })
	return ml
}

func TestPoolRefusesOtherCluster(t *testing.T) {
	h := newHarness(t)
	pools, want := threePools(t, h, nil)
	a := pools[0]
	events := collect(a)
	for _, p := range pools {
		testutil.Eventually(t, 10*time.Second, "own cluster formed", func() error { return seesAlive(p, want) })
	}

	// A walden pool of another cluster: both sides refuse the push/pull.
	x := h.start(fastConfig(t, "other", "agent/x1", agentMeta("x1"), &h.logs))
	n, err := x.Join([]string{a.Addr()})
	if err == nil || n != 0 || !errors.Is(err, ErrJoin) {
		t.Fatalf("x.Join(a) = %d, %v; want ErrJoin", n, err)
	}
	// A bare memberlist node without walden metadata: its join succeeds on
	// its side (it has no delegate), then it gossips its alive messages,
	// which a's AliveDelegate refuses.
	bare := quietMemberlist(t, "bare")
	if _, err := bare.Join([]string{a.Addr()}); err != nil {
		t.Logf("bare join: %v (a refused the merge)", err)
	}

	testutil.Eventually(t, 10*time.Second, "refusals counted", func() error {
		if r := a.Stats().Refused; r < 2 {
			return fmt.Errorf("a refused %d times", r)
		}
		return nil
	})
	// Give the intruders many probe and push/pull rounds to sneak in.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range pools {
			for _, m := range p.Members() {
				if m.Name == "agent/x1" || m.Name == "bare" {
					t.Fatalf("%s lists the foreign member %+v", p.LocalNode().Name, m)
				}
			}
		}
		for _, m := range x.Members() {
			if m.Name != "agent/x1" {
				t.Fatalf("the foreign pool lists %+v", m)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ev, ok := events.find(func(ev Event) bool { return ev.Node == "agent/x1" || ev.Node == "bare" }); ok {
		t.Fatalf("event about a foreign member: %+v", ev)
	}
	if x.Stats().Refused == 0 {
		t.Error("the foreign pool did not count refusing the demo members")
	}
	logs := h.logs.String()
	for _, want := range []string{"refused a member of another cluster", "peer=agent/x1", `peer_meta="cluster \"other\""`, "peer=bare", "undecodable metadata"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q", want)
		}
	}
	// The demo pool is undisturbed.
	for _, p := range pools {
		testutil.Eventually(t, 10*time.Second, "demo pool intact", func() error { return seesAlive(p, want) })
	}
}

func TestPoolEncryption(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	key1 := writeKeyFile(t, dir, "k1", base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))+"\n")
	key2 := writeKeyFile(t, dir, "k2", base64.StdEncoding.EncodeToString([]byte("fedcba9876543210"))+"\n")

	ca := fastConfig(t, "demo", "coordinator/c1", coordMeta("c1"), &h.logs)
	ca.EncryptionKeyFile = key1
	a := h.start(ca)

	plain := h.start(fastConfig(t, "demo", "agent/plain", agentMeta("b7"), &h.logs))
	if n, err := plain.Join([]string{a.Addr()}); err == nil || n != 0 {
		t.Fatalf("unencrypted joiner: Join = %d, %v; want refused", n, err)
	}
	co := fastConfig(t, "demo", "agent/otherkey", agentMeta("b8"), &h.logs)
	co.EncryptionKeyFile = key2
	other := h.start(co)
	if n, err := other.Join([]string{a.Addr()}); err == nil || n != 0 {
		t.Fatalf("joiner with another key: Join = %d, %v; want refused", n, err)
	}

	cb := fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs)
	cb.EncryptionKeyFile = key1
	cb.Join = []string{a.Addr()}
	b := h.start(cb)
	want := map[string]Meta{
		"coordinator/c1": withCluster(coordMeta("c1"), "demo"),
		"agent/b1":       withCluster(agentMeta("b1"), "demo"),
	}
	for _, p := range []*Pool{a, b} {
		testutil.Eventually(t, 10*time.Second, "same-key members see each other", func() error { return seesAlive(p, want) })
	}
	// Several probe and push/pull rounds later, the others are still out.
	end := time.Now().Add(time.Second)
	for time.Now().Before(end) {
		for _, p := range []*Pool{a, b} {
			for _, m := range p.Members() {
				if m.Name == "agent/plain" || m.Name == "agent/otherkey" {
					t.Fatalf("%s lists %+v", p.LocalNode().Name, m)
				}
			}
		}
		for _, p := range []*Pool{plain, other} {
			if got := p.Members(); len(got) != 1 {
				t.Fatalf("%s lists %+v, want only itself", p.LocalNode().Name, got)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestPoolKilledMemberProducesLeave(t *testing.T) {
	h := newHarness(t)
	pools, want := threePools(t, h, nil)
	for _, p := range pools {
		testutil.Eventually(t, 10*time.Second, "cluster formed", func() error { return seesAlive(p, want) })
	}
	a, b, victim := pools[0], pools[1], pools[2]
	ea, eb := collect(a), collect(b)

	if err := victim.Shutdown(); err != nil { // no Leave: a crash
		t.Fatal(err)
	}
	for _, c := range []*collector{ea, eb} {
		testutil.Eventually(t, 20*time.Second, "leave event for the killed member", func() error {
			ev, ok := c.find(func(ev Event) bool { return ev.Kind == EventLeave && ev.Node == "agent/b2" })
			if !ok {
				return fmt.Errorf("no leave event")
			}
			if ev.State != StateDead || ev.Meta != want["agent/b2"] {
				return fmt.Errorf("leave event %+v, want state dead with the member's metadata", ev)
			}
			return nil
		})
	}
	for _, p := range []*Pool{a, b} {
		var got Member
		for _, m := range p.Members() {
			if m.Name == "agent/b2" {
				got = m
			}
		}
		if got.State != StateDead || got.Since.IsZero() {
			t.Errorf("%s reports the killed member as %+v, want dead", p.LocalNode().Name, got)
		}
	}
	// The survivors still see each other.
	delete(want, "agent/b2")
	for _, p := range []*Pool{a, b} {
		testutil.Eventually(t, 10*time.Second, "survivors alive", func() error {
			alive := aliveSet(p)
			if len(alive) != 2 {
				return fmt.Errorf("%s sees alive %v", p.LocalNode().Name, keys(alive))
			}
			return nil
		})
	}
	// Methods of a shut-down pool fail cleanly.
	if _, err := victim.Join([]string{a.Addr()}); !errors.Is(err, ErrShutdown) {
		t.Errorf("Join after Shutdown = %v", err)
	}
	if err := victim.Leave(time.Second); !errors.Is(err, ErrShutdown) {
		t.Errorf("Leave after Shutdown = %v", err)
	}
	if err := victim.Shutdown(); err != nil {
		t.Errorf("second Shutdown = %v", err)
	}
	for range victim.Events() { // closed by Shutdown: the loop ends
	}
}

func TestPoolLeaveIsReportedAsLeft(t *testing.T) {
	h := newHarness(t)
	pools, want := threePools(t, h, nil)
	for _, p := range pools {
		testutil.Eventually(t, 10*time.Second, "cluster formed", func() error { return seesAlive(p, want) })
	}
	a, leaver := pools[0], pools[1]
	ea := collect(a)
	if err := leaver.Leave(5 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := leaver.Leave(5 * time.Second); err != nil {
		t.Fatalf("second Leave: %v", err)
	}
	if ln := leaver.LocalNode(); ln.State != StateLeft || !ln.Meta.Leaving {
		t.Errorf("LocalNode after Leave = %+v", ln)
	}
	if err := leaver.UpdateMeta(agentMeta("b1"), time.Second); !errors.Is(err, ErrLeft) {
		t.Errorf("UpdateMeta after Leave = %v, want ErrLeft", err)
	}
	if err := leaver.Shutdown(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "leave event with state left", func() error {
		ev, ok := ea.find(func(ev Event) bool { return ev.Kind == EventLeave && ev.Node == "agent/b1" })
		if !ok {
			return fmt.Errorf("no leave event")
		}
		if ev.State != StateLeft || !ev.Meta.Leaving {
			return fmt.Errorf("leave event %+v, want state left", ev)
		}
		return nil
	})
}

func TestSlowConsumerNeverBlocksMemberlist(t *testing.T) {
	h := newHarness(t)
	const queueSize = 4
	ca := fastConfig(t, "demo", "coordinator/c1", coordMeta("c1"), &h.logs)
	ca.EventQueueSize = queueSize
	a := h.start(ca) // nobody reads a.Events() until the end

	cb := fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs)
	cb.Join = []string{a.Addr()}
	b := h.start(cb)

	// Each metadata change is one Update event on a: far more than the queue
	// holds.
	const updates = 30
	meta := agentMeta("b1")
	for i := range updates {
		meta.AdminAddr = fmt.Sprintf("127.0.0.1:%d", 20000+i)
		if err := b.UpdateMeta(meta, 5*time.Second); err != nil {
			t.Fatalf("UpdateMeta %d: %v", i, err)
		}
	}
	want := map[string]Meta{
		"coordinator/c1": withCluster(coordMeta("c1"), "demo"),
		"agent/b1":       withCluster(meta, "demo"),
	}
	// memberlist kept processing: a saw the last update...
	testutil.Eventually(t, 10*time.Second, "a sees the latest metadata", func() error { return seesAlive(a, want) })
	testutil.Eventually(t, 10*time.Second, "drops counted", func() error {
		if s := a.Stats(); s.EventsDropped == 0 || s.EventsQueued != queueSize {
			return fmt.Errorf("stats %+v", s)
		}
		return nil
	})
	// ...and still admits new members and answers their probes.
	cc := fastConfig(t, "demo", "agent/b2", agentMeta("b2"), &h.logs)
	cc.Join = []string{a.Addr()}
	c := h.start(cc)
	want["agent/b2"] = withCluster(agentMeta("b2"), "demo")
	for _, p := range []*Pool{a, b, c} {
		testutil.Eventually(t, 10*time.Second, "new member admitted while a's queue is full", func() error { return seesAlive(p, want) })
	}
	if !strings.Contains(h.logs.String(), "event consumer too slow") {
		t.Error("drops were not logged")
	}

	// The queue kept the newest events: draining ends with b2's arrival or
	// later events, and holds at most queueSize+1 (one in the forwarder's
	// hand) events.
	var drained []Event
	sawB2 := false
	timeout := time.After(10 * time.Second)
	for !sawB2 {
		select {
		case ev := <-a.Events():
			drained = append(drained, ev)
			if ev.Node == "agent/b2" && ev.Kind == EventJoin {
				sawB2 = true
			}
		case <-timeout:
			t.Fatalf("b2's join not among the drained events %+v", drained)
		}
	}
	t.Logf("stats after drain: %+v, drained %d events before b2's join", a.Stats(), len(drained))
}

func TestRestartedMemberRejoinsAtANewAddress(t *testing.T) {
	h := newHarness(t)
	pools, want := threePools(t, h, func(c *Config) { c.DeadNodeReclaimTime = 200 * time.Millisecond })
	for _, p := range pools {
		testutil.Eventually(t, 10*time.Second, "cluster formed", func() error { return seesAlive(p, want) })
	}
	a, victim := pools[0], pools[2]
	ea := collect(a)
	oldAddr := victim.Addr()
	if err := victim.Shutdown(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "killed member dead", func() error {
		if _, ok := ea.find(func(ev Event) bool { return ev.Kind == EventLeave && ev.Node == "agent/b2" }); !ok {
			return fmt.Errorf("no leave event")
		}
		return nil
	})

	// The broker comes back on another port (another host, in production)
	// with a new agent address.
	meta := agentMeta("b2")
	meta.AgentAddr = "127.0.0.1:17521"
	c := fastConfig(t, "demo", "agent/b2", meta, &h.logs)
	c.Join = []string{a.Addr()}
	restarted := h.start(c)
	if restarted.Addr() == oldAddr {
		t.Fatalf("restarted on the old address %s", oldAddr)
	}
	want["agent/b2"] = withCluster(meta, "demo")
	for _, p := range []*Pool{a, pools[1], restarted} {
		testutil.Eventually(t, 20*time.Second, "restarted member alive again", func() error { return seesAlive(p, want) })
	}
	testutil.Eventually(t, 10*time.Second, "join event after the leave", func() error {
		ev, ok := ea.find(func(ev Event) bool {
			return ev.Kind == EventJoin && ev.Node == "agent/b2" && ev.Addr == restarted.Addr()
		})
		if !ok {
			return fmt.Errorf("no join event at the new address")
		}
		if ev.Meta != want["agent/b2"] {
			return fmt.Errorf("join event %+v", ev)
		}
		return nil
	})
}

// listen binds a gossip Listener on a loopback port the kernel picks; it is
// closed when the test ends unless a pool took it over and closed it.
func listen(t *testing.T) *Listener {
	t.Helper()
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestAloneMemberRetriesJoin(t *testing.T) {
	h := newHarness(t)
	// The seed's sockets are bound first, so that its address is known
	// before the coordinator exists and stays the coordinator's. Until the
	// coordinator runs, the agent's link to it is cut: the seed's host is
	// down (its kernel would queue a connection to the bound socket instead
	// of refusing it).
	seedSockets := listen(t)
	seed := seedSockets.Addr()
	faults := NewFaults(1)
	faults.Set(seed, Cut())

	// The agent starts before any coordinator: its join fails, Start does not.
	ca := fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs)
	ca.Join = []string{seed}
	ca.RejoinInterval = 100 * time.Millisecond
	ca.Faults = faults
	agent := h.start(ca)
	if got := aliveSet(agent); len(got) != 1 {
		t.Fatalf("agent sees %v before any coordinator exists", keys(got))
	}

	cc := fastConfig(t, "demo", "coordinator/c1", coordMeta("c1"), &h.logs)
	cc.Listener = seedSockets
	coord := h.start(cc)
	if coord.Addr() != seed {
		t.Fatalf("coordinator at %s, want the seed %s", coord.Addr(), seed)
	}
	faults.Clear(seed)
	want := map[string]Meta{
		"coordinator/c1": withCluster(coordMeta("c1"), "demo"),
		"agent/b1":       withCluster(agentMeta("b1"), "demo"),
	}
	for _, p := range []*Pool{agent, coord} {
		testutil.Eventually(t, 10*time.Second, "the alone member joined once the seed came up", func() error { return seesAlive(p, want) })
	}
	logs := h.logs.String()
	for _, want := range []string{"initial join reached no member", "rejoined the pool"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q", want)
		}
	}
}

// A member that sends uncompressed (the scale benchmark's simulated agents)
// and members that compress read each other, directly and relayed.
func TestUncompressedMemberJoinsCompressingPool(t *testing.T) {
	h := newHarness(t)
	a := h.start(fastConfig(t, "demo", "coordinator/c1", coordMeta("c1"), &h.logs))
	cb := fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs)
	cb.Compression = false
	cb.Join = []string{a.Addr()}
	b := h.start(cb)
	if mc, err := b.memberlistConfig(nil); err != nil || mc.EnableCompression {
		t.Fatalf("compression off: memberlist EnableCompression = %v (%v)", mc != nil && mc.EnableCompression, err)
	}
	if mc, err := a.memberlistConfig(nil); err != nil || !mc.EnableCompression {
		t.Fatalf("default: memberlist EnableCompression = %v (%v), want true", mc != nil && mc.EnableCompression, err)
	}
	// c knows only b: a learns of c from b, and c of a. c packs its
	// gossip into packets of the least size allowed.
	cc := fastConfig(t, "demo", "agent/b2", agentMeta("b2"), &h.logs)
	cc.Join = []string{b.Addr()}
	cc.PacketSize, cc.HandoffQueueDepth = MinPacketSize, 16
	c := h.start(cc)
	if mc, err := c.memberlistConfig(nil); err != nil || mc.UDPBufferSize != MinPacketSize || mc.HandoffQueueDepth != 16 {
		t.Fatalf("packet_size and handoff_queue_depth do not reach memberlist: %+v (%v)", mc, err)
	}
	want := demoMembers()
	for _, p := range []*Pool{a, b, c} {
		testutil.Eventually(t, 10*time.Second, "all three alive with metadata", func() error { return seesAlive(p, want) })
	}
}

// TestPoolOnHandedListener: a member started on sockets the caller bound
// (Config.Listener) is reachable at their address, gossips with members on
// memberlist's own transport both ways, carries injected faults, and closes
// the sockets when it shuts down.
func TestPoolOnHandedListener(t *testing.T) {
	h := newHarness(t)
	aFaults, cFaults := NewFaults(2), NewFaults(3)
	ca := fastConfig(t, "demo", "coordinator/c1", coordMeta("c1"), &h.logs)
	ca.Faults = aFaults
	a := h.start(ca)
	l := listen(t)
	faults := NewFaults(1)
	cb := fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs)
	cb.Listener = l
	cb.Faults = faults
	cb.Join = []string{a.Addr()}
	b := h.start(cb)
	if b.Addr() != l.Addr() || b.LocalNode().Addr != l.Addr() {
		t.Fatalf("member at %s (local node %s), want the listener's %s", b.Addr(), b.LocalNode().Addr, l.Addr())
	}
	cc := fastConfig(t, "demo", "agent/b2", agentMeta("b2"), &h.logs)
	cc.Join = []string{b.Addr()} // c reaches a only through b's sockets
	cc.Faults = cFaults
	c := h.start(cc)
	want := demoMembers()
	for _, p := range []*Pool{a, b, c} {
		testutil.Eventually(t, 10*time.Second, "all three alive with metadata", func() error { return seesAlive(p, want) })
	}
	events := collect(a)
	testutil.Eventually(t, 10*time.Second, "a probe of the member on the handed sockets answered", func() error {
		if _, ok := events.find(func(ev Event) bool { return ev.Kind == EventPing && ev.Node == "agent/b1" && ev.RTT > 0 }); !ok {
			return fmt.Errorf("no ping event of agent/b1")
		}
		return nil
	})

	// Its sends go through the faults. Faults act on what a member sends
	// and the streams it opens, so the link is cut at both ends (with
	// b's sends alone cut, a's and c's fallback probes over TCP still
	// reach b and keep it alive): cut off from a and c, it is declared
	// dead by them, and its own faults counted what they dropped.
	faults.Set(AllLinks, Cut())
	aFaults.Set(b.Addr(), Cut())
	cFaults.Set(b.Addr(), Cut())
	testutil.Eventually(t, 20*time.Second, "the member whose link is cut declared dead", func() error {
		if _, ok := events.find(func(ev Event) bool { return ev.Kind == EventLeave && ev.Node == "agent/b1" }); !ok {
			return fmt.Errorf("no leave event of agent/b1")
		}
		return nil
	})
	if st := faults.Stats(); st.PacketsDropped == 0 {
		t.Fatalf("the handed sockets' sends bypassed the faults: %+v", st)
	}

	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if !l.closed.Load() {
		t.Fatal("the handed sockets are still open after Shutdown")
	}
}

// TestStartClosesHandedListenerOnError: a Start that fails closes the
// sockets it was handed, and a member on sockets bound to every address of
// the host must be told which one others reach.
func TestStartClosesHandedListenerOnError(t *testing.T) {
	h := newHarness(t)
	l := listen(t)
	c := fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs)
	c.Listener = l
	c.ProbeTimeout = 2 * c.ProbeInterval
	if _, err := Start(c); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Start = %v, want ErrInvalidConfig", err)
	}
	if !l.closed.Load() {
		t.Fatal("the handed sockets are still open after a failed Start")
	}

	wild, err := Listen("0.0.0.0:0")
	if err != nil {
		t.Skipf("cannot bind every address of the host: %v", err)
	}
	t.Cleanup(func() { _ = wild.Close() })
	c = fastConfig(t, "demo", "agent/b1", agentMeta("b1"), &h.logs)
	c.Listener = wild
	if p, err := Start(c); err == nil {
		_ = p.Shutdown()
		t.Fatal("Start on sockets bound to 0.0.0.0 without advertise succeeded")
	} else if !strings.Contains(err.Error(), "advertise") {
		t.Fatalf("Start = %v, want it to say to set advertise", err)
	}
	if !wild.closed.Load() {
		t.Fatal("the handed sockets are still open after a failed Start")
	}
}
