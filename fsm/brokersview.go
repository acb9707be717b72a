package fsm

import (
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// brokersView is the registry copy BrokersView shares. It is kept up to
// date entry by entry: an entry replaces the copies of the brokers it
// changed (the brokers the watch log compares before and after it, the
// same set), so a registry of thousands of brokers that changes many times
// a second — a fleet registering — is not copied whole at every read.
type brokersView struct {
	mu sync.Mutex
	// valid: byID and ids hold a copy of every broker; otherwise the next
	// read copies the registry whole (after a restore, a membership
	// change, or an entry that may change every broker).
	valid bool
	byID  map[string]*waldenv1.Broker
	ids   []string // sorted
	// brokers is the slice handed out, nil once an entry changed a copy.
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
	if !v.valid {
		v.byID = make(map[string]*waldenv1.Broker, len(s.brokers))
		for id, b := range s.brokers {
			v.byID[id] = clone(b)
		}
		v.ids, v.brokers, v.valid = sortedKeys(v.byID), nil, true
	}
	if v.brokers == nil {
		v.brokers = make([]*waldenv1.Broker, len(v.ids))
		for i, id := range v.ids {
			v.brokers[i] = v.byID[id]
		}
	}
	return v.brokers
}

// invalidate makes the next read copy the registry whole. Called with s.mu
// held for writing.
func (v *brokersView) invalidate() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.valid, v.byID, v.ids, v.brokers = false, nil, nil, nil
}

// viewApplied brings the view up to date after an entry: before is what the
// entry's watch candidates were (nil: the entry changes no broker), with
// the brokers it created added. Called with s.mu held for writing.
func (s *State) viewApplied(before *watchBefore) {
	v := &s.brokersView
	if before == nil {
		return
	}
	if before.everything {
		v.invalidate()
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.valid {
		return
	}
	for id := range before.ids.brokers {
		cur, had := s.brokers[id], v.byID[id]
		switch {
		case cur == nil && had == nil:
			continue
		case cur == nil:
			delete(v.byID, id)
			if i, ok := slices.BinarySearch(v.ids, id); ok {
				v.ids = slices.Delete(v.ids, i, i+1)
			}
		case had == nil:
			v.byID[id] = clone(cur)
			if i, ok := slices.BinarySearch(v.ids, id); !ok {
				v.ids = slices.Insert(v.ids, i, id)
			}
		case proto.Equal(had, cur):
			continue
		default:
			v.byID[id] = clone(cur)
		}
		v.brokers = nil
	}
}
