package gossip

import (
	"bytes"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Faults injects network faults into the gossip traffic a Pool sends, so that
// tests can cut a link, drop a share of packets or add jitter. It acts on the
// packets this member sends and the streams it opens: to cut a link in both
// directions, set the fault on both members. A nil *Faults (production)
// injects nothing. Its methods are safe for concurrent use.
type Faults struct {
	mu    sync.Mutex
	links map[string]LinkFault // remote "ip:port", or AllLinks
	rng   *rand.Rand

	dropped atomic.Uint64
	delayed atomic.Uint64
	blocked atomic.Uint64
}

// AllLinks, given to Faults.Set, makes the fault apply to every link that has
// no fault of its own.
const AllLinks = "*"

// LinkFault is the fault on one link.
type LinkFault struct {
	// Drop is the probability (0 to 1) that a packet is lost.
	Drop float64
	// Delay is added to every packet that is not lost.
	Delay time.Duration
	// Jitter adds a uniformly random extra delay from 0 to Jitter.
	Jitter time.Duration
	// BlockStreams makes opening a TCP stream (push/pull, fallback probe)
	// fail.
	BlockStreams bool
}

// Cut is the fault of a link that carries nothing.
func Cut() LinkFault { return LinkFault{Drop: 1, BlockStreams: true} }

// NewFaults returns an empty fault set; seed makes packet loss and jitter
// reproducible.
func NewFaults(seed uint64) *Faults {
	return &Faults{links: map[string]LinkFault{}, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Set installs the fault on the link to addr ("ip:port" as Pool.Addr
// returns it, or AllLinks).
func (f *Faults) Set(addr string, lf LinkFault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.links[addr] = lf
}

// Clear removes the fault on the link to addr.
func (f *Faults) Clear(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.links, addr)
}

// ClearAll removes every fault.
func (f *Faults) ClearAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.links)
}

// FaultStats counts what a Faults did.
type FaultStats struct {
	PacketsDropped, PacketsDelayed, StreamsBlocked uint64
}

// Stats returns the counters.
func (f *Faults) Stats() FaultStats {
	return FaultStats{
		PacketsDropped: f.dropped.Load(),
		PacketsDelayed: f.delayed.Load(),
		StreamsBlocked: f.blocked.Load(),
	}
}

func (f *Faults) link(addr string) (LinkFault, bool) {
	lf, ok := f.links[addr]
	if !ok {
		lf, ok = f.links[AllLinks]
	}
	return lf, ok
}

// packet decides the fate of one packet to addr.
func (f *Faults) packet(addr string) (drop bool, delay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lf, ok := f.link(addr)
	if !ok {
		return false, 0
	}
	if lf.Drop > 0 && f.rng.Float64() < lf.Drop {
		f.dropped.Add(1)
		return true, 0
	}
	delay = lf.Delay
	if lf.Jitter > 0 {
		delay += time.Duration(f.rng.Int64N(int64(lf.Jitter) + 1))
	}
	if delay > 0 {
		f.delayed.Add(1)
	}
	return false, delay
}

func (f *Faults) streamBlocked(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	lf, ok := f.link(addr)
	if ok && lf.BlockStreams {
		f.blocked.Add(1)
		return true
	}
	return false
}

// faultTransport is a memberlist transport with Faults applied to what it
// sends.
type faultTransport struct {
	memberlist.NodeAwareTransport
	faults *Faults
}

var _ memberlist.NodeAwareTransport = (*faultTransport)(nil)

// newNetTransport binds memberlist's own transport on bindIP and port.
func newNetTransport(bindIP string, port int, logger *log.Logger) (*memberlist.NetTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{bindIP}, BindPort: port, Logger: logger}
	var err error
	// Port 0: the TCP port the kernel picks may be taken for UDP; retry as
	// memberlist itself does.
	for range 10 {
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			return nt, nil
		}
		if port != 0 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

func (t *faultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *faultTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	drop, delay := t.faults.packet(a.Addr)
	switch {
	case drop:
		return time.Now(), nil // lost on the way, as UDP may be
	case delay > 0:
		buf := bytes.Clone(b)
		time.AfterFunc(delay, func() { _, _ = t.NodeAwareTransport.WriteToAddress(buf, a) })
		return time.Now(), nil
	}
	return t.NodeAwareTransport.WriteToAddress(b, a)
}

func (t *faultTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *faultTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.faults.streamBlocked(a.Addr) {
		return nil, fmt.Errorf("gossip: injected fault: stream to %s blocked", a.Addr)
	}
	return t.NodeAwareTransport.DialAddressTimeout(a, timeout)
}
