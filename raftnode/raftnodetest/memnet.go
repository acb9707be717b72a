package raftnodetest

import (
	"context"
	"errors"
	"math/rand"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"walden/raftnode"
)

// Network is an in-memory network for tests: it hands out one Transport per
// member and injects faults between them — random drops, delays with
// jitter, partitions and isolation. Randomness comes from one seeded source,
// so a run is repeatable up to goroutine scheduling.
//
// Messages are marshaled on Send and unmarshaled on delivery (no sharing
// between members). Each (from, to) link delivers in order from one
// goroutine; a delayed message also delays the ones queued behind it on the
// same link. A message cut by a partition, or sent to a member that is down,
// is reported unreachable to the sender (and a snapshot reported failed), as
// a broken stream would be; a randomly dropped message is lost silently. A
// message the receiver refuses because it removed the sender
// (raftnode.RemovedError) is reported to the sender with ReportRemoved, as
// the gRPC transport does.
type Network struct {
	mu         sync.Mutex
	rng        *rand.Rand
	transports map[uint64]*MemTransport
	drops      map[memLink]float64
	delays     map[memLink]memDelay
	groups     map[uint64]int // partition group by member; empty: no partition
	isolated   map[uint64]bool
	snapshots  map[uint64]int // MsgSnap delivered, by receiver
	delivered  int
	dropped    int
}

var _ raftnode.Transport = (*MemTransport)(nil)

type memLink struct{ from, to uint64 }

type memDelay struct{ d, jitter time.Duration }

// wildcard matches every member in Drop and Delay.
const wildcard = "*"

// NewNetwork returns an empty network whose faults draw from seed.
func NewNetwork(seed int64) *Network {
	return &Network{
		rng:        rand.New(rand.NewSource(seed)),
		transports: make(map[uint64]*MemTransport),
		drops:      make(map[memLink]float64),
		delays:     make(map[memLink]memDelay),
		groups:     make(map[uint64]int),
		isolated:   make(map[uint64]bool),
		snapshots:  make(map[uint64]int),
	}
}

// Transport returns a new Transport for memberID, replacing (and closing)
// any earlier one of the same member, as a restarted process would.
func (nw *Network) Transport(memberID string) *MemTransport {
	t := &MemTransport{
		nw:    nw,
		id:    raftnode.RaftID(memberID),
		peers: make(map[uint64]*memPeer),
		done:  make(chan struct{}),
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	nw.mu.Lock()
	old := nw.transports[t.id]
	nw.transports[t.id] = t
	nw.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return t
}

func linkOf(from, to string) memLink {
	l := memLink{}
	if from != wildcard {
		l.from = raftnode.RaftID(from)
	}
	if to != wildcard {
		l.to = raftnode.RaftID(to)
	}
	return l
}

// Drop loses messages from → to with probability p (0 removes the rule).
// Either id may be "*" for every member.
func (nw *Network) Drop(from, to string, p float64) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if p <= 0 {
		delete(nw.drops, linkOf(from, to))
		return
	}
	nw.drops[linkOf(from, to)] = p
}

// Delay holds messages from → to for d plus a uniform random jitter in
// [0, jitter). Either id may be "*" for every member.
func (nw *Network) Delay(from, to string, d, jitter time.Duration) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if d <= 0 && jitter <= 0 {
		delete(nw.delays, linkOf(from, to))
		return
	}
	nw.delays[linkOf(from, to)] = memDelay{d: d, jitter: jitter}
}

// Partition splits the members into groups that cannot talk to each other.
// Members not listed form one more group.
func (nw *Network) Partition(groups ...[]string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.groups = make(map[uint64]int)
	for i, g := range groups {
		for _, id := range g {
			nw.groups[raftnode.RaftID(id)] = i + 1
		}
	}
}

// Isolate cuts memberID off from every other member.
func (nw *Network) Isolate(memberID string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.isolated[raftnode.RaftID(memberID)] = true
}

// Heal removes every fault: partitions, isolation, drops and delays.
func (nw *Network) Heal() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.groups = make(map[uint64]int)
	nw.isolated = make(map[uint64]bool)
	nw.drops = make(map[memLink]float64)
	nw.delays = make(map[memLink]memDelay)
}

// SnapshotsReceived is the number of MsgSnap messages delivered to memberID.
func (nw *Network) SnapshotsReceived(memberID string) int {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.snapshots[raftnode.RaftID(memberID)]
}

// Counts returns the number of messages delivered and dropped so far.
func (nw *Network) Counts() (delivered, dropped int) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.delivered, nw.dropped
}

// cutLocked reports whether a partition or isolation separates from and to.
func (nw *Network) cutLocked(from, to uint64) bool {
	if nw.isolated[from] || nw.isolated[to] {
		return true
	}
	return nw.groups[from] != nw.groups[to]
}

func (nw *Network) ruleLocked(from, to uint64) (drop float64, delay memDelay) {
	for _, l := range []memLink{{from, to}, {from, 0}, {0, to}, {0, 0}} {
		if p, ok := nw.drops[l]; ok && drop == 0 {
			drop = p
		}
		if d, ok := nw.delays[l]; ok && delay == (memDelay{}) {
			delay = d
		}
	}
	return drop, delay
}

// MemTransport is one member's endpoint on a Network (implements Transport).
type MemTransport struct {
	nw     *Network
	id     uint64
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	handler raftnode.Handler
	peers   map[uint64]*memPeer
	closed  bool
	wg      sync.WaitGroup
	done    chan struct{}
}

