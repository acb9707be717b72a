package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/agent"
	"walden/config"
	"walden/detect"
	"walden/gossip"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// Timings of the detection cluster tests: short, but in the same ratios as
// the defaults (failure_timeout > lease_ttl + drift_margin).
const (
	tFailureTimeout = 1500 * time.Millisecond
	tLeaseTTL       = 600 * time.Millisecond
	tDriftMargin    = 200 * time.Millisecond
	tProbeInterval  = 200 * time.Millisecond
	tProbeTimeout   = 100 * time.Millisecond
)

// probeFaults injects faults into the coordinators' direct probes: a
// coordinator can be cut off from an agent address, or all its probes can
// suffer loss, delay and jitter.
type probeFaults struct {
	mu      sync.Mutex
	cut     map[string]map[string]bool // node → agent addr → cut
	lossy   map[string]probeFault      // node → fault on all its probes
	rng     *rand.Rand
	probed  map[string]int // node → probes attempted (proves probes ran)
	faulty  map[string]int // node → probes that met a fault (cut, loss or delay)
	dropped map[string]int // node → probes dropped or cut
}

// probeFault is the fault on a coordinator's probes: a lost probe (its
// request or its answer) times out.
type probeFault struct {
	loss          float64
	delay, jitter time.Duration
}

func newProbeFaults() *probeFaults {
	return &probeFaults{cut: map[string]map[string]bool{}, lossy: map[string]probeFault{}, rng: rand.New(rand.NewPCG(1, 2)),
		probed: map[string]int{}, faulty: map[string]int{}, dropped: map[string]int{}}
}

func (f *probeFaults) setCut(node, addr string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut[node] == nil {
		f.cut[node] = map[string]bool{}
	}
	f.cut[node][addr] = on
}

func (f *probeFaults) setLossy(node string, pf probeFault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lossy[node] = pf
}

func (f *probeFaults) prober(node string) detect.Prober {
	real := detect.HTTPProber{}
	return detect.ProberFunc(func(ctx context.Context, addr string) error {
		f.mu.Lock()
		f.probed[node]++
		cut := f.cut[node][addr]
		pf := f.lossy[node]
		drop := pf.loss > 0 && f.rng.Float64() < pf.loss
		delay := pf.delay
		if pf.jitter > 0 {
			delay += time.Duration(f.rng.Int64N(int64(pf.jitter) + 1))
		}
		if cut || pf != (probeFault{}) {
			f.faulty[node]++
		}
		if cut || drop {
			f.dropped[node]++
		}
		f.mu.Unlock()
		if cut || drop {
			<-ctx.Done()
			return fmt.Errorf("%w: injected drop", detect.ErrProbe)
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", detect.ErrProbe, ctx.Err())
		}
		return real.Probe(ctx, addr)
	})
}

type detCluster struct {
	t testing.TB
	// agentGossip and agentMargin configure the agents started by
	// startAgent.
	agentGossip gossip.Config
	agentMargin time.Duration
	// faults reach every link: probes, gossip and raft.
	faults *linkFaults
	// agentAddrs and agentGossipAddrs are the started agents' probe and
	// gossip addresses, by broker id.
	agentAddrs, agentGossipAddrs map[string]string
	cfgs                         []*config.Server
	servers                      []*Server
	gossip                       []string
	conns                        map[string]*grpc.ClientConn
}

