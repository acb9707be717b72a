package server

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"

	"walden/gossip"
)

// Fault injection on every link of a coordinator, for the detection cluster
// tests and the false-positive soak:
//   - direct probes: probeFaults (detect_cluster_test.go), through the withProber option;
//   - gossip: one gossip.Faults per member (coordinators and agents), set on
//     both ends of a link, since a Faults acts on what its member sends;
//   - raft: streamFaults, which wraps the raft peer connections through the
//     withRaftCredentials option (the transport's client credentials see every
//     connection a member opens to a peer, and its remote address).

// streamFault is the fault on a raft link. A TCP stream does not lose
// bytes: a lost segment is sent again after a retransmission timeout, and
// everything behind it waits. So Loss is the probability that a written
// chunk is "lost" and delivered one RTO later (200 ms, Linux's minimum,
// doubling while the retransmission is lost too), Delay and Jitter are added
// to every chunk, and chunks stay in order (a late chunk holds back the
// ones behind it).
type streamFault struct {
	Loss          float64
	Delay, Jitter time.Duration
}

// streamRTO is the first retransmission timeout of a lost chunk.
const streamRTO = 200 * time.Millisecond

// streamFaults holds the faults of the raft links, by sending member and
// remote raft address ("*" for all of the member's links).
type streamFaults struct {
	mu    sync.Mutex
	rng   *rand.Rand
	links map[string]map[string]streamFault // from node id → to addr → fault

	// chunks counts the chunks written on a faulty link; lost those
	// delivered after a retransmission timeout; delayed those delivered late
	// for any reason.
	chunks, lost, delayed atomic.Uint64
}

func newStreamFaults(seed uint64) *streamFaults {
	return &streamFaults{rng: rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d)), links: map[string]map[string]streamFault{}}
}

// set installs sf on the raft messages from node to the member listening
// on addr (or "*").
func (f *streamFaults) set(from, to string, sf streamFault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.links[from] == nil {
		f.links[from] = map[string]streamFault{}
	}
	f.links[from][to] = sf
}

// delay decides how late a chunk written now from → to arrives.
func (f *streamFaults) delay(from, to string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	sf, ok := f.links[from][to]
	if !ok {
		if sf, ok = f.links[from]["*"]; !ok {
			return 0
		}
	}
	f.chunks.Add(1)
	d := sf.Delay
	if sf.Jitter > 0 {
		d += time.Duration(f.rng.Int64N(int64(sf.Jitter) + 1))
	}
	lost := false
	for rto := streamRTO; sf.Loss > 0 && f.rng.Float64() < sf.Loss; rto *= 2 {
		d += rto
		lost = true
	}
	if lost {
		f.lost.Add(1)
	}
	if d > 0 {
		f.delayed.Add(1)
	}
	return d
}

// creds wraps a member's raft client credentials so that every peer
// connection it opens goes through the faults.
func (f *streamFaults) creds(node string, inner credentials.TransportCredentials) credentials.TransportCredentials {
	return &faultyCreds{TransportCredentials: inner, f: f, from: node}
}

type faultyCreds struct {
	credentials.TransportCredentials
	f    *streamFaults
	from string
}

func (c *faultyCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	return newFaultyConn(conn, c.f, c.from, raw.RemoteAddr().String()), info, nil
}

func (c *faultyCreds) Clone() credentials.TransportCredentials {
	return &faultyCreds{TransportCredentials: c.TransportCredentials.Clone(), f: c.f, from: c.from}
}

// faultyConn delays what is written on a connection, in order, by the
// link's fault. Reads pass through: the messages of the other direction
// travel on the connection the peer opened.
type faultyConn struct {
	net.Conn
	f        *streamFaults
	from, to string

	mu   sync.Mutex
	last time.Time // release time of the last queued chunk
	q    chan faultyChunk
	done chan struct{}
	once sync.Once
}

type faultyChunk struct {
	b  []byte
	at time.Time
}

func newFaultyConn(conn net.Conn, f *streamFaults, from, to string) *faultyConn {
	c := &faultyConn{Conn: conn, f: f, from: from, to: to, q: make(chan faultyChunk, 1024), done: make(chan struct{})}
	go c.writer()
	return c
}

