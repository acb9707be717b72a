package webui

import (
	"regexp"
	"slices"
	"strings"

	waldenv1 "walden/proto/walden/v1"
)

// transition is one change of a broker's state, as the page shows it.
type transition struct {
	State  string `json:"state"`
	UnixMs int64  `json:"unix_ms"`
	Index  uint64 `json:"index"`
}

// maxTransitions is how many recent state changes of a broker the page
// shows.
const maxTransitions = 8

// The sentences of the events an older walden recorded without their typed
// fields (Event.detail), read only for those (legacyState).
var (
	observesRe = regexp.MustCompile(`^(\S+) observes (alive|suspect|dead)`)
	jobRe      = regexp.MustCompile(`^attempt \d+ (running|succeeded|failed|cancelled)`)
)

// brokerHistory replays the event log (oldest first) into each broker's
// recent state changes: the broker's state after each event (its typed
// field to_state), so registered (alive), observed suspect or dead by a
// coordinator (suspect), declared failed (failed), its recovery running
// (recovering), succeeded (recovered), failed, blocked or cancelled
// (failed), and maintenance (and back when it ends). The page polls once a
// second; the history shows the states a failover went through even when
// they lasted less than that. Events an older walden recorded without
// their fields are read from their messages (legacyState).
func brokerHistory(events []*waldenv1.Event) map[string][]transition {
	out := map[string][]transition{}
	cur := map[string]waldenv1.BrokerState{}
	set := func(e *waldenv1.Event, state waldenv1.BrokerState) {
		b := e.GetBrokerId()
		if cur[b] == state {
			return
		}
		cur[b] = state
		h := append(out[b], transition{State: state.Name(), UnixMs: e.GetUnixMs(), Index: e.GetIndex()})
		if len(h) > maxTransitions {
			h = slices.Clone(h[len(h)-maxTransitions:])
		}
		out[b] = h
	}
	legacy := legacyState(cur)
	for _, e := range events {
		if e.GetBrokerId() == "" {
			continue
		}
		state := e.GetDetail().GetToState()
		if e.GetDetail() == nil {
			state = legacy(e)
		}
		if state != waldenv1.BrokerState_BROKER_STATE_UNSPECIFIED {
			set(e, state)
		}
	}
	return out
}

// legacyState returns the reader of the broker state after an event
// recorded without its fields, from its kind and message (UNSPECIFIED: it
// says none); cur is each broker's state so far.
func legacyState(cur map[string]waldenv1.BrokerState) func(e *waldenv1.Event) waldenv1.BrokerState {
	observed := map[string]map[string]string{} // broker -> observer -> observation
	return func(e *waldenv1.Event) waldenv1.BrokerState {
		b := e.GetBrokerId()
		switch e.GetEventKind() {
		case waldenv1.EventKind_EVENT_KIND_REGISTER:
			observed[b] = map[string]string{}
			return waldenv1.BrokerState_BROKER_STATE_ALIVE
		case waldenv1.EventKind_EVENT_KIND_OBSERVATION:
			m := observesRe.FindStringSubmatch(e.GetMessage())
			if s := cur[b]; m == nil || (s != waldenv1.BrokerState_BROKER_STATE_ALIVE && s != waldenv1.BrokerState_BROKER_STATE_SUSPECT && s != waldenv1.BrokerState_BROKER_STATE_UNSPECIFIED) {
				return waldenv1.BrokerState_BROKER_STATE_UNSPECIFIED // a failed or recovering broker stays so
			}
			if observed[b] == nil {
				observed[b] = map[string]string{}
			}
			observed[b][m[1]] = m[2]
			state := waldenv1.BrokerState_BROKER_STATE_ALIVE
			for _, s := range observed[b] {
				if s != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE.Name() {
					state = waldenv1.BrokerState_BROKER_STATE_SUSPECT
				}
			}
			return state
		case waldenv1.EventKind_EVENT_KIND_DECISION:
			return waldenv1.BrokerState_BROKER_STATE_FAILED
		case waldenv1.EventKind_EVENT_KIND_JOB:
			switch m := jobRe.FindStringSubmatch(e.GetMessage()); {
			case m == nil:
			case m[1] == waldenv1.JobState_JOB_STATE_RUNNING.Name():
				return waldenv1.BrokerState_BROKER_STATE_RECOVERING
			case m[1] == waldenv1.JobState_JOB_STATE_SUCCEEDED.Name():
				return waldenv1.BrokerState_BROKER_STATE_RECOVERED
			default:
				return waldenv1.BrokerState_BROKER_STATE_FAILED
			}
		case waldenv1.EventKind_EVENT_KIND_MAINTENANCE:
			switch {
			case strings.HasPrefix(e.GetMessage(), "maintenance on"):
				return waldenv1.BrokerState_BROKER_STATE_MAINTENANCE
			case strings.HasPrefix(e.GetMessage(), "maintenance off") && cur[b] == waldenv1.BrokerState_BROKER_STATE_MAINTENANCE:
				// Back to what the observations say (alive unless a
				// coordinator suspects it).
				state := waldenv1.BrokerState_BROKER_STATE_ALIVE
				for _, s := range observed[b] {
					if s != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE.Name() {
						state = waldenv1.BrokerState_BROKER_STATE_SUSPECT
					}
				}
				return state
			}
		}
		return waldenv1.BrokerState_BROKER_STATE_UNSPECIFIED
	}
}
