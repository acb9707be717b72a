package raftnode

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

// testLogger discards logs unless WALDEN_TEST_LOG is set.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("WALDEN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func TestRaftIDDeterministicNonZero(t *testing.T) {
	seen := make(map[uint64]string)
	for i := range 1000 {
		name := fmt.Sprintf("c%d", i)
		id := RaftID(name)
		if id == 0 {
			t.Fatalf("RaftID(%q) = 0", name)
		}
		if id != RaftID(name) {
			t.Fatalf("RaftID(%q) not deterministic", name)
		}
		if other, dup := seen[id]; dup {
			t.Fatalf("RaftID(%q) == RaftID(%q)", name, other)
		}
		seen[id] = name
	}
}

func TestRequestIDsUniqueAndPrefixed(t *testing.T) {
	g := newRequestIDs("c1", time.Unix(0, 12345))
	prefix := (RaftID("c1") & 0xffff) << requestCounterBits
	seen := make(map[uint64]bool)
	for range 10000 {
		id := g.Next()
		if id == 0 || seen[id] {
			t.Fatalf("request id %x is zero or repeated", id)
		}
		if id&^(1<<requestCounterBits-1) != prefix {
			t.Fatalf("request id %x lacks member prefix %x", id, prefix)
		}
		seen[id] = true
	}
}

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		return Config{ClusterName: "demo", NodeID: "c1", InitialCluster: []*waldenv1.MemberContext{
			{Id: "c1", RaftAddr: "127.0.0.1:7101"}, {Id: "c2", RaftAddr: "127.0.0.1:7102"},
		}}
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error; "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no cluster", func(c *Config) { c.ClusterName = "" }, "cluster_name"},
		{"no node", func(c *Config) { c.NodeID = "" }, "node_id"},
		{"election not above heartbeat", func(c *Config) { c.ElectionTicks, c.HeartbeatTicks = 2, 2 }, "election_ticks"},
		{"tiny tick", func(c *Config) { c.TickInterval = time.Microsecond }, "tick_interval"},
		{"member without id", func(c *Config) { c.InitialCluster[1].Id = "" }, "initial_cluster[1].id"},
		{"member without raft addr", func(c *Config) { c.InitialCluster[0].RaftAddr = "" }, "initial_cluster[0].raft"},
		{"duplicate member", func(c *Config) { c.InitialCluster[1].Id = "c1" }, "listed twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mutate(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig naming %q", err, tc.want)
			}
		})
	}
}

func TestWaitRegistry(t *testing.T) {
	w := newWaitRegistry()
	ch := w.Register(7)
	if w.Register(7) != nil {
		t.Fatal("second Register of the same id succeeded")
	}
	if w.Trigger(8, applied{}) {
		t.Fatal("Trigger of an unregistered id found a waiter")
	}
	res := &waldenv1.Result{Index: 3}
	if !w.Trigger(7, applied{result: res}) {
		t.Fatal("Trigger found no waiter")
	}
	if got := <-ch; got.result.GetIndex() != 3 {
		t.Fatalf("waiter got %v", got)
	}
	ch2 := w.Register(9)
	w.FailAll(ErrStopped)
	if got := <-ch2; !errors.Is(got.err, ErrStopped) {
		t.Fatalf("FailAll delivered %v", got.err)
	}
	if w.Len() != 0 {
		t.Fatalf("%d waiters left", w.Len())
	}
}

func TestIndexWaiter(t *testing.T) {
	w := newIndexWaiter(5)
	select {
	case <-w.Wait(5):
	default:
		t.Fatal("wait for an applied index blocked")
	}
	ch := w.Wait(8)
	w.Applied(7)
	select {
	case <-ch:
		t.Fatal("woken before index 8 was applied")
	default:
	}
	w.Applied(9)
	select {
	case <-ch:
	default:
		t.Fatal("not woken after index 9 was applied")
	}
}

func noop(payload string) *waldenv1.Command {
	return &waldenv1.Command{Op: &waldenv1.Command_Noop{Noop: &waldenv1.Noop{Payload: []byte(payload)}}}
}