// newDetCluster starts 3 coordinators with gossip on loopback, with the
// test timings (tweak may change any key, e.g. back to the defaults).
func newDetCluster(t testing.TB, tweak func(cfg *config.Server)) *detCluster {
	t.Helper()
	c := &detCluster{t: t, faults: newLinkFaults(), conns: map[string]*grpc.ClientConn{},
		agentAddrs: map[string]string{}, agentGossipAddrs: map[string]string{}}
	c.agentGossip = gossip.DefaultConfig()
	c.agentGossip.ProbeInterval, c.agentGossip.ProbeTimeout = tProbeInterval, tProbeTimeout
	c.agentGossip.GossipInterval = 50 * time.Millisecond
	c.agentMargin = 150 * time.Millisecond
	// The raft and admin listeners and the gossip sockets (UDP and TCP on
	// one port) are bound here and handed to each member.
	initial, listeners := bindMembers(t, "c1", "c2", "c3")
	var gossipSockets []*gossip.Listener
	for range initial {
		l := bindGossip(t)
		gossipSockets = append(gossipSockets, l)
		c.gossip = append(c.gossip, l.Addr())
	}
	for i, m := range initial {
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "det", m.ID
		cfg.DataDir = filepath.Join(t.TempDir(), m.ID)
		cfg.Listen = config.Listen{Admin: m.Admin, Raft: m.Raft}
		cfg.InitialCluster = initial
		// 50 ms ticks: an election timeout of 500 ms, which a loaded
		// machine under the race detector does not blow through at every
		// scheduling hiccup (leaders that change all the time).
		cfg.Raft.TickInterval = 50 * time.Millisecond
		cfg.Gossip.BindAddr = c.gossip[i]
		cfg.Gossip.Join = c.gossip
		cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout = tProbeInterval, tProbeTimeout
		cfg.Gossip.GossipInterval = 50 * time.Millisecond
		cfg.Gossip.RejoinInterval = 500 * time.Millisecond
		cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = tFailureTimeout, tLeaseTTL, tDriftMargin
		if tweak != nil {
			tweak(cfg)
		}
		cfg.Gossip.Faults = c.faults.gossipFor(m.ID) // after tweak, which may reset gossip
		cfg.Gossip.BindAddr, cfg.Gossip.Listener = c.gossip[i], gossipSockets[i]
		c.cfgs = append(c.cfgs, cfg)
	}
	for _, cfg := range c.cfgs {
		c.servers = append(c.servers, startServerTB(t, cfg, WithListeners(listeners[cfg.NodeID]),
			withProber(c.faults.probes.prober(cfg.NodeID)), c.faults.raftOption(cfg.NodeID)))
	}
	for _, m := range initial {
		conn, err := grpc.NewClient(m.Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		waitServingTB(t, conn)
		c.conns[m.ID] = conn
	}
	return c
}

// bindGossip binds the gossip sockets of one member on a loopback port the
// kernel picks; the member takes them over (the test closes them if it
// never started).
func bindGossip(t testing.TB) *gossip.Listener {
	t.Helper()
	l, err := gossip.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func (c *detCluster) leader() *Server {
	c.t.Helper()
	var leader *Server
	c.waitFor("a leader", 30*time.Second, func() bool {
		for _, s := range c.servers {
			if s.node.IsLeader() {
				leader = s
				return true
			}
		}
		return false
	})
	return leader
}

// pick returns the id of the current leader ("leader") or of a follower
// ("follower").
func (c *detCluster) pick(role string) string {
	c.t.Helper()
	leader := c.leader().cfg.NodeID
	if role == "leader" {
		return leader
	}
	for _, cfg := range c.cfgs {
		if cfg.NodeID != leader {
			return cfg.NodeID
		}
	}
	c.t.Fatal("no follower")
	return ""
}

func (c *detCluster) brokers(id string) waldenv1.BrokersClient {
	return waldenv1.NewBrokersClient(c.conns[id])
}

// broker reads a broker from the replicated state (state).
func (c *detCluster) broker(id string) *waldenv1.Broker {
	b, _ := c.state().Broker(id)
	return b
}

// state is the leader's replicated state once it reflects every entry
// committed before the call (a linearizable read): a member that has just
// won an election may not have applied the end of its log yet, and must
// not be taken to show a decision missing.
func (c *detCluster) state() brokerState {
	c.t.Helper()
	var st brokerState
	c.waitFor("a linearizable read on the leader", 30*time.Second, func() bool {
		s := c.leader()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if s.node.LinearizableRead(ctx) != nil {
			return false
		}
		st = s.detector.d.state
		return true
	})
	return st
}

// startAgent starts the agent of broker id, configured with every
// coordinator's admin address. proxies, keyed by a coordinator's admin
// address, make every connection the agent opens to that coordinator (to a
// configured address or to one a grant named) go through a proxy the test
// can cut.
func (c *detCluster) startAgent(id string, proxies map[string]*cutProxy) *agent.Agent {
	c.t.Helper()
	cfg := config.DefaultAgentConfig()
	cfg.BrokerID, cfg.ClusterName = id, "det"
	for _, m := range []string{"c1", "c2", "c3"} {
		cfg.Coordinators = append(cfg.Coordinators, c.conns[m].Target())
	}
	// Every connection the agent opens to a coordinator (gRPC, and its
	// renewals' own) goes through the faults of its link
	// (degradeCoordinator), and through a proxy the test can cut when one
	// is given for that coordinator.
	node := map[string]string{}
	for id, conn := range c.conns {
		node[conn.Target()] = id
	}
	dialCoordinator := func(ctx context.Context, addr string) (net.Conn, error) {
		target := addr
		if p := proxies[addr]; p != nil {
			target = p.addr()
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", target)
		if err != nil || node[addr] == "" {
			return conn, err
		}
		return newFaultyDuplex(conn, c.faults.agents, agentLink(id), addr, node[addr]), nil
	}
	cfg.Listen = "127.0.0.1:0"
	cfg.WAL = config.WALLocation{VolumeID: "vol-" + id, Path: "/nonexistent/" + id + ".wal"}
	cfg.LeaseSafetyMargin = c.agentMargin
	cfg.Gossip = c.agentGossip
	gl := bindGossip(c.t)
	cfg.Gossip.BindAddr, cfg.Gossip.Listener = gl.Addr(), gl
	cfg.Gossip.Join = c.gossip
	cfg.Gossip.Faults = c.faults.gossipFor(id)
	a, err := agent.New(cfg, agent.Options{Logger: slog.New(slog.DiscardHandler), RegisterBackoffMax: 200 * time.Millisecond,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(dialCoordinator)}, Dial: dialCoordinator})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = a.Stop(false) })
	c.agentAddrs[id], c.agentGossipAddrs[id] = a.Addr(), cfg.Gossip.BindAddr
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline(30*time.Second))
	defer cancel()
	if _, err := a.WaitRegistered(ctx); err != nil {
		c.t.Fatalf("agent %s: %v", id, err)
	}
	return a
}

