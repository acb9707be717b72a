package lease

import (
	"sync"
	"sync/atomic"
	"time"
)

// Readings shares boot-clock readings between the grants of renewals that
// arrive together, so that a coordinator under load reads its clock once
// for many grants instead of once each. A grant may take any reading taken
// after its renewal was received (docs/safety.md, "One boot-clock reading
// per batch"): the renewal's handler takes a ticket when it received the
// renewal (Arrived) and, when it grants, the last reading if that was taken
// after the ticket, else a new one (For). Renewals granted while one
// reading is the last form one batch. Its methods are safe for concurrent
// use.
type Readings struct {
	clock   Clock
	arrived atomic.Uint64

	mu sync.Mutex
	// covers is the number of tickets handed out before last was read:
	// last was taken after every renewal of a ticket up to covers arrived.
	covers uint64
	last   time.Duration
	taken  atomic.Uint64
}

// Ticket is a renewal's place in the order of arrivals.
type Ticket uint64

// NewReadings returns Readings of clock.
func NewReadings(clock Clock) *Readings { return &Readings{clock: clock} }

// Arrived records that a renewal was received and returns its ticket.
// Call it after the renewal was received, before For.
func (r *Readings) Arrived() Ticket { return Ticket(r.arrived.Add(1)) }

// For returns a reading of the clock taken after the renewal of ticket t
// arrived: the last reading when it was, else a new one.
func (r *Readings) For(t Ticket) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.covers >= uint64(t) {
		return r.last
	}
	// Every ticket up to covers was handed out before this load, so before
	// the reading that follows it.
	r.covers = r.arrived.Load()
	r.last = r.clock.Now()
	r.taken.Add(1)
	return r.last
}

// Taken counts the readings taken.
func (r *Readings) Taken() uint64 { return r.taken.Load() }