type memPeer struct {
	queue     chan memEnvelope
	reachable bool
	last      time.Time // delivery time of the last message queued
}

type memEnvelope struct {
	data      []byte
	snap      bool
	deliverAt time.Time
}

const memQueueSize = 4096

// Start begins delivering messages to h.
func (t *MemTransport) Start(h raftnode.Handler) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.handler = h
	return nil
}

func (t *MemTransport) handlerOf() raftnode.Handler {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	return t.handler
}

// Send queues msgs to their peers; it never blocks.
func (t *MemTransport) Send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		t.send(m)
	}
}

func (t *MemTransport) send(m *raftpb.Message) {
	to := m.GetTo()
	data, err := proto.Marshal(m)
	if err != nil {
		return
	}
	snap := m.GetType() == raftpb.MsgSnap

	t.nw.mu.Lock()
	cut := t.nw.cutLocked(t.id, to)
	dropP, delay := t.nw.ruleLocked(t.id, to)
	lost := !cut && dropP > 0 && t.nw.rng.Float64() < dropP
	wait := delay.d
	if delay.jitter > 0 {
		wait += time.Duration(t.nw.rng.Int63n(int64(delay.jitter)))
	}
	if cut || lost {
		t.nw.dropped++
	}
	t.nw.mu.Unlock()

	t.mu.Lock()
	p, ok := t.peers[to]
	if t.closed || !ok {
		t.mu.Unlock()
		t.report(to, snap, false)
		return
	}
	if cut {
		p.reachable = false
		t.mu.Unlock()
		t.report(to, snap, false)
		return
	}
	if lost {
		t.mu.Unlock()
		if snap {
			t.report(to, snap, false)
		}
		return
	}
	at := time.Now().Add(wait)
	if at.Before(p.last) {
		at = p.last // keep per-link order
	}
	p.last = at
	select {
	case p.queue <- memEnvelope{data: data, snap: snap, deliverAt: at}:
		t.mu.Unlock()
	default:
		t.mu.Unlock()
		t.report(to, snap, false)
	}
}

// report tells the local handler about an undelivered (or delivered
// snapshot) message, off the caller's goroutine.
func (t *MemTransport) report(to uint64, snap, delivered bool) {
	h := t.handlerOf()
	if h == nil {
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		if !delivered {
			h.ReportUnreachable(to)
		}
		if snap {
			status := raft.SnapshotFailure
			if delivered {
				status = raft.SnapshotFinish
			}
			h.ReportSnapshot(to, status)
		}
	}()
}

// AddPeer starts a link to peer id; addr is ignored (members are found by
// id on the Network).
func (t *MemTransport) AddPeer(id uint64, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || id == t.id {
		return
	}
	if _, ok := t.peers[id]; ok {
		return
	}
	p := &memPeer{queue: make(chan memEnvelope, memQueueSize), reachable: true}
	t.peers[id] = p
	t.wg.Add(1)
	go t.runLink(id, p)
}

// RemovePeer stops the link to peer id; queued messages are discarded.
func (t *MemTransport) RemovePeer(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.peers[id]; ok {
		delete(t.peers, id)
		close(p.queue)
	}
}

// Reachable reports whether the last message to id was delivered.
func (t *MemTransport) Reachable(id uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.peers[id]
	return ok && p.reachable
}

// Close stops every link; messages in flight are lost.
func (t *MemTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	for id, p := range t.peers {
		delete(t.peers, id)
		close(p.queue)
	}
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
	return nil
}

func (t *MemTransport) runLink(to uint64, p *memPeer) {
	defer t.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for env := range p.queue {
		if d := time.Until(env.deliverAt); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-t.ctx.Done():
				return
			}
		}
		ok := t.deliver(to, env)
		t.mu.Lock()
		p.reachable = ok
		t.mu.Unlock()
		if !ok || env.snap {
			t.report(to, env.snap, ok)
		}
	}
}

// deliver steps one message into the receiving member, unless the member is
// down or a fault appeared while the message was in flight.
func (t *MemTransport) deliver(to uint64, env memEnvelope) bool {
	t.nw.mu.Lock()
	dst := t.nw.transports[to]
	cut := t.nw.cutLocked(t.id, to)
	t.nw.mu.Unlock()
	if dst == nil || cut {
		t.countDrop()
		return false
	}
	h := dst.handlerOf()
	if h == nil {
		t.countDrop()
		return false
	}
	m := new(raftpb.Message)
	if err := proto.Unmarshal(env.data, m); err != nil {
		t.countDrop()
		return false
	}
	ctx, cancel := context.WithTimeout(t.ctx, time.Second)
	defer cancel()
	if err := h.Process(ctx, m); err != nil {
		t.countDrop()
		var removed *raftnode.RemovedError
		if errors.As(err, &removed) {
			if self := t.handlerOf(); self != nil {
				self.ReportRemoved(to, removed.Index)
			}
		}
		return false
	}
	t.nw.mu.Lock()
	t.nw.delivered++
	if env.snap {
		t.nw.snapshots[to]++
	}
	t.nw.mu.Unlock()
	return true
}

func (t *MemTransport) countDrop() {
	t.nw.mu.Lock()
	t.nw.dropped++
	t.nw.mu.Unlock()
}