// waitAllAlive waits until every coordinator's committed observation of
// the brokers says alive.
func (c *detCluster) waitAllAlive(ids ...string) {
	c.t.Helper()
	c.waitFor("every coordinator observes "+fmt.Sprint(ids)+" alive", 10*time.Second, func() bool {
		for _, id := range ids {
			b := c.broker(id)
			if b == nil || len(b.GetObservations()) != 3 {
				return false
			}
			for _, o := range b.GetObservations() {
				if o.GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
					return false
				}
			}
		}
		return true
	})
}

func (c *detCluster) waitFor(what string, d time.Duration, cond func() bool) {
	c.t.Helper()
	testutil.EventuallyTrue(c.t, d, what, cond)
}

// hold checks for d that cond stays true.
func (c *detCluster) hold(what string, d time.Duration, cond func() bool) {
	c.t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if !cond() {
			c.t.Fatalf("broken while holding: %s\n%s", what, c.views())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// views describes every member's replicated state: its role, how far it
// has applied the log, the brokers' epochs and the decisions it recorded.
func (c *detCluster) views() string {
	var b strings.Builder
	for _, s := range c.servers {
		st := s.node.Status()
		fmt.Fprintf(&b, "%s: leader=%v term=%d commit=%d applied=%d", s.cfg.NodeID, s.node.IsLeader(), st.Term, st.CommitIndex, st.AppliedIndex)
		for _, br := range s.detector.d.state.Brokers() {
			fmt.Fprintf(&b, " %s(epoch %d fenced %v failovers %d)", br.GetBrokerId(), br.GetEpoch(), br.GetFenced(), br.GetFailovers())
		}
		for _, e := range s.detector.d.state.Events("", 0) {
			if e.GetEventKind().Name() == "decision" {
				fmt.Fprintf(&b, " decision(%s)", e.GetBrokerId())
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (c *detCluster) events(broker, kind string) []*waldenv1.Event {
	var out []*waldenv1.Event
	for _, e := range c.state().Events(broker, 0) {
		if e.GetEventKind().Name() == kind {
			out = append(out, e)
		}
	}
	return out
}

func TestDetectAgentKilledFailedOnceAfterTimeout(t *testing.T) {
	c := newDetCluster(t, nil)
	a1 := c.startAgent("b1", nil)
	c.startAgent("b2", nil)
	c.waitAllAlive("b1", "b2")
	before := c.broker("b1")

	killed := time.Now()
	_ = a1.Stop(false)
	c.waitFor("b1 failed", 20*time.Second, func() bool { return c.broker("b1").GetFenced() })
	// failure_timeout counts from the last contact, which was at most a
	// probe interval or a renewal interval before the kill.
	failedSeen := time.Since(killed)
	if lastContact := max(tProbeInterval, tLeaseTTL/3); failedSeen < tFailureTimeout-lastContact {
		t.Fatalf("declared failed %v after the kill, before failure_timeout %v from the last contact", failedSeen, tFailureTimeout)
	}
	// The evidence says the leader measured the whole timeout of silence
	// and a majority attested the lease expired.
	ds := c.events("b1", "decision")
	if len(ds) != 1 {
		t.Fatalf("decision events %v", ds)
	}
	ev := ds[0].GetEvidence()
	attested := 0
	for _, o := range ev.GetObservations() {
		if o.GetLeaseExpired() {
			attested++
		}
	}
	if ev.GetSuspectForMs() < tFailureTimeout.Milliseconds() || attested < 2 || ev.GetTerm() == 0 ||
		ev.GetSuspicionQuorum() != 2 || len(ev.GetObservations()) < 2 || ev.GetManual() {
		t.Fatalf("evidence %v", ev)
	}
	// Exactly one epoch bump, and it stays so.
	c.hold("one failover of b1, b2 untouched", 3*tFailureTimeout, func() bool {
		b := c.broker("b1")
		return b.GetEpoch() > before.GetEpoch() && b.GetFailovers() == 1 && !c.broker("b2").GetFenced()
	})
	if len(c.events("b1", "decision")) != 1 {
		t.Fatal("more than one decision")
	}

	// The API: the broker as an operator sees it.
	resp, err := c.brokers("c2").GetBroker(context.Background(), &waldenv1.GetBrokerRequest{BrokerId: "b1"})
	// failed, or already recovering once an assignee runs the job (its WAL
	// path does not exist here, so the job keeps retrying).
	if st := resp.GetBroker().GetBrokerState(); err != nil || (st != waldenv1.BrokerState_BROKER_STATE_FAILED && st != waldenv1.BrokerState_BROKER_STATE_RECOVERING) || !resp.GetBroker().GetFenced() {
		t.Fatalf("GetBroker %v %v", resp, err)
	}
	list, err := c.brokers("c3").ListBrokers(context.Background(), &waldenv1.ListBrokersRequest{})
	if err != nil || len(list.GetBrokers()) != 2 {
		t.Fatalf("ListBrokers %v %v", list, err)
	}
	for _, b := range list.GetBrokers() {
		if b.GetBrokerId() == "b2" && (b.GetLeaseRemainingMs() <= 0 || b.GetLeaseRemainingMs() > tLeaseTTL.Milliseconds()) {
			t.Fatalf("b2 lease remaining %d from a follower (forwarded to the leader)", b.GetLeaseRemainingMs())
		}
	}
}

func TestDetectOneCoordinatorCutOffNeverFailsOver(t *testing.T) {
	c := newDetCluster(t, nil)
	// b1 reaches c2's admin API through a proxy, so that the cut covers
	// its lease renewals to c2 too.
	c2proxy := newCutProxy(t, c.conns["c2"].Target())
	c.startAgent("b1", map[string]*cutProxy{c.conns["c2"].Target(): c2proxy})
	c.startAgent("b2", nil)
	c.waitAllAlive("b1", "b2")
	epoch := c.broker("b1").GetEpoch()
	before := c.faults.counts()

	// c2 loses b1 entirely: its probes are dropped, gossip between c2 and
	// b1's agent carries nothing either way, and b1 cannot reach c2.
	c.cutCoordinatorFromBroker("c2", "b1")
	c2proxy.cut()
	c.waitFor("c2 observes b1 suspect or dead", 10*time.Second, func() bool {
		for _, o := range c.broker("b1").GetObservations() {
			if o.GetObserverId() == "c2" && o.GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
				return true
			}
		}
		return false
	})
	c.hold("b1 never failed over", 4*tFailureTimeout, func() bool {
		b := c.broker("b1")
		return !b.GetFenced() && b.GetFailovers() == 0 && b.GetEpoch() == epoch
	})
	if d := c.events("", "decision"); len(d) != 0 {
		t.Fatalf("decisions %v", d)
	}
	n := c.faults.counts().sub(before)
	if n.probesDropped == 0 || n.gossipDropped+n.gossipStreamsBlocked == 0 {
		t.Fatalf("the cut did not act: %+v", n)
	}
	t.Logf("faults during the hold: %+v", n)
}

// TestDetectLossAndJitterOnOneCoordinatorNeverFailsOver puts the faults on
// a follower, then on the leader.
func TestDetectLossAndJitterOnOneCoordinatorNeverFailsOver(t *testing.T) {
	for _, target := range []string{"follower", "leader"} {
		t.Run(target, func(t *testing.T) { testLossAndJitterOn(t, target) })
	}
}

func testLossAndJitterOn(t *testing.T, target string) {
	c := newDetCluster(t, nil)
	c.startAgent("b1", nil)
	c.startAgent("b2", nil)
	a3 := c.startAgent("b3", nil)
	c.waitAllAlive("b1", "b2", "b3")
	epochs := map[string]uint64{}
	for _, id := range []string{"b1", "b2"} {
		epochs[id] = c.broker(id).GetEpoch()
	}
	before := c.faults.counts()
	term0 := c.leader().node.Status().Term
	node := c.pick(target)

	// 20% loss and 50–100 ms delay on every link of node: its probes, the
	// agents' renewals and their answers, its gossip to and from every
	// member, its raft streams both ways.
	c.degradeCoordinator(node, 0.2, 50*time.Millisecond, 50*time.Millisecond)
	healthy := func() bool {
		for id, e := range epochs {
			if b := c.broker(id); b.GetFenced() || b.GetEpoch() != e || b.GetFailovers() != 0 {
				return false
			}
		}
		return true
	}
	c.hold("no failover under loss and jitter on "+node, 5*tFailureTimeout, func() bool {
		return healthy() && !c.broker("b3").GetFenced()
	})
	// The cluster still decides: a broker that really dies is failed over,
	// once, and the healthy ones are not.
	_ = a3.Stop(false)
	c.waitFor("b3 failed while "+node+"'s links are degraded", 20*time.Second, func() bool { return c.broker("b3").GetFenced() })
	c.hold("b1, b2 untouched; one decision", 2*tFailureTimeout, func() bool {
		return healthy() && len(c.events("", "decision")) == 1
	})
	n := c.faults.counts().sub(before)
	// The direct link between the coordinator and the agents carries the
	// renewals (and a probe only in a round that heard no renewal): the
	// renewals must have met the faults.
	if n.agentChunks < 20 || n.agentLost == 0 || n.gossipDropped == 0 || n.raftLost == 0 {
		t.Fatalf("the faults did not act on every link: %+v", n)
	}
	t.Logf("faults on %s (%s): %+v; raft terms during the faults: %d", node, target, n, c.leader().node.Status().Term-term0)
}

func TestDetectAgentCutOffSelfFencesBeforeFailed(t *testing.T) {
	c := newDetCluster(t, nil)
	// The agent reaches the coordinators through proxies the test can cut.
	proxies := map[string]*cutProxy{}
	for _, id := range []string{"c1", "c2", "c3"} {
		proxies[c.conns[id].Target()] = newCutProxy(t, c.conns[id].Target())
	}
	a1 := c.startAgent("b1", proxies)
	c.waitAllAlive("b1")
	c.waitFor("b1's lease valid", 5*time.Second, func() bool { return a1.Lease().Valid })

	var invalidAt, fencedAt time.Time
	for _, p := range proxies {
		p.cut()
	}
	for _, s := range c.cfgs {
		c.faults.probes.setCut(s.NodeID, a1.Addr(), true)
	}
	deadline := time.Now().Add(20 * time.Second)
	for fencedAt.IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("b1 never declared failed")
		}
		valid := a1.Lease().Valid
		fenced := c.broker("b1").GetFenced()
		now := time.Now()
		if !valid && invalidAt.IsZero() {
			invalidAt = now
		}
		if fenced {
			fencedAt = now
		}
		time.Sleep(2 * time.Millisecond)
	}
	if invalidAt.IsZero() || !invalidAt.Before(fencedAt) {
		t.Fatalf("lease invalid at %v, failed at %v: the agent must stop first", invalidAt, fencedAt)
	}
	t.Logf("agent self-fenced %v before the decision was seen", fencedAt.Sub(invalidAt))
}

func TestDetectMassSuspicionFreezes(t *testing.T) {
	c := newDetCluster(t, nil)
	a1 := c.startAgent("b1", nil)
	a2 := c.startAgent("b2", nil)
	c.startAgent("b3", nil)
	c.waitAllAlive("b1", "b2", "b3")
	_ = a1.Stop(false)
	_ = a2.Stop(false)
	c.waitFor("freeze event", 20*time.Second, func() bool { return len(c.events("", "freeze")) > 0 })
	c.hold("no decision while frozen", 3*tFailureTimeout, func() bool {
		return !c.broker("b1").GetFenced() && !c.broker("b2").GetFenced() && len(c.events("", "decision")) == 0
	})
	if n := len(c.events("", "freeze")); n != 1 {
		t.Fatalf("%d freeze events, want 1", n)
	}
	// The operator can still fail one over by hand (it waits for a
	// majority of attestations, which a dead broker's coordinators made).
	fctx, fcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer fcancel()
	resp, err := c.brokers("c1").Failover(fctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "host b1 lost"})
	if err != nil || resp.GetNewEpoch() == 0 || resp.GetJobId() == "" {
		t.Fatalf("manual failover %v %v", resp, err)
	}
	ev := c.events("b1", "decision")
	if len(ev) != 1 || !ev[0].GetEvidence().GetManual() {
		t.Fatalf("decision events %v", ev)
	}
	// A second manual failover of the same epoch is refused by the fencing.
	_, err = c.brokers("c2").Failover(context.Background(), &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "again"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second failover: %v", err)
	}
}

func TestDetectLeaderChangeWhileSuspectDecidesOnce(t *testing.T) {
	c := newDetCluster(t, nil)
	a1 := c.startAgent("b1", nil)
	c.startAgent("b2", nil)
	c.waitAllAlive("b1", "b2")
	epoch := c.broker("b1").GetEpoch()
	_ = a1.Stop(false)
	c.waitFor("a quorum observes b1 suspect", 10*time.Second, func() bool {
		n := 0
		for _, o := range c.broker("b1").GetObservations() {
			if o.GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
				n++
			}
		}
		return n >= 2
	})
	old := c.leader()
	var target string
	for _, cfg := range c.cfgs {
		if cfg.NodeID != old.cfg.NodeID {
			target = cfg.NodeID
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := old.node.TransferLeadership(ctx, target); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("transfer: %v", err)
	}
	c.waitFor("b1 failed under the new leader", 20*time.Second, func() bool { return c.broker("b1").GetFenced() })
	// The new leader judged a full failure_timeout of silence, counted from
	// the last contact the observers reported (a leader change does not
	// restart it), and the decision carries its term.
	ds := c.events("b1", "decision")
	if len(ds) != 1 || ds[0].GetEvidence().GetSuspectForMs() < tFailureTimeout.Milliseconds() || ds[0].GetEvidence().GetDecidedBy() == old.cfg.NodeID {
		t.Fatalf("decision %v (old leader %s)", ds, old.cfg.NodeID)
	}
	c.hold("exactly one decision", 2*tFailureTimeout, func() bool {
		b := c.broker("b1")
		return b.GetFailovers() == 1 && b.GetEpoch() > epoch && len(c.events("b1", "decision")) == 1
	})
}

func TestDetectDryRunRecordsOnly(t *testing.T) {
	c := newDetCluster(t, func(cfg *config.Server) { cfg.Policy.DryRun = true })
	a1 := c.startAgent("b1", nil)
	c.waitAllAlive("b1")
	epoch := c.broker("b1").GetEpoch()
	_ = a1.Stop(false)
	c.waitFor("dry_run event", 20*time.Second, func() bool { return len(c.events("b1", "dry_run")) > 0 })
	c.hold("nothing fenced, one dry run", 2*tFailureTimeout, func() bool {
		b := c.broker("b1")
		return !b.GetFenced() && b.GetEpoch() == epoch && len(c.events("b1", "dry_run")) == 1 && len(c.events("b1", "decision")) == 0
	})
}

func TestDetectFlappingBlockedByCooldownUntilAck(t *testing.T) {
	c := newDetCluster(t, nil)
	a1 := c.startAgent("b1", nil)
	c.startAgent("b2", nil)
	c.startAgent("b3", nil)
	c.waitAllAlive("b1", "b2", "b3")
	_ = a1.Stop(false)
	c.waitFor("b1 failed", 20*time.Second, func() bool { return c.broker("b1").GetFenced() })
	// The recovery finishes: finish the job through raft as the executor
	// would (retrying with the job's current attempt, in case this
	// member's recovery runner touched it meanwhile).
	b := c.broker("b1")
	jobs := c.leader().detector.d.state.(interface {
		Job(string) (*waldenv1.Job, bool)
	})
	c.waitFor("b1's job finished", 10*time.Second, func() bool {
		job, ok := jobs.Job(b.GetLastJobId())
		if !ok {
			return false
		}
		if job.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED {
			return true
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.leader().node.Propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_FinishJob{FinishJob: &waldenv1.FinishJob{
			JobId: b.GetLastJobId(), Attempt: job.GetAttempt(), JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED, RecoveredWalOffset: 0,
		}}})
		return err == nil
	})
	c.waitFor("b1 recovered", 5*time.Second, func() bool { return c.broker("b1").GetBrokerState() == waldenv1.BrokerState_BROKER_STATE_RECOVERED })
	// It comes back, registers again, and dies again within the cooldown.
	a1 = c.startAgent("b1", nil)
	c.waitAllAlive("b1")
	epoch := c.broker("b1").GetEpoch()
	_ = a1.Stop(false)
	c.waitFor("cooldown event", 20*time.Second, func() bool { return c.broker("b1").GetCooldownBlocked() })
	c.hold("blocked by the cooldown", 2*tFailureTimeout, func() bool {
		b := c.broker("b1")
		return !b.GetFenced() && b.GetEpoch() == epoch && len(c.events("b1", "cooldown")) == 1
	})
	if _, err := c.brokers("c3").Ack(context.Background(), &waldenv1.AckRequest{BrokerId: "b1"}); err != nil {
		t.Fatalf("ack: %v", err)
	}
	c.waitFor("b1 failed after the ack", 20*time.Second, func() bool { return c.broker("b1").GetFenced() })
	if b := c.broker("b1"); b.GetFailovers() != 2 {
		t.Fatalf("failovers %d", b.GetFailovers())
	}
}

func TestBrokersPolicyAPI(t *testing.T) {
	c := newDetCluster(t, nil)
	cl := c.brokers("c2")
	ctx := context.Background()
	var got *waldenv1.GetPolicyResponse
	c.waitFor("the policy seeded", 10*time.Second, func() bool {
		var err error
		got, err = cl.GetPolicy(ctx, &waldenv1.GetPolicyRequest{})
		return err == nil
	})
	if got.GetPolicy().GetFailureTimeoutMs() != tFailureTimeout.Milliseconds() || got.GetAnsweredBy() != "c2" || got.GetSeededBy() == "" || len(got.GetConfigDrift()) != 0 {
		t.Fatalf("get policy %v", got)
	}
	for _, e := range got.GetEntries() {
		if e.GetKey() == "failure_timeout" && e.GetSource() != "seed" {
			t.Fatalf("entry %v", e)
		}
	}
	// An unsafe combination is refused before anything is proposed.
	_, err := cl.SetPolicy(ctx, &waldenv1.SetPolicyRequest{Set: map[string]string{"lease_ttl": "2s"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "failure_timeout") {
		t.Fatalf("unsafe set: %v", err)
	}
	_, err = cl.SetPolicy(ctx, &waldenv1.SetPolicyRequest{Set: map[string]string{"max_failed_fraction": "2"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "max_failed_fraction") {
		t.Fatalf("bad value: %v", err)
	}
	set, err := cl.SetPolicy(ctx, &waldenv1.SetPolicyRequest{Set: map[string]string{"failure_timeout": "3s", "cooldown": "1m"}})
	if err != nil || set.GetPolicy().GetFailureTimeoutMs() != 3000 || set.GetPolicy().GetCooldownMs() != 60000 {
		t.Fatalf("set %v %v", set, err)
	}
	if n := len(c.events("", "policy")); n != 2 { // the seed, then the change
		t.Fatalf("policy events %d", n)
	}
	un, err := cl.SetPolicy(ctx, &waldenv1.SetPolicyRequest{Unset: []string{"failure_timeout"}})
	if err != nil || un.GetPolicy().GetFailureTimeoutMs() != tFailureTimeout.Milliseconds() {
		t.Fatalf("unset %v %v", un, err)
	}
	// Unknown broker and bad arguments.
	if _, err := cl.GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: "nope"}); status.Code(err) != codes.NotFound || rpcerr.Reason(err) != refusal.UnknownNode {
		t.Fatalf("unknown broker: %v", err)
	}
	if _, err := cl.Failover(ctx, &waldenv1.FailoverRequest{BrokerId: "b1"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("failover without reason: %v", err)
	}
	ag := waldenv1.NewAgentClient(c.conns["c3"])
	if _, err := ag.Register(ctx, &waldenv1.RegisterRequest{ClusterName: "other", BrokerId: "b1", AgentAddr: "127.0.0.1:1"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("foreign cluster register: %v", err)
	}
	r, err := ag.Register(ctx, &waldenv1.RegisterRequest{ClusterName: "det", BrokerId: "b9", AgentAddr: "127.0.0.1:1"})
	if err != nil || r.GetEpoch() == 0 || r.GetLeaseTtlMs() != tLeaseTTL.Milliseconds() {
		t.Fatalf("register via a follower: %v %v", r, err)
	}
	if _, err := ag.RenewLease(ctx, &waldenv1.RenewLeaseRequest{BrokerId: "b9", Epoch: r.GetEpoch() + 5}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("renew with a wrong epoch: %v", err)
	}
	// A member grants only once the quiet period after its start is over.
	c.waitFor("renew granted by c3", 10*time.Second, func() bool {
		resp, err := ag.RenewLease(ctx, &waldenv1.RenewLeaseRequest{BrokerId: "b9", Epoch: r.GetEpoch()})
		if status.Code(err) == codes.Unavailable {
			return false
		}
		if err != nil || resp.GetCoordinatorId() != "c3" || len(resp.GetVoters()) != 3 || resp.GetConfIndex() == 0 {
			t.Fatalf("renew: %v %v", resp, err)
		}
		return true
	})
	m, err := cl.SetMaintenance(ctx, &waldenv1.SetMaintenanceRequest{BrokerId: "b9", On: true})
	if err != nil || m.GetBroker().GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_MAINTENANCE {
		t.Fatalf("maintenance %v %v", m, err)
	}
	// The newest event of b9 other than an observation (its observers keep
	// proposing those while the test runs) is the maintenance.
	evs, err := cl.ListEvents(ctx, &waldenv1.ListEventsRequest{BrokerId: "b9"})
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	var newest *waldenv1.Event
	for _, e := range evs.GetEvents() {
		if e.GetEventKind() != waldenv1.EventKind_EVENT_KIND_OBSERVATION {
			newest = e
		}
	}
	if newest.GetEventKind() != waldenv1.EventKind_EVENT_KIND_MAINTENANCE {
		t.Fatalf("newest event of b9 besides observations is %v, want the maintenance; all: %v", newest, evs.GetEvents())
	}
}

// cutProxy stands between an agent and one coordinator's admin address, so
// that a test can cut the agent off from the coordinators.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	isCut  bool
	conns  []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	p := &cutProxy{ln: testutil.Listen(t, "127.0.0.1"), target: target}
	t.Cleanup(func() { _ = p.ln.Close(); p.cut() })
	go func() {
		for {
			in, err := p.ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.isCut {
				p.mu.Unlock()
				_ = in.Close()
				continue
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				_ = in.Close()
				continue
			}
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go pipe(in, out)
			go pipe(out, in)
		}
	}()
	return p
}

func pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

// cut closes every proxied connection and refuses new ones.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func startServerTB(t testing.TB, cfg *config.Server, opts ...Option) *Server {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return after cancel")
			}
		})
	}
	serverStops.Store(s, stop)
	t.Cleanup(stop)
	return s
}

