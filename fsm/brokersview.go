package fsm

import (
	"sync"

	waldenv1 "walden/proto/walden/v1"
)

// brokersView is the registry copy BrokersView shares, with the change it
// was copied at.
type brokersView struct {
	mu      sync.Mutex
	changes uint64
	brokers []*waldenv1.Broker
}

// BrokersView returns a copy of every broker, sorted by id, shared by every
// caller until the state changes: the failure detector reads the whole
// registry every decision round (150 ms) and every probe round, which at
// thousands of brokers made copying it the leader's largest cost while
// nothing changed. The slice and its messages must never be modified; use
// Brokers for a copy of your own.
func (s *State) BrokersView() []*waldenv1.Broker {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v := &s.brokersView
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.brokers == nil || v.changes != s.changes {
		v.brokers, v.changes = s.sortedBrokers(), s.changes
	}
	return v.brokers
}