func (c *faultyConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	at := time.Now().Add(c.f.delay(c.from, c.to))
	if at.Before(c.last) {
		at = c.last
	}
	c.last = at
	ch := faultyChunk{b: append([]byte(nil), b...), at: at}
	c.mu.Unlock()
	select {
	case c.q <- ch:
		return len(b), nil
	case <-c.done:
		return 0, net.ErrClosed
	}
}

func (c *faultyConn) writer() {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case ch := <-c.q:
			if d := time.Until(ch.at); d > 0 {
				t.Reset(d)
				select {
				case <-c.done:
					return
				case <-t.C:
				}
			}
			if _, err := c.Conn.Write(ch.b); err != nil {
				_ = c.Close()
				return
			}
		}
	}
}

func (c *faultyConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}

// faultyDuplex delays both directions of one connection: what is written
// through its faultyConn (from → to), and what is read, by the link to →
// from. An agent's gRPC connection to a coordinator carries its renewals
// one way and their answers the other, so both must suffer the link's
// faults.
type faultyDuplex struct {
	*faultyConn
	rq   chan faultyRead
	rbuf []byte
	rerr error
}

type faultyRead struct {
	b   []byte
	err error
	at  time.Time
}

// newFaultyDuplex wraps conn: writes go through f's link from → to, reads
// through f's link back (to → from), each chunk in order.
func newFaultyDuplex(conn net.Conn, f *streamFaults, from, to, back string) *faultyDuplex {
	d := &faultyDuplex{faultyConn: newFaultyConn(conn, f, from, to), rq: make(chan faultyRead, 1024)}
	go d.reader(back, from)
	return d
}

// reader reads the underlying connection and queues each chunk with the
// instant it may be delivered.
func (d *faultyDuplex) reader(from, to string) {
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := d.Conn.Read(buf)
		at := time.Now().Add(d.f.delay(from, to))
		if at.Before(last) {
			at = last
		}
		last = at
		select {
		case d.rq <- faultyRead{b: buf[:n], err: err, at: at}:
		case <-d.done:
			return
		}
		if err != nil {
			return
		}
	}
}

func (d *faultyDuplex) Read(b []byte) (int, error) {
	for len(d.rbuf) == 0 {
		if d.rerr != nil {
			return 0, d.rerr
		}
		var r faultyRead
		select {
		case r = <-d.rq:
		case <-d.done:
			return 0, net.ErrClosed
		}
		if w := time.Until(r.at); w > 0 {
			t := time.NewTimer(w)
			select {
			case <-t.C:
			case <-d.done:
				t.Stop()
				return 0, net.ErrClosed
			}
		}
		d.rbuf, d.rerr = r.b, r.err
	}
	n := copy(b, d.rbuf)
	d.rbuf = d.rbuf[n:]
	return n, nil
}

// linkFaults are the faults of every link of a test cluster: probes,
// gossip and raft.
type linkFaults struct {
	mu     sync.Mutex // guards gossip
	probes *probeFaults
	raft   *streamFaults
	// agents are the links between the agents and the coordinators' admin
	// endpoints (renewals and registrations): by broker id → admin address
	// one way, coordinator id → agentLink(broker id) the other.
	agents *streamFaults
	gossip map[string]*gossip.Faults // by coordinator id or broker id
}

func newLinkFaults() *linkFaults {
	return &linkFaults{probes: newProbeFaults(), raft: newStreamFaults(3), agents: newStreamFaults(5), gossip: map[string]*gossip.Faults{}}
}

// agentLink names the agent end of an agent's link in linkFaults.agents.
func agentLink(broker string) string { return "agent/" + broker }

// gossipFor returns the gossip faults of a member, made on first use with a
// seed derived from its name.
func (l *linkFaults) gossipFor(member string) *gossip.Faults {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.gossip[member]; ok {
		return f
	}
	var seed uint64 = 17
	for _, r := range member {
		seed = seed*31 + uint64(r)
	}
	f := gossip.NewFaults(seed)
	l.gossip[member] = f
	return f
}

// raftOption makes member open its raft peer connections through l.raft.
func (l *linkFaults) raftOption(member string) Option {
	return withRaftCredentials(func(creds credentials.TransportCredentials) credentials.TransportCredentials {
		return l.raft.creds(member, creds)
	})
}

