package fsm

import (
	waldenv1 "walden/proto/walden/v1"
)

// MaxEvents is the number of newest events the event log keeps.
const MaxEvents = 1000

// appendEvent appends e to the bounded event log, dropping the oldest.
//
// The oldest are dropped by moving the slice's start, and append copies the
// kept events to a new array only once the old one is full: once every few
// hundred events, where a copy of the whole log at every event made each
// apply of a busy cluster (a fleet registering, every observation an event)
// allocate and copy 8 KB.
func (s *State) appendEvent(e *waldenv1.Event) {
	if n := len(s.events); n >= MaxEvents {
		drop := n - MaxEvents + 1
		clear(s.events[:drop]) // the array may outlive them
		s.events = s.events[drop:]
	}
	s.events = append(s.events, e)
}

// recordEvent appends event e of the entry at index, with its typed
// fields (e.detail) and its message rendered from them.
func (s *State) recordEvent(index uint64, e *waldenv1.Event) {
	e.Index = index
	e.UnixMs = s.now()
	e.Message = EventMessage(e)
	s.appendEvent(e)
}

// applyRecordEvent appends an event that no other command produces. Its
// index is the entry's; its time the entry's unless it carries one. Kind
// cooldown with a broker sets the broker's cooldown block. An event with
// typed fields of a kind rendered here (the leader's freeze, unfreeze and
// cooldown) gets its message rendered from them; one without (recorded by
// an older walden), or of a kind not rendered (an executor's note), keeps
// the message it carries. Nothing here decides on the fields.
func (s *State) applyRecordEvent(index uint64, cmd *waldenv1.Command, op *waldenv1.RecordEvent) (*waldenv1.Result, error) {
	in := op.GetEvent()
	if in.GetEventKind() == waldenv1.EventKind_EVENT_KIND_UNSPECIFIED {
		return nil, invalid("record event: event.kind is empty")
	}
	var b *waldenv1.Broker
	if in.GetEventKind() == waldenv1.EventKind_EVENT_KIND_COOLDOWN {
		var ok bool
		if b, ok = s.brokers[in.GetBrokerId()]; !ok {
			return nil, unknownBroker("record cooldown event", in.GetBrokerId())
		}
	}
	e := clone(in)
	e.Index = index
	if e.UnixMs == 0 {
		e.UnixMs = s.now()
	}
	if e.Actor == "" {
		e.Actor = cmd.GetProposerId()
	}
	if e.GetDetail() != nil {
		if msg := EventMessage(e); msg != "" {
			e.Message = msg
		}
	}
	if b != nil {
		b.CooldownBlocked = true
	}
	s.appendEvent(e)
	return &waldenv1.Result{Value: &waldenv1.Result_Event{Event: clone(e)}}, nil
}

// Events returns copies of the newest limit events (all kept when limit
// <= 0) of broker brokerID (all brokers when empty), oldest first.
func (s *State) Events(brokerID string, limit int) []*waldenv1.Event {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*waldenv1.Event
	for i := len(s.events) - 1; i >= 0 && (limit <= 0 || len(out) < limit); i-- {
		if e := s.events[i]; brokerID == "" || e.GetBrokerId() == brokerID {
			out = append(out, clone(e))
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}
