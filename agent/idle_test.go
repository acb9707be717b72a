package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"walden/agent"
	"walden/config"
	"walden/internal/testutil"
)

// TestIdleCallConnectionsClose: the gRPC connection an agent registered
// over closes once idle for Options.CallIdleTimeout, so that the
// coordinators no longer hold it, while the renewals go on over their own
// connections and the lease stays valid. Over the gRPC stream
// (renewals.transport stream) the stream's connections stay: a connection
// with an open stream is never idle.
func TestIdleCallConnectionsClose(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-member cluster")
	}
	coords := &heldConns{open: map[string]bool{}, accepted: map[string]bool{}}
	cl := startTestClusterWith(t, func(p *config.Policy) {
		p.LeaseTTL, p.DriftMargin, p.FailureTimeout = time.Second, 200*time.Millisecond, 3*time.Second
	}, coords.listener)
	for _, tc := range []struct {
		transport string
		keep      int // the agent's gRPC connections each coordinator holds once idle
	}{
		{config.RenewalsFrames, 0},
		{config.RenewalsStream, 1},
	} {
		t.Run(tc.transport, func(t *testing.T) {
			cfg := config.DefaultAgentConfig()
			cfg.BrokerID, cfg.ClusterName = "b-"+tc.transport, "demo"
			for _, m := range cl.members {
				cfg.Coordinators = append(cfg.Coordinators, m.admin)
			}
			cfg.Listen = "127.0.0.1:0"
			cfg.WAL = config.WALLocation{Path: "/var/lib/broker/" + cfg.BrokerID + ".wal"}
			cfg.LeaseSafetyMargin = 100 * time.Millisecond
			cfg.Gossip.BindAddr = "127.0.0.1:0"
			cfg.Gossip.Join = cl.gossip
			cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
			cfg.Gossip.GossipInterval = 50 * time.Millisecond
			cfg.Renewals.Transport = tc.transport

			// The agent's gRPC connections, by local address: the
			// coordinators' side of each is its remote address.
			var mu sync.Mutex
			var mine []string
			dial := func(ctx context.Context, addr string) (net.Conn, error) {
				var d net.Dialer
				c, err := d.DialContext(ctx, "tcp", addr)
				if err == nil {
					mu.Lock()
					mine = append(mine, c.LocalAddr().String())
					mu.Unlock()
				}
				return c, err
			}
			held := func() []string {
				mu.Lock()
				defer mu.Unlock()
				return coords.held(mine)
			}
			var granted atomic.Int64
			a, err := agent.New(cfg, agent.Options{Logger: slog.New(slog.DiscardHandler), RegisterBackoffMax: 200 * time.Millisecond,
				CallIdleTimeout: 300 * time.Millisecond,
				DialOptions:     []grpc.DialOption{grpc.WithContextDialer(dial)},
				ObserveRenewal: func(result string) {
					if result == "granted" {
						granted.Add(1)
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Stop(false) })
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline(15*time.Second))
			defer cancel()
			if _, err := a.WaitRegistered(ctx); err != nil {
				t.Fatal(err)
			}
			// The registration went over a gRPC connection the
			// coordinators accepted (it may have closed already).
			keep := tc.keep * len(cl.members)
			testutil.Eventually(t, 10*time.Second, "the registration's and the streams' connections accepted", func() error {
				mu.Lock()
				defer mu.Unlock()
				if n := coords.seen(mine); n < keep+1 {
					return fmt.Errorf("%d of the agent's gRPC connections accepted, want at least %d", n, keep+1)
				}
				return nil
			})
			var idle []string
			testutil.Eventually(t, 10*time.Second, "the idle registration connection closed", func() error {
				if idle = held(); len(idle) != keep {
					return fmt.Errorf("the coordinators hold %d of the agent's gRPC connections (%v), want %d", len(idle), idle, keep)
				}
				return nil
			})
			// Renewals go on, each coordinator's several times, and the
			// lease stays valid; the connections that stay are the same.
			from := granted.Load()
			testutil.Eventually(t, 10*time.Second, "renewals granted after the connection closed", func() error {
				if n := granted.Load() - from; n < 3*int64(len(cl.members)) {
					return fmt.Errorf("%d grants since", n)
				}
				if l := a.Lease(); !l.Valid {
					return fmt.Errorf("lease %+v", l)
				}
				return nil
			})
			if now := held(); !slices.Equal(now, idle) {
				t.Fatalf("the coordinators hold the agent's gRPC connections %v, held %v before the renewals", now, idle)
			}
		})
	}
}

// heldConns records the connections the coordinators' admin listeners
// accepted, by remote address, and which of them are still open.
type heldConns struct {
	mu             sync.Mutex
	open, accepted map[string]bool
}

func (h *heldConns) listener(l net.Listener) net.Listener { return &heldListener{Listener: l, h: h} }

// held returns those of addrs whose connections are open, sorted.
func (h *heldConns) held(addrs []string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, a := range addrs {
		if h.open[a] {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// seen counts those of addrs whose connections were accepted.
func (h *heldConns) seen(addrs []string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, a := range addrs {
		if h.accepted[a] {
			n++
		}
	}
	return n
}

type heldListener struct {
	net.Listener
	h *heldConns
}

func (l *heldListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	addr := c.RemoteAddr().String()
	l.h.mu.Lock()
	l.h.open[addr], l.h.accepted[addr] = true, true
	l.h.mu.Unlock()
	return &heldConn{Conn: c, h: l.h, addr: addr}, nil
}

type heldConn struct {
	net.Conn
	h    *heldConns
	addr string
	once sync.Once
}

func (c *heldConn) Close() error {
	c.once.Do(func() {
		c.h.mu.Lock()
		delete(c.h.open, c.addr)
		c.h.mu.Unlock()
	})
	return c.Conn.Close()
}
