package gossip

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// State is a member's state as memberlist reported it through its callbacks.
// memberlist v0.7.0 never reports suspicion, so there is no suspect state.
type State int

// The states of a member.
const (
	// StateAlive: the member joined and has not been declared dead or left.
	StateAlive State = iota + 1
	// StateDead: memberlist declared the member dead (it stopped answering
	// direct and indirect probes and did not refute the suspicion).
	StateDead
	// StateLeft: the member announced that it was leaving, then left.
	StateLeft
)

func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return "unknown"
}

// Member is one member of the pool as this member knows it.
type Member struct {
	// Name is the member's unique name in the pool.
	Name string
	// Addr is its gossip "ip:port".
	Addr string
	// Meta is its metadata as last gossiped.
	Meta Meta
	// State is alive, dead or left.
	State State
	// Since is when this member last saw the state change, on the local
	// clock (monotonic reading included).
	Since time.Time
}

// Stats counts what the pool refused and what its consumer missed.
type Stats struct {
	// EventsDropped counts events dropped because the queue was full.
	EventsDropped uint64
	// EventsCoalesced counts Ping events merged into a pending one.
	EventsCoalesced uint64
	// EventsQueued is the number of events waiting in the queue now.
	EventsQueued int
	// Refused counts alive messages and merges refused because the member
	// belongs to another cluster or carries no valid metadata.
	Refused uint64
}

// Pool is this process's membership in the gossip pool. Its methods are safe
// for concurrent use.
type Pool struct {
	cfg   Config
	log   *slog.Logger
	ml    *memberlist.Memberlist
	local Member // Name and Addr fixed after Start

	queue  *eventQueue
	events chan Event
	done   chan struct{}
	wg     sync.WaitGroup

	metaMu    sync.Mutex
	meta      Meta
	metaBytes []byte

	mu           sync.Mutex
	members      map[string]*Member
	refuseLogged map[string]time.Time // member name → last refusal logged
	dropLogged   time.Time

	refused atomic.Uint64

	// lifecycle serializes UpdateMeta, Leave and Shutdown (memberlist
	// panics on Leave after Shutdown); left and stopped change only under
	// it and may be read without it.
	lifecycle sync.Mutex
	left      atomic.Bool
	stopped   atomic.Bool
}

// refuseLogEvery and dropLogEvery bound how often a repeated refusal of one
// member, or continued event drops, are logged (the counters count all).
const (
	refuseLogEvery = time.Minute
	dropLogEvery   = 10 * time.Second
)

// Start validates cfg, reads the encryption key file, binds the gossip
// address (or takes over cfg.Listener, closed when Start fails), and joins
// cfg.Join. A join that reaches nobody is logged, not returned: the pool
// keeps running and retries every RejoinInterval while it is alone, so that
// members may start in any order.
func Start(cfg Config) (p *Pool, err error) {
	if cfg.Listener != nil {
		cfg.BindAddr = cfg.Listener.Addr()
		defer func() {
			if err != nil {
				_ = cfg.Listener.Close()
			}
		}()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.Join = slices.Clone(cfg.Join)
	meta := cfg.Meta
	meta.ClusterName = cfg.ClusterName
	meta.Leaving = false
	metaBytes, err := meta.Encode()
	if err != nil {
		return nil, fmt.Errorf("gossip: start: %w", err)
	}

	var key []byte
	if cfg.EncryptionKeyFile != "" {
		if key, err = LoadEncryptionKey(cfg.EncryptionKeyFile); err != nil {
			return nil, err
		}
	}

	p = &Pool{
		cfg:          cfg,
		log:          cfg.Logger.With("component", "gossip", "node", cfg.NodeName),
		queue:        newEventQueue(cfg.EventQueueSize),
		events:       make(chan Event),
		done:         make(chan struct{}),
		meta:         meta,
		metaBytes:    metaBytes,
		members:      make(map[string]*Member),
		refuseLogged: make(map[string]time.Time),
	}

	mc, err := p.memberlistConfig(key)
	if err != nil {
		return nil, err
	}
	if mc.Transport, err = p.transport(mc); err != nil {
		return nil, err
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		if mc.Transport != nil {
			_ = mc.Transport.Shutdown()
		}
		return nil, fmt.Errorf("gossip: start memberlist on %s: %w", cfg.BindAddr, err)
	}
	p.ml = ml
	ln := ml.LocalNode()
	p.local = Member{Name: ln.Name, Addr: nodeAddr(ln)}

	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.queue.forward(p.events, p.done)
	}()

	p.log.Info("gossip pool started", "addr", p.local.Addr, "cluster", cfg.ClusterName,
		"role", meta.Role, "id", meta.ID, "encrypted", key != nil)

	if len(cfg.Join) > 0 {
		if n, err := p.Join(cfg.Join); err != nil {
			p.log.Warn("initial join reached no member; will retry while alone",
				"join", cfg.Join, "err", err)
		} else {
			p.log.Info("joined", "contacted", n)
		}
		if cfg.RejoinInterval > 0 {
			p.wg.Add(1)
			go p.rejoinLoop()
		}
	}
	return p, nil
}

