package netfault

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"walden/chaos/netns"
)

// table is the nftables table (bridge family) holding the cuts.
const table = "wchaos"

// Link is one direction between two nodes: packets From → To.
type Link struct{ From, To string }

func (l Link) String() string { return l.From + "→" + l.To }

// Firewall cuts and heals links between the topology's nodes and sends a
// node's packets to an NFQUEUE queue.
type Firewall struct {
	topo *netns.Topology

	mu     sync.Mutex
	cut    map[Link]bool
	queued map[string]uint16 // node → queue number of its rules
}

// NewFirewall installs the (empty) cut table in the bridge namespace.
func NewFirewall(ctx context.Context, topo *netns.Topology) (*Firewall, error) {
	f := &Firewall{topo: topo, cut: map[Link]bool{}, queued: map[string]uint16{}}
	ruleset := fmt.Sprintf(`table bridge %[1]s {
	set cut {
		type ipv4_addr . ipv4_addr
	}
	chain forward {
		type filter hook forward priority 0; policy accept;
		ip saddr . ip daddr @cut drop
	}
}
`, table)
	if err := netns.RunInput(ctx, netns.BridgeNS, ruleset, "nft", "-f", "-"); err != nil {
		return nil, err
	}
	return f, nil
}

// nft runs nft in the bridge namespace.
func nft(ctx context.Context, args ...string) error {
	return netns.Run(ctx, netns.BridgeNS, append([]string{"nft"}, args...)...)
}

func (f *Firewall) elements(links []Link) (string, error) {
	var parts []string
	for _, l := range links {
		a, b := f.topo.IP(l.From), f.topo.IP(l.To)
		if a == "" || b == "" {
			return "", fmt.Errorf("netfault: link %s: unknown node", l)
		}
		parts = append(parts, a+" . "+b)
	}
	return "{ " + strings.Join(parts, ", ") + " }", nil
}

// Cut drops, silently, every packet on the given links (each one
// direction) until Heal.
func (f *Firewall) Cut(ctx context.Context, links ...Link) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var add []Link
	for _, l := range links {
		if !f.cut[l] {
			add = append(add, l)
		}
	}
	if len(add) == 0 {
		return nil
	}
	el, err := f.elements(add)
	if err != nil {
		return err
	}
	if err := nft(ctx, "add", "element", "bridge", table, "cut", el); err != nil {
		return err
	}
	for _, l := range add {
		f.cut[l] = true
	}
	return nil
}

// Heal lets packets through the given links again.
func (f *Firewall) Heal(ctx context.Context, links ...Link) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var del []Link
	for _, l := range links {
		if f.cut[l] {
			del = append(del, l)
		}
	}
	if len(del) == 0 {
		return nil
	}
	el, err := f.elements(del)
	if err != nil {
		return err
	}
	if err := nft(ctx, "delete", "element", "bridge", table, "cut", el); err != nil {
		return err
	}
	for _, l := range del {
		delete(f.cut, l)
	}
	return nil
}

// HealAll removes every cut and every queue rule.
func (f *Firewall) HealAll(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := nft(ctx, "flush", "set", "bridge", table, "cut"); err != nil {
		return err
	}
	f.cut = map[Link]bool{}
	for node, q := range f.queued {
		if err := f.queueRules(ctx, "-D", node, q); err != nil {
			return err
		}
		delete(f.queued, node)
	}
	return nil
}

// Cuts lists the links cut now, sorted.
func (f *Firewall) Cuts() []Link {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Link
	for l := range f.cut {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Both returns the links between a and every other node, both directions.
func Both(a string, others ...string) []Link {
	var out []Link
	for _, b := range others {
		out = append(out, Link{a, b}, Link{b, a})
	}
	return out
}

// From returns the links from a to every other node (one direction).
func From(a string, others ...string) []Link {
	var out []Link
	for _, b := range others {
		out = append(out, Link{a, b})
	}
	return out
}

// Queue sends every packet from or to node through NFQUEUE queue q (with
// --queue-bypass: while no Delayer listens, packets pass) until Unqueue or
// HealAll.
func (f *Firewall) Queue(ctx context.Context, node string, q uint16) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.queued[node]; ok {
		return fmt.Errorf("netfault: %s is already queued", node)
	}
	if err := f.queueRules(ctx, "-I", node, q); err != nil {
		return err
	}
	f.queued[node] = q
	return nil
}

// Unqueue removes node's queue rules.
func (f *Firewall) Unqueue(ctx context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	q, ok := f.queued[node]
	if !ok {
		return nil
	}
	if err := f.queueRules(ctx, "-D", node, q); err != nil {
		return err
	}
	delete(f.queued, node)
	return nil
}

func (f *Firewall) queueRules(ctx context.Context, op, node string, q uint16) error {
	ip := f.topo.IP(node)
	if ip == "" {
		return fmt.Errorf("netfault: queue: unknown node %q", node)
	}
	for _, dir := range []string{"-s", "-d"} {
		err := netns.Run(ctx, netns.BridgeNS, "iptables", "-w", op, "FORWARD", dir, ip,
			"-j", "NFQUEUE", "--queue-num", fmt.Sprint(q), "--queue-bypass")
		if err != nil {
			return err
		}
	}
	return nil
}
