package netfault

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"walden/chaos/netns"
)

// Bounds of a Delayer.
const (
	// MaxHeld is the number of packets a Delayer holds at once; beyond it
	// a packet is released at once (counted in Stats.Overflow).
	MaxHeld = 8192
	// MaxJitter bounds the delay of one packet.
	MaxJitter = 2 * time.Second
	// MaxLife bounds a Delayer's life: it stops by itself after it.
	MaxLife = 30 * time.Minute
)

// DelayerConfig says what a Delayer does to each packet of its queue.
type DelayerConfig struct {
	// Queue is the NFQUEUE queue number (Firewall.Queue's).
	Queue uint16
	// Loss is the share of packets dropped, 0 to 1.
	Loss float64
	// Jitter: each packet not dropped is held for a delay drawn uniformly
	// from [0, Jitter] (packets overtake each other), at most MaxJitter.
	Jitter time.Duration
	// Seed makes the drops and delays reproducible.
	Seed uint64
	// Life bounds the Delayer's life (default and at most MaxLife).
	Life time.Duration
}

// Stats counts what a Delayer did.
type Stats struct {
	Seen, Dropped, Delayed, Overflow int64
}

// Delayer takes the packets of one NFQUEUE queue in the bridge namespace,
// drops a share and releases the others after a random delay.
type Delayer struct {
	cfg    DelayerConfig
	nf     *nfqueue.Nfqueue
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	rng      *rand.Rand
	stopping bool // guarded by mu: release at once, hold nothing more

	held                             atomic.Int64
	seen, dropped, delayed, overflow atomic.Int64
	timers                           sync.WaitGroup
}

// StartDelayer opens queue cfg.Queue in the bridge namespace and handles
// its packets until Stop, ctx's end or cfg.Life.
func StartDelayer(ctx context.Context, cfg DelayerConfig) (*Delayer, error) {
	if cfg.Loss < 0 || cfg.Loss > 1 {
		return nil, fmt.Errorf("netfault: loss %v: must be between 0 and 1", cfg.Loss)
	}
	if cfg.Jitter < 0 || cfg.Jitter > MaxJitter {
		return nil, fmt.Errorf("netfault: jitter %s: must be between 0 and %s", cfg.Jitter, MaxJitter)
	}
	if cfg.Life <= 0 || cfg.Life > MaxLife {
		cfg.Life = MaxLife
	}
	fd, err := unix.Open("/run/netns/"+netns.BridgeNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("netfault: bridge namespace: %w", err)
	}
	defer unix.Close(fd)
	nf, err := nfqueue.Open(&nfqueue.Config{
		NetNS:        fd,
		NfQueue:      cfg.Queue,
		MaxPacketLen: 0,
		MaxQueueLen:  MaxHeld,
		Copymode:     nfqueue.NfQnlCopyMeta,
		// A full kernel queue lets packets through rather than drop them.
		Flags:        nfqueue.NfQaCfgFlagFailOpen,
		WriteTimeout: time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("netfault: open queue %d: %w", cfg.Queue, err)
	}
	_ = nf.SetOption(netlink.NoENOBUFS, true)
	lctx, cancel := context.WithTimeout(ctx, cfg.Life)
	d := &Delayer{cfg: cfg, nf: nf, cancel: cancel, done: make(chan struct{}),
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Queue)))}
	err = nf.RegisterWithErrorFunc(lctx, d.handle, func(e error) int {
		if lctx.Err() != nil || errors.Is(e, context.Canceled) {
			return 1
		}
		return 0 // keep reading: a transient netlink error
	})
	if err != nil {
		cancel()
		nf.Close()
		return nil, fmt.Errorf("netfault: register on queue %d: %w", cfg.Queue, err)
	}
	go func() {
		<-lctx.Done()
		close(d.done)
	}()
	return d, nil
}

// fate is what happens to one packet.
type fate int

const (
	accept fate = iota
	drop
	hold     // released after the delay; counted in held and timers
	overflow // would be held, but MaxHeld are held already
)

// decide draws one packet's fate; a held packet is counted in timers under
// mu, so that Stop waits for every one.
func (d *Delayer) decide() (fate, time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return accept, 0
	}
	if d.rng.Float64() < d.cfg.Loss {
		return drop, 0
	}
	if d.cfg.Jitter <= 0 {
		return accept, 0
	}
	delay := time.Duration(d.rng.Int64N(int64(d.cfg.Jitter) + 1))
	if d.held.Load() >= MaxHeld {
		return overflow, 0
	}
	d.held.Add(1)
	d.timers.Add(1)
	return hold, delay
}

func (d *Delayer) handle(a nfqueue.Attribute) int {
	if a.PacketID == nil {
		return 0
	}
	id := *a.PacketID
	d.seen.Add(1)
	f, delay := d.decide()
	switch f {
	case drop:
		d.dropped.Add(1)
		_ = d.nf.SetVerdict(id, nfqueue.NfDrop)
	case hold:
		d.delayed.Add(1)
		time.AfterFunc(delay, func() {
			defer d.timers.Done()
			defer d.held.Add(-1)
			_ = d.nf.SetVerdict(id, nfqueue.NfAccept)
		})
	case overflow:
		d.overflow.Add(1)
		_ = d.nf.SetVerdict(id, nfqueue.NfAccept)
	default:
		_ = d.nf.SetVerdict(id, nfqueue.NfAccept)
	}
	return 0
}

// Stats returns the counts so far.
func (d *Delayer) Stats() Stats {
	return Stats{Seen: d.seen.Load(), Dropped: d.dropped.Load(), Delayed: d.delayed.Load(), Overflow: d.overflow.Load()}
}

// Stop stops taking packets, releases the ones held (each within
// cfg.Jitter) and closes the queue. Remove the queue rules first
// (Firewall.Unqueue), so that no packet waits for a Delayer that is gone.
func (d *Delayer) Stop() Stats {
	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	d.cancel()
	<-d.done
	d.timers.Wait()
	_ = d.nf.Close()
	return d.Stats()
}
