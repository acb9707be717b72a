package gossip

import (
	"sync"
	"time"
)

// EventKind says what happened to a member.
type EventKind int

// The kinds of Event.
const (
	// EventJoin: memberlist learned of a live member, or one it had
	// declared dead or left came back.
	EventJoin EventKind = iota + 1
	// EventLeave: memberlist declared the member dead (it stopped answering
	// probes and did not refute the suspicion) or the member left. State
	// tells which. This is the only failure signal memberlist v0.7.0 gives.
	EventLeave
	// EventUpdate: a live member changed its metadata.
	EventUpdate
	// EventPing: this member's direct probe of the member completed; RTT
	// holds the round trip. Pending Ping events of one member are coalesced
	// into the latest.
	EventPing
)

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventLeave:
		return "leave"
	case EventUpdate:
		return "update"
	case EventPing:
		return "ping"
	}
	return "unknown"
}

// Event is one membership change or probe result seen by this member.
type Event struct {
	Kind EventKind
	// Node is the member's name in the pool.
	Node string
	// Meta is the member's metadata as last known (its zero value when it
	// could not be decoded, which the cluster check makes impossible for
	// any member other than one already refused).
	Meta Meta
	// Addr is the member's gossip "ip:port".
	Addr string
	// RTT is the probe's round trip (EventPing only).
	RTT time.Duration
	// State is StateAlive, or for EventLeave StateDead or StateLeft.
	State State
	// At is when this member's callback ran, read from the local clock;
	// compare it only with other times of this process (it carries the
	// monotonic reading).
	At time.Time
}

// eventQueue is a bounded FIFO between memberlist's callbacks (push, which
// never blocks) and one forwarding goroutine (pop). When full, push drops the
// oldest event. Ping events of one member are coalesced while pending.
type eventQueue struct {
	mu        sync.Mutex
	buf       []*Event // ring of len cap
	head, n   int
	pings     map[string]*Event // pending Ping event per member
	dropped   uint64
	coalesced uint64
	wake      chan struct{} // capacity 1: "the queue may be non-empty"
}

func newEventQueue(capacity int) *eventQueue {
	return &eventQueue{
		buf:   make([]*Event, capacity),
		pings: make(map[string]*Event),
		wake:  make(chan struct{}, 1),
	}
}

// push appends ev. It reports whether an older event was dropped to make
// room. It never blocks beyond the queue's own short critical section.
func (q *eventQueue) push(ev Event) (dropped bool) {
	q.mu.Lock()
	if ev.Kind == EventPing {
		if p := q.pings[ev.Node]; p != nil {
			p.RTT, p.At, p.Addr, p.Meta = ev.RTT, ev.At, ev.Addr, ev.Meta
			q.coalesced++
			q.mu.Unlock()
			return false
		}
	}
	if q.n == len(q.buf) {
		old := q.buf[q.head]
		q.forget(old)
		q.buf[q.head] = nil
		q.head = (q.head + 1) % len(q.buf)
		q.n--
		q.dropped++
		dropped = true
	}
	e := &ev
	q.buf[(q.head+q.n)%len(q.buf)] = e
	q.n++
	if e.Kind == EventPing {
		q.pings[e.Node] = e
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return dropped
}

// forget removes e from the pending-ping index. Caller holds mu.
func (q *eventQueue) forget(e *Event) {
	if e.Kind == EventPing && q.pings[e.Node] == e {
		delete(q.pings, e.Node)
	}
}

// pop removes and returns the oldest event.
func (q *eventQueue) pop() (Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return Event{}, false
	}
	e := q.buf[q.head]
	q.forget(e)
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return *e, true
}

func (q *eventQueue) stats() (dropped, coalesced uint64, queued int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dropped, q.coalesced, q.n
}

// forward moves events from q to out until done is closed, then closes out.
func (q *eventQueue) forward(out chan<- Event, done <-chan struct{}) {
	defer close(out)
	for {
		ev, ok := q.pop()
		if !ok {
			select {
			case <-q.wake:
				continue
			case <-done:
				return
			}
		}
		select {
		case out <- ev:
		case <-done:
			return
		}
	}
}