func (p *Pool) memberlistConfig(key []byte) (*memberlist.Config, error) {
	cfg := p.cfg
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.NodeName
	bind, err := parseIPPort("listen", cfg.BindAddr, true)
	if err != nil {
		return nil, err
	}
	mc.BindAddr = bind.Addr().String()
	mc.BindPort = int(bind.Port())
	mc.AdvertisePort = int(bind.Port())
	if cfg.AdvertiseAddr != "" {
		adv, err := parseIPPort("advertise", cfg.AdvertiseAddr, false)
		if err != nil {
			return nil, err
		}
		mc.AdvertiseAddr = adv.Addr().String()
		mc.AdvertisePort = int(adv.Port())
	}
	mc.SecretKey = key

	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.IndirectChecks = cfg.IndirectChecks
	mc.SuspicionMult = cfg.SuspicionMult
	mc.SuspicionMaxTimeoutMult = cfg.SuspicionMaxTimeoutMult
	mc.RetransmitMult = cfg.RetransmitMult
	mc.AwarenessMaxMultiplier = cfg.AwarenessMaxMultiplier
	mc.GossipInterval = cfg.GossipInterval
	mc.GossipNodes = cfg.GossipNodes
	mc.GossipToTheDeadTime = cfg.GossipToTheDeadTime
	mc.PushPullInterval = cfg.PushPullInterval
	mc.TCPTimeout = cfg.TCPTimeout
	mc.DeadNodeReclaimTime = cfg.DeadNodeReclaimTime
	mc.EnableCompression = cfg.Compression
	mc.UDPBufferSize = cfg.PacketSize
	mc.HandoffQueueDepth = cfg.HandoffQueueDepth

	mc.Delegate = delegate{p}
	mc.Events = eventDelegate{p}
	mc.Ping = eventDelegate{p}
	mc.Alive = clusterGuard{p}
	mc.Merge = clusterGuard{p}
	mc.Logger = log.New(logWriter{cfg.Logger.With("node", cfg.NodeName)}, "", 0)
	return mc, nil
}

// transport is the memberlist transport of the pool: one on cfg.Listener
// when the caller bound it, else memberlist's own (nil: memberlist binds
// mc's address itself), with cfg.Faults applied to what it sends when set.
func (p *Pool) transport(mc *memberlist.Config) (memberlist.Transport, error) {
	cfg := p.cfg
	var base memberlist.NodeAwareTransport
	switch {
	case cfg.Listener != nil:
		base = newListenerTransport(cfg.Listener, mc.Logger)
	case cfg.Faults != nil:
		nt, err := newNetTransport(mc.BindAddr, mc.BindPort, mc.Logger)
		if err != nil {
			return nil, fmt.Errorf("gossip: start transport on %s: %w", cfg.BindAddr, err)
		}
		base = nt
	default:
		return nil, nil
	}
	if cfg.Faults != nil {
		return &faultTransport{NodeAwareTransport: base, faults: cfg.Faults}, nil
	}
	return base, nil
}

// rejoinLoop retries the configured Join addresses while this member sees
// no other live member.
func (p *Pool) rejoinLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.RejoinInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		if p.left.Load() || p.stopped.Load() || p.ml.NumMembers() > 1 {
			continue
		}
		n, err := p.Join(p.cfg.Join)
		switch {
		case err != nil && !failing:
			p.log.Warn("alone in the pool and rejoin failed; retrying", "join", p.cfg.Join,
				"every", p.cfg.RejoinInterval, "err", err)
			failing = true
		case err != nil:
			p.log.Debug("rejoin failed", "join", p.cfg.Join, "err", err)
		default:
			p.log.Info("rejoined the pool", "contacted", n)
			failing = false
		}
	}
}