// faultCounts sums what the faults did so far.
type faultCounts struct {
	// probes counts the probes that met a fault, probesDropped those lost.
	probes, probesDropped                 int
	gossipDropped, gossipDelayed          uint64
	gossipStreamsBlocked                  uint64
	raftChunks, raftLost, raftDelayedOnly uint64
	// agentChunks counts the chunks of the agents' connections (renewals
	// and their answers) that met a fault, agentLost those delivered one
	// retransmission timeout late.
	agentChunks, agentLost uint64
}

func (l *linkFaults) counts() faultCounts {
	var n faultCounts
	l.probes.mu.Lock()
	for _, p := range l.probes.faulty {
		n.probes += p
	}
	for _, p := range l.probes.dropped {
		n.probesDropped += p
	}
	l.probes.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.gossip {
		s := f.Stats()
		n.gossipDropped += s.PacketsDropped
		n.gossipDelayed += s.PacketsDelayed
		n.gossipStreamsBlocked += s.StreamsBlocked
	}
	n.raftChunks, n.raftLost = l.raft.chunks.Load(), l.raft.lost.Load()
	n.raftDelayedOnly = l.raft.delayed.Load() - n.raftLost
	n.agentChunks, n.agentLost = l.agents.chunks.Load(), l.agents.lost.Load()
	return n
}

func (n faultCounts) sub(m faultCounts) faultCounts {
	return faultCounts{
		probes: n.probes - m.probes, probesDropped: n.probesDropped - m.probesDropped,
		gossipDropped: n.gossipDropped - m.gossipDropped, gossipDelayed: n.gossipDelayed - m.gossipDelayed,
		gossipStreamsBlocked: n.gossipStreamsBlocked - m.gossipStreamsBlocked,
		raftChunks:           n.raftChunks - m.raftChunks, raftLost: n.raftLost - m.raftLost,
		raftDelayedOnly: n.raftDelayedOnly - m.raftDelayedOnly,
		agentChunks:     n.agentChunks - m.agentChunks, agentLost: n.agentLost - m.agentLost,
	}
}

// degradeCoordinator puts loss, delay and jitter on every link of the
// coordinator node: its direct probes, its gossip to and from every member
// started so far, its raft streams to and from the other coordinators, and
// the agents' connections to it (their lease renewals and the answers).
func (c *detCluster) degradeCoordinator(node string, loss float64, delay, jitter time.Duration) {
	c.t.Helper()
	f := c.faults
	f.probes.setLossy(node, probeFault{loss: loss, delay: delay, jitter: jitter})
	lf := gossip.LinkFault{Drop: loss, Delay: delay, Jitter: jitter}
	f.gossipFor(node).Set(gossip.AllLinks, lf)
	addr := c.gossipAddr(node)
	f.mu.Lock()
	others := make([]*gossip.Faults, 0, len(f.gossip))
	for member, g := range f.gossip {
		if member != node {
			others = append(others, g)
		}
	}
	f.mu.Unlock()
	for _, g := range others {
		g.Set(addr, lf)
	}
	sf := streamFault{Loss: loss, Delay: delay, Jitter: jitter}
	f.raft.set(node, "*", sf)
	for _, cfg := range c.cfgs {
		if cfg.NodeID != node {
			f.raft.set(cfg.NodeID, c.raftAddr(node), sf)
		}
	}
	f.agents.set(node, "*", sf)
	admin := c.conns[node].Target()
	for broker := range c.agentAddrs {
		f.agents.set(agentLink(broker), admin, sf)
	}
}

// cutCoordinatorFromBroker cuts every link between the coordinator node and
// the agent of broker: the direct probes, and gossip in both directions.
func (c *detCluster) cutCoordinatorFromBroker(node, broker string) {
	c.t.Helper()
	c.faults.probes.setCut(node, c.agentAddrs[broker], true)
	c.faults.gossipFor(node).Set(c.agentGossipAddrs[broker], gossip.Cut())
	c.faults.gossipFor(broker).Set(c.gossipAddr(node), gossip.Cut())
}

func (c *detCluster) gossipAddr(node string) string {
	for i, cfg := range c.cfgs {
		if cfg.NodeID == node {
			return c.gossip[i]
		}
	}
	c.t.Fatalf("no coordinator %s", node)
	return ""
}

func (c *detCluster) raftAddr(node string) string {
	for _, cfg := range c.cfgs {
		if cfg.NodeID == node {
			return cfg.Listen.Raft
		}
	}
	c.t.Fatalf("no coordinator %s", node)
	return ""
}
