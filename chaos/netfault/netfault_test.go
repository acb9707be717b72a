package netfault_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"walden/chaos/netfault"
	"walden/chaos/netns"
)

// topology builds nodes a and b, or skips the test when namespaces are not
// available here (not root, tools missing) or another run holds them.
func topology(t *testing.T) *netns.Topology {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skipf("chaos network: %v", err)
	}
	topo, err := netns.Create(context.Background(), []string{"a", "b"}, 10*time.Minute, func(s string) { t.Log(s) })
	if errors.Is(err, netns.ErrBusy) {
		t.Skipf("chaos network: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
		out, _ := exec.Command("ip", "netns", "list").Output()
		if strings.Contains(string(out), netns.Prefix) {
			t.Errorf("namespaces left after Close:\n%s", out)
		}
	})
	return topo
}

// echo serves one-byte echoes on b.
func echo(t *testing.T, topo *netns.Topology) string {
	t.Helper()
	l, err := topo.Listener("b", topo.IP("b")+":7000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return l.Addr().String()
}

// roundTrip dials addr from a and echoes n bytes one at a time; it returns
// the time taken or the first error.
func roundTrip(topo *netns.Topology, addr string, n int, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	c, err := topo.Dialer("a")(ctx, addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1)
	for i := 0; i < n; i++ {
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

func TestCutHealAndDelay(t *testing.T) {
	topo := topology(t)
	addr := echo(t, topo)
	ctx := context.Background()
	if _, err := roundTrip(topo, addr, 3, 5*time.Second); err != nil {
		t.Fatalf("a → b before any fault: %v", err)
	}
	fw, err := netfault.NewFirewall(ctx, topo)
	if err != nil {
		t.Fatal(err)
	}

	// One direction cut: the handshake's SYN never reaches b.
	if err := fw.Cut(ctx, netfault.Link{From: "a", To: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(topo, addr, 1, time.Second); err == nil {
		t.Fatal("a → b answered through a cut link")
	}
	if err := fw.Heal(ctx, netfault.Link{From: "a", To: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(topo, addr, 3, 5*time.Second); err != nil {
		t.Fatalf("a → b after healing: %v", err)
	}

	// Every packet of b through the delayer: 0% loss, up to 40ms each.
	if err := fw.Queue(ctx, "b", 11); err != nil {
		t.Fatal(err)
	}
	d, err := netfault.StartDelayer(ctx, netfault.DelayerConfig{Queue: 11, Jitter: 40 * time.Millisecond, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	took, err := roundTrip(topo, addr, 20, 20*time.Second)
	if err != nil {
		t.Fatalf("a → b through the delayer: %v", err)
	}
	if err := fw.Unqueue(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	st := d.Stop()
	t.Logf("20 echoes through the delayer in %s; %+v", took, st)
	if st.Delayed == 0 || st.Seen < 40 || st.Dropped != 0 {
		t.Fatalf("delayer stats %+v: want packets held, none dropped", st)
	}

	// Every packet dropped: no connection.
	if err := fw.Queue(ctx, "b", 12); err != nil {
		t.Fatal(err)
	}
	d, err = netfault.StartDelayer(ctx, netfault.DelayerConfig{Queue: 12, Loss: 1, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(topo, addr, 1, time.Second); err == nil {
		t.Fatal("a → b answered with 100% loss")
	}
	if err := fw.HealAll(ctx); err != nil {
		t.Fatal(err)
	}
	if st := d.Stop(); st.Dropped == 0 {
		t.Fatalf("delayer stats %+v: want drops", st)
	}
	if _, err := roundTrip(topo, addr, 3, 5*time.Second); err != nil {
		t.Fatalf("a → b after HealAll: %v", err)
	}
}

// The dialer's sockets live in the node's namespace; from the host's own
// namespace the harness's subnet is refused at once (the guard table), so
// nothing dialled by mistake leaves the machine.
func TestDialerUsesNamespace(t *testing.T) {
	topo := topology(t)
	addr := echo(t, topo)
	var d net.Dialer
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if c, err := d.DialContext(ctx, "tcp", addr); err == nil || ctx.Err() != nil {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial %s from the host namespace: %v, want refused at once", addr, err)
	}
	if _, err := roundTrip(topo, addr, 1, 5*time.Second); err != nil {
		t.Fatalf("from a: %v", err)
	}
}