// Join contacts the given "host:port" addresses and merges state with them.
// It returns how many it reached; the error (ErrJoin, with memberlist's
// reasons) only when it reached none. A member of another cluster, or one
// that uses another encryption key, is never reached.
func (p *Pool) Join(addrs []string) (int, error) {
	if p.isStopped() {
		return 0, ErrShutdown
	}
	if len(addrs) == 0 {
		return 0, fmt.Errorf("%w: no address given", ErrJoin)
	}
	n, err := p.ml.Join(addrs)
	if err != nil {
		if n > 0 {
			p.log.Debug("join reached some addresses", "contacted", n, "err", err)
			return n, nil
		}
		return 0, fmt.Errorf("%w: %s: %w", ErrJoin, strings.Join(addrs, ","), err)
	}
	return n, nil
}

// Events returns the channel of membership events, this member's own Join at
// start included. There is one channel per Pool; it is closed by Shutdown. Read it continuously: while nobody reads,
// events accumulate up to EventQueueSize and then the oldest are dropped
// (Stats.EventsDropped).
func (p *Pool) Events() <-chan Event { return p.events }

// Members returns every member this member has heard of, itself included,
// sorted by name: the live ones, and those memberlist declared dead or saw
// leave (kept until they come back).
func (p *Pool) Members() []Member {
	p.mu.Lock()
	out := make([]Member, 0, len(p.members))
	for _, m := range p.members {
		out = append(out, *m)
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// LocalNode returns this member: its name, advertised address and current
// metadata.
func (p *Pool) LocalNode() Member {
	p.metaMu.Lock()
	meta := p.meta
	p.metaMu.Unlock()
	m := p.local
	m.Meta = meta
	m.State = StateAlive
	if p.left.Load() {
		m.State = StateLeft
	}
	return m
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	dropped, coalesced, queued := p.queue.stats()
	return Stats{
		EventsDropped:   dropped,
		EventsCoalesced: coalesced,
		EventsQueued:    queued,
		Refused:         p.refused.Load(),
	}
}

// UpdateMeta replaces this member's metadata (ClusterName is kept, Role and
// ID may not change) and gossips it, waiting up to timeout for the broadcast
// to go out. The new metadata is in effect even when the wait times out.
func (p *Pool) UpdateMeta(m Meta, timeout time.Duration) error {
	p.lifecycle.Lock()
	defer p.lifecycle.Unlock()
	if p.stopped.Load() {
		return ErrShutdown
	}
	if p.left.Load() {
		return fmt.Errorf("gossip: update metadata: %w", ErrLeft)
	}
	p.metaMu.Lock()
	cur := p.meta
	p.metaMu.Unlock()
	if m.ClusterName != "" && m.ClusterName != cur.ClusterName {
		return fmt.Errorf("gossip: update metadata: %w", invalid("meta.cluster_name", "%q differs from cluster_name %q", m.ClusterName, cur.ClusterName))
	}
	if m.Role != cur.Role || m.ID != cur.ID {
		return fmt.Errorf("gossip: update metadata: %w", invalid("meta", "role and id may not change (%s/%s → %s/%s)", cur.Role, cur.ID, m.Role, m.ID))
	}
	m.ClusterName = cur.ClusterName
	m.Leaving = false
	return p.setMeta(m, timeout)
}

// setMeta encodes m, installs it and gossips it. Caller holds lifecycle.
func (p *Pool) setMeta(m Meta, timeout time.Duration) error {
	b, err := m.Encode()
	if err != nil {
		return fmt.Errorf("gossip: update metadata: %w", err)
	}
	p.metaMu.Lock()
	p.meta, p.metaBytes = m, b
	p.metaMu.Unlock()
	if err := p.ml.UpdateNode(timeout); err != nil {
		return fmt.Errorf("gossip: update metadata: %w", err)
	}
	return nil
}

// Leave announces that this member leaves, so that the others report it as
// left rather than dead, and waits up to timeout for each of the two
// broadcasts (the Leaving flag in its metadata, then memberlist's leave
// message). It does not stop the listeners: call Shutdown afterwards. Calling
// it again does nothing.
func (p *Pool) Leave(timeout time.Duration) error {
	p.lifecycle.Lock()
	defer p.lifecycle.Unlock()
	if p.stopped.Load() {
		return ErrShutdown
	}
	if p.left.Load() {
		return nil
	}
	p.metaMu.Lock()
	m := p.meta
	p.metaMu.Unlock()
	m.Leaving = true
	if err := p.setMeta(m, timeout); err != nil {
		// Others will report the member dead instead of left; still leave.
		p.log.Warn("leaving flag not confirmed sent", "err", err)
	}
	p.left.Store(true)
	if err := p.ml.Leave(timeout); err != nil {
		if strings.Contains(err.Error(), "timeout") {
			// The leave was broadcast; memberlist only could not see it
			// go out to the others within timeout (a small pool, peers
			// stopping too). They learn it from the broadcast or the
			// leaving flag: a graceful stop, not a failure to report.
			p.log.Info("left the pool; the others learn it as the broadcast reaches them", "timeout", timeout.String())
			return nil
		}
		return fmt.Errorf("gossip: leave: %w", err)
	}
	p.log.Info("left the pool")
	return nil
}

// Shutdown stops the listeners and every goroutine of the pool and closes
// the Events channel. Without a Leave first, the others see this member stop
// answering and eventually declare it dead. Calling it again does nothing.
func (p *Pool) Shutdown() error {
	p.lifecycle.Lock()
	if p.stopped.Load() {
		p.lifecycle.Unlock()
		return nil
	}
	p.stopped.Store(true)
	err := p.ml.Shutdown()
	close(p.done)
	p.lifecycle.Unlock()
	// Wait for the forwarder and the rejoin loop without holding lifecycle.
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("gossip: shutdown: %w", err)
	}
	p.log.Info("gossip pool shut down")
	return nil
}

func (p *Pool) isStopped() bool { return p.stopped.Load() }

// enqueue records a callback in the member table and the event queue. It is
// called from memberlist's goroutines and must stay short and non-blocking.
func (p *Pool) enqueue(kind EventKind, n *memberlist.Node, state State, rtt time.Duration) {
	now := time.Now()
	meta, _ := DecodeMeta(n.Meta)
	ev := Event{Kind: kind, Node: n.Name, Meta: meta, Addr: nodeAddr(n), RTT: rtt, State: state, At: now}

	if kind != EventPing {
		p.mu.Lock()
		m := p.members[n.Name]
		if m == nil {
			m = &Member{Name: n.Name}
			p.members[n.Name] = m
		}
		if m.State != state {
			m.Since = now
		}
		m.Addr, m.Meta, m.State = ev.Addr, meta, state
		p.mu.Unlock()
	}

	if p.queue.push(ev) {
		p.mu.Lock()
		logIt := now.Sub(p.dropLogged) >= dropLogEvery
		if logIt {
			p.dropLogged = now
		}
		p.mu.Unlock()
		if logIt {
			dropped, _, _ := p.queue.stats()
			p.log.Warn("event consumer too slow: dropping the oldest events; reconcile with Members",
				"dropped_total", dropped, "queue_size", p.cfg.EventQueueSize)
		}
	}
}

// checkMember refuses a member whose metadata is missing, undecodable or of
// another cluster. via is "alive" or "merge".
func (p *Pool) checkMember(n *memberlist.Node, via string) error {
	m, err := DecodeMeta(n.Meta)
	if err == nil && m.ClusterName == p.cfg.ClusterName {
		return nil
	}
	p.refused.Add(1)
	now := time.Now()
	p.mu.Lock()
	last, seen := p.refuseLogged[n.Name]
	logIt := !seen || now.Sub(last) >= refuseLogEvery
	if logIt {
		if len(p.refuseLogged) >= 1024 {
			clear(p.refuseLogged)
		}
		p.refuseLogged[n.Name] = now
	}
	p.mu.Unlock()
	what := describeMeta(n.Meta)
	if logIt {
		p.log.Warn("refused a member of another cluster", "peer", n.Name, "peer_addr", nodeAddr(n),
			"peer_meta", what, "cluster", p.cfg.ClusterName, "via", via, "refused_total", p.refused.Load())
	}
	return fmt.Errorf("%w: %s at %s has %s, this pool is %q", ErrForeignCluster, n.Name, nodeAddr(n), what, p.cfg.ClusterName)
}

// Addr is a convenience for tests and wiring: the "ip:port" other members
// use to join this one.
func (p *Pool) Addr() string { return p.local.Addr }