// serverStops holds, per server started by startServerTB, the function that
// stops it (stopServerTB).
var serverStops sync.Map

// stopServerTB stops a server started by startServerTB, as SIGTERM would.
func stopServerTB(s *Server) {
	if stop, ok := serverStops.Load(s); ok {
		stop.(func())()
	}
}

func waitServingTB(t testing.TB, conn *grpc.ClientConn) {
	t.Helper()
	cl := waldenv1.NewClusterClient(conn)
	deadline := time.Now().Add(testutil.Deadline(30 * time.Second))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cl.Status(ctx, &waldenv1.StatusRequest{})
		cancel()
		if err == nil && st.GetLeaderId() != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader: %v %v", st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestManualFailoverOfLiveBrokerWaitsForItsLease fails over a broker whose
// agent holds a valid lease: the coordinators stop renewing it at once, and
// the decision — hence the fencing and the recovery's read of the WAL —
// comes only after the agent has stopped acknowledging (a majority of the
// coordinators attested that their grants expired).
func TestManualFailoverOfLiveBrokerWaitsForItsLease(t *testing.T) {
	c := newDetCluster(t, nil)
	a1 := c.startAgent("b1", nil)
	c.waitAllAlive("b1")
	c.waitFor("b1's lease valid before the failover", 10*time.Second, func() bool { return a1.Lease().Valid })
	epoch := c.broker("b1").GetEpoch()
	var invalidAt, fencedAt time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		for invalidAt.IsZero() || fencedAt.IsZero() {
			now := time.Now()
			if invalidAt.IsZero() && !a1.Lease().Valid {
				invalidAt = now
			}
			if fencedAt.IsZero() && c.broker("b1").GetEpoch() != epoch {
				fencedAt = now
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.brokers("c1").Failover(ctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "operator"})
	if err != nil {
		t.Fatalf("manual failover: %v", err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the lease never turned invalid, or b1 was never fenced")
	}
	if !invalidAt.Before(fencedAt) {
		t.Fatalf("b1 was fenced %v before its lease turned invalid", invalidAt.Sub(fencedAt))
	}
	if resp.GetNewEpoch() == 0 || resp.GetJobId() == "" || resp.GetLeaseWaitMs() <= 0 {
		t.Fatalf("failover answer %v", resp)
	}
	t.Logf("lease invalid %v before the fencing; the failover waited %dms for the lease", fencedAt.Sub(invalidAt), resp.GetLeaseWaitMs())
}

// TestReadsOfAMemberCutOffFromTheMajority: a member left alone (the two
// others stopped) answers a linearizable read (the default) with an error, never with
// state that may be stale; a serializable read answers at once and names
// the member and the applied index it answered at.
func TestReadsOfAMemberCutOffFromTheMajority(t *testing.T) {
	c := newDetCluster(t, nil)
	c.startAgent("b1", nil)
	c.waitAllAlive("b1")
	node := c.pick("follower")
	c.waitFor(node+" applied b1's observations", 10*time.Second, func() bool {
		b, _ := c.servers[c.index(node)].detector.d.state.Broker("b1")
		return len(b.GetObservations()) == 3
	})
	for i, cfg := range c.cfgs {
		if cfg.NodeID != node {
			stopServerTB(c.servers[i]) // the other two: node alone is a minority
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.brokers(node).ListEvents(ctx, &waldenv1.ListEventsRequest{}); err == nil {
		t.Fatal("a linearizable read answered by a member cut off from the majority")
	}
	var trailer metadata.MD
	sctx := metadata.AppendToOutgoingContext(context.Background(), HeaderConsistency, "s")
	resp, err := c.brokers(node).ListEvents(sctx, &waldenv1.ListEventsRequest{BrokerId: "b1"}, grpc.Trailer(&trailer))
	if err != nil || len(resp.GetEvents()) == 0 {
		t.Fatalf("serializable read: %v %v", resp, err)
	}
	if by := trailer.Get(TrailerAnsweredBy); len(by) != 1 || by[0] != node || len(trailer.Get(TrailerAppliedIndex)) != 1 {
		t.Fatalf("trailers %v", trailer)
	}
	bad := metadata.AppendToOutgoingContext(context.Background(), HeaderConsistency, "x")
	if _, err := c.brokers(node).ListEvents(bad, &waldenv1.ListEventsRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("consistency x: %v", err)
	}
}

// index is the position of member id in c.cfgs and c.servers.
func (c *detCluster) index(id string) int {
	for i, cfg := range c.cfgs {
		if cfg.NodeID == id {
			return i
		}
	}
	c.t.Fatalf("no coordinator %s", id)
	return -1
}

// TestPolicyIsReplicated: members whose config files differ (a rolling
// config change) answer the same policy — the founding leader's — and name
// the keys their file differs on; a leadership change does not change it.
func TestPolicyIsReplicated(t *testing.T) {
	c := newDetCluster(t, func(cfg *config.Server) {
		switch cfg.NodeID {
		case "c2":
			cfg.Policy.FailureTimeout = 4 * time.Second
		case "c3":
			cfg.Policy.LeaseTTL, cfg.Policy.FailureTimeout = 3*time.Second, 20*time.Second
		}
	})
	ctx := context.Background()
	get := func(id string) *waldenv1.GetPolicyResponse {
		var r *waldenv1.GetPolicyResponse
		c.waitFor(id+" answers the policy", 10*time.Second, func() bool {
			var err error
			r, err = c.brokers(id).GetPolicy(ctx, &waldenv1.GetPolicyRequest{})
			return err == nil
		})
		return r
	}
	first := get("c1")
	seeder := first.GetSeededBy()
	for _, id := range []string{"c1", "c2", "c3"} {
		r := get(id)
		if !proto.Equal(r.GetPolicy(), first.GetPolicy()) || r.GetSeededBy() != seeder {
			t.Fatalf("%s answers %v seeded by %s, c1 answers %v seeded by %s", id, r.GetPolicy(), r.GetSeededBy(), first.GetPolicy(), seeder)
		}
		if (id == seeder) != (len(r.GetConfigDrift()) == 0) {
			t.Fatalf("%s (seeded by %s) reports config drift %v", id, seeder, r.GetConfigDrift())
		}
	}
	if want := c.cfgs[c.index(seeder)].Policy.FailureTimeout.Milliseconds(); first.GetPolicy().GetFailureTimeoutMs() != want {
		t.Fatalf("failure_timeout %d, want the seeder's %d", first.GetPolicy().GetFailureTimeoutMs(), want)
	}
	// Leadership moves to a member whose file differs: the policy stays.
	old := c.leader()
	target := "c3"
	if old.cfg.NodeID == "c3" {
		target = "c2"
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := old.node.TransferLeadership(tctx, target); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("transfer: %v", err)
	}
	c.waitFor(target+" leads", 10*time.Second, func() bool { return c.leader().cfg.NodeID == target })
	if r := get(target); !proto.Equal(r.GetPolicy(), first.GetPolicy()) {
		t.Fatalf("after the leadership moved to %s: %v, before %v", target, r.GetPolicy(), first.GetPolicy())
	}
}

// TestManualFailoverOnAFreshLeaderWaitsForTheLease: a manual failover served
// right after a leader change still waits for the broker's lease.
func TestManualFailoverOnAFreshLeaderWaitsForTheLease(t *testing.T) {
	c := newDetCluster(t, nil)
	a1 := c.startAgent("b1", nil)
	c.waitAllAlive("b1")
	old := c.leader()
	target := c.pick("follower")
	tctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := old.node.TransferLeadership(tctx, target); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("transfer: %v", err)
	}
	c.waitFor(target+" leads", 10*time.Second, func() bool { return c.leader().cfg.NodeID == target })
	epoch := c.broker("b1").GetEpoch()
	var invalidAt, fencedAt time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		for invalidAt.IsZero() || fencedAt.IsZero() {
			now := time.Now()
			if invalidAt.IsZero() && !a1.Lease().Valid {
				invalidAt = now
			}
			if fencedAt.IsZero() && c.broker("b1").GetEpoch() != epoch {
				fencedAt = now
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	fctx, fcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer fcancel()
	if _, err := c.brokers(target).Failover(fctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "right after an election"}); err != nil {
		t.Fatalf("manual failover: %v", err)
	}
	<-done
	if !invalidAt.Before(fencedAt) {
		t.Fatalf("b1 was fenced %v before its lease turned invalid", invalidAt.Sub(fencedAt))
	}
}
