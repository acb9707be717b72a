package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestEventQueueDropsOldest(t *testing.T) {
	q := newEventQueue(3)
	for i := range 5 {
		dropped := q.push(Event{Kind: EventUpdate, Node: fmt.Sprint("n", i)})
		if want := i >= 3; dropped != want {
			t.Fatalf("push %d: dropped = %v, want %v", i, dropped, want)
		}
	}
	dropped, coalesced, queued := q.stats()
	if dropped != 2 || coalesced != 0 || queued != 3 {
		t.Fatalf("stats = dropped %d coalesced %d queued %d, want 2 0 3", dropped, coalesced, queued)
	}
	for _, want := range []string{"n2", "n3", "n4"} {
		ev, ok := q.pop()
		if !ok || ev.Node != want {
			t.Fatalf("pop = %+v, %v; want %s", ev, ok, want)
		}
	}
	if ev, ok := q.pop(); ok {
		t.Fatalf("pop from empty queue = %+v", ev)
	}
}

func TestEventQueueCoalescesPings(t *testing.T) {
	q := newEventQueue(4)
	t0 := time.Unix(100, 0)
	q.push(Event{Kind: EventJoin, Node: "a"})
	for i := range 10 {
		q.push(Event{Kind: EventPing, Node: "a", RTT: time.Duration(i) * time.Millisecond, At: t0.Add(time.Duration(i))})
		q.push(Event{Kind: EventPing, Node: "b", RTT: time.Duration(100+i) * time.Millisecond})
	}
	q.push(Event{Kind: EventLeave, Node: "a"})
	dropped, coalesced, queued := q.stats()
	if dropped != 0 || coalesced != 18 || queued != 4 {
		t.Fatalf("stats = dropped %d coalesced %d queued %d, want 0 18 4", dropped, coalesced, queued)
	}
	want := []Event{
		{Kind: EventJoin, Node: "a"},
		{Kind: EventPing, Node: "a", RTT: 9 * time.Millisecond, At: t0.Add(9)},
		{Kind: EventPing, Node: "b", RTT: 109 * time.Millisecond},
		{Kind: EventLeave, Node: "a"},
	}
	for _, w := range want {
		ev, ok := q.pop()
		if !ok || ev != w {
			t.Fatalf("pop = %+v, %v; want %+v", ev, ok, w)
		}
	}
	// Once popped, a ping is no longer pending: the next one is queued anew.
	q.push(Event{Kind: EventPing, Node: "a", RTT: time.Second})
	if ev, ok := q.pop(); !ok || ev.RTT != time.Second {
		t.Fatalf("pop = %+v, %v; want the new ping", ev, ok)
	}
}

func TestEventQueueDroppedPingIsForgotten(t *testing.T) {
	q := newEventQueue(2)
	q.push(Event{Kind: EventPing, Node: "a", RTT: 1})
	q.push(Event{Kind: EventJoin, Node: "b"})
	q.push(Event{Kind: EventJoin, Node: "c"}) // drops the ping of a
	q.push(Event{Kind: EventPing, Node: "a", RTT: 2})
	dropped, coalesced, _ := q.stats()
	if dropped != 2 || coalesced != 0 {
		t.Fatalf("dropped %d coalesced %d, want 2 0 (a dropped ping must not absorb later ones)", dropped, coalesced)
	}
	var got []string
	for {
		ev, ok := q.pop()
		if !ok {
			break
		}
		got = append(got, fmt.Sprintf("%s:%s:%d", ev.Kind, ev.Node, ev.RTT))
	}
	if s := strings.Join(got, " "); s != "join:c:0 ping:a:2" {
		t.Fatalf("queue holds %q", s)
	}
}

func TestEventQueueForward(t *testing.T) {
	q := newEventQueue(8)
	out := make(chan Event)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() { q.forward(out, done); close(finished) }()

	q.push(Event{Kind: EventJoin, Node: "a"})
	q.push(Event{Kind: EventJoin, Node: "b"})
	for _, want := range []string{"a", "b"} {
		select {
		case ev := <-out:
			if ev.Node != want {
				t.Fatalf("got %s, want %s", ev.Node, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("forward did not deliver")
		}
	}
	// Blocked on a consumer that never reads: done still stops it.
	q.push(Event{Kind: EventJoin, Node: "c"})
	close(done)
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("forward did not stop")
	}
	if _, ok := <-out; ok {
		t.Fatal("out not closed")
	}
}

// lockedBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestLogWriterLevels(t *testing.T) {
	var buf lockedBuffer
	w := logWriter{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	for _, line := range []string{
		"[DEBUG] memberlist: noisy\n",
		"[INFO] memberlist: hello\n",
		"[WARN] memberlist: careful\n",
		"[ERR] memberlist: broken\n",
		"unprefixed\n",
	} {
		if n, err := w.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	out := buf.String()
	for _, want := range []string{
		`level=INFO msg=hello component=memberlist`,
		`level=WARN msg=careful component=memberlist`,
		`level=ERROR msg=broken component=memberlist`,
		`level=INFO msg=unprefixed`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "noisy") {
		t.Errorf("debug line logged at info level:\n%s", out)
	}
}

func TestClusterGuard(t *testing.T) {
	var buf lockedBuffer
	p := &Pool{
		cfg:          Config{ClusterName: "demo"},
		log:          slog.New(slog.NewTextHandler(&buf, nil)),
		refuseLogged: map[string]time.Time{},
	}
	g := clusterGuard{p}
	enc := func(cluster string) []byte {
		b, err := Meta{Role: RoleAgent, ClusterName: cluster, ID: "b1"}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if err := g.NotifyAlive(&memberlist.Node{Name: "agent/b1", Meta: enc("demo")}); err != nil {
		t.Fatalf("same cluster refused: %v", err)
	}
	for _, n := range []*memberlist.Node{
		{Name: "agent/x1", Meta: enc("other")},
		{Name: "agent/x1", Meta: enc("other")},
		{Name: "plain", Meta: nil},
		{Name: "junk", Meta: []byte("junk")},
	} {
		if err := g.NotifyAlive(n); !errors.Is(err, ErrForeignCluster) {
			t.Errorf("NotifyAlive(%s) = %v, want ErrForeignCluster", n.Name, err)
		}
	}
	err := g.NotifyMerge([]*memberlist.Node{{Name: "agent/b1", Meta: enc("demo")}, {Name: "agent/x2", Meta: enc("other")}})
	if !errors.Is(err, ErrForeignCluster) || !strings.Contains(err.Error(), `cluster "other"`) {
		t.Errorf("NotifyMerge with a foreign member = %v", err)
	}
	if err := g.NotifyMerge([]*memberlist.Node{{Name: "agent/b1", Meta: enc("demo")}}); err != nil {
		t.Errorf("NotifyMerge of own cluster = %v", err)
	}
	if got := p.refused.Load(); got != 5 {
		t.Errorf("refused = %d, want 5", got)
	}
	out := buf.String()
	// The repeated refusal of agent/x1 is counted but logged once.
	if n := strings.Count(out, "peer=agent/x1"); n != 1 {
		t.Errorf("agent/x1 refusal logged %d times, want 1:\n%s", n, out)
	}
	for _, want := range []string{"peer=plain", "peer=junk", "peer=agent/x2", "refused a member of another cluster"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
