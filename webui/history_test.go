package webui

import (
	"fmt"
	"testing"

	waldenv1 "walden/proto/walden/v1"
)

// historyEvents are a log of two brokers as an older walden recorded it:
// messages, no typed fields.
func historyEvents() []*waldenv1.Event {
	ev := func(i uint64, kind, broker, msg string) *waldenv1.Event {
		k, _ := waldenv1.Parse[waldenv1.EventKind](kind)
		return &waldenv1.Event{Index: i, UnixMs: int64(i) * 100, EventKind: k, BrokerId: broker, Message: msg}
	}
	return []*waldenv1.Event{
		ev(1, "register", "b1", "registered with epoch 1"),
		ev(2, "register", "b2", "registered with epoch 2"),
		ev(3, "observation", "b1", "c1 observes alive: probe ok"),
		ev(4, "observation", "b1", "c1 observes suspect: probe: 3 consecutive failures"),
		ev(5, "observation", "b1", "c2 observes dead: gossip: dead"),
		ev(6, "decision", "b1", "declared failed: epoch 1 fenced, new epoch 3"),
		ev(7, "observation", "b1", "c3 observes dead"),
		ev(8, "job", "b1", "attempt 1 running on c2"),
		ev(9, "job", "b1", `attempt 2 reassigned from "c2" to "c3"`),
		ev(10, "job", "b1", "attempt 2 running on c3"),
		ev(11, "job", "b1", "attempt 2 succeeded"),
		ev(12, "maintenance", "b2", "maintenance on: kernel upgrade"),
		ev(13, "register", "b1", "registered with epoch 4"),
		ev(14, "maintenance", "b2", "maintenance off: its ttl of 3s ran out"),
	}
}

// TestBrokerHistory reads the broker's state from the events' typed
// fields (the messages dropped, so that only the fields can tell), and
// from the messages of events an older walden recorded without them.
func TestBrokerHistory(t *testing.T) {
	const (
		alive, suspect, failed = waldenv1.BrokerState_BROKER_STATE_ALIVE, waldenv1.BrokerState_BROKER_STATE_SUSPECT, waldenv1.BrokerState_BROKER_STATE_FAILED
		recovering, recovered  = waldenv1.BrokerState_BROKER_STATE_RECOVERING, waldenv1.BrokerState_BROKER_STATE_RECOVERED
		maintenance            = waldenv1.BrokerState_BROKER_STATE_MAINTENANCE
	)
	// The broker's state after each event, as the state machine records it.
	to := []waldenv1.BrokerState{alive, alive, alive, suspect, suspect, failed, failed, recovering, recovering, recovering, recovered,
		maintenance, alive, alive}
	typed := historyEvents()
	for i, e := range typed {
		e.Detail, e.Message = &waldenv1.EventDetail{ToState: to[i]}, ""
	}
	for name, events := range map[string][]*waldenv1.Event{"fields": typed, "legacy messages": historyEvents()} {
		h := brokerHistory(events)
		if got := fmt.Sprint(h["b1"]); got != "[{alive 100 1} {suspect 400 4} {failed 600 6} {recovering 800 8} {recovered 1100 11} {alive 1300 13}]" {
			t.Errorf("%s: b1: %s", name, got)
		}
		if got := fmt.Sprint(h["b2"]); got != "[{alive 200 2} {maintenance 1200 12} {alive 1400 14}]" {
			t.Errorf("%s: b2: %s", name, got)
		}
	}
}
