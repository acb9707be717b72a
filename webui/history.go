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

var (
	observesRe = regexp.MustCompile(`^(\S+) observes (alive|suspect|dead)`)
	jobRe      = regexp.MustCompile(`^attempt \d+ (running|succeeded|failed|cancelled)`)
)

// brokerHistory replays the event log (oldest first) into each broker's
// recent state changes: registered (alive), observed suspect or dead by a
// coordinator (suspect), declared failed (failed), its recovery running
// (recovering), succeeded (recovered), failed or cancelled (failed), and
// maintenance (and back to alive, or suspect, when it ends). The page polls once a second; the history shows the states
// a failover went through even when they lasted less than that.
func brokerHistory(events []*waldenv1.Event) map[string][]transition {
	out := map[string][]transition{}
	observed := map[string]map[string]string{} // broker -> observer -> observation
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
	for _, e := range events {
		b := e.GetBrokerId()
		if b == "" {
			continue
		}
		switch e.GetEventKind() {
		case waldenv1.EventKind_EVENT_KIND_REGISTER:
			observed[b] = map[string]string{}
			set(e, waldenv1.BrokerState_BROKER_STATE_ALIVE)
		case waldenv1.EventKind_EVENT_KIND_OBSERVATION:
			m := observesRe.FindStringSubmatch(e.GetMessage())
			if s := cur[b]; m == nil || (s != waldenv1.BrokerState_BROKER_STATE_ALIVE && s != waldenv1.BrokerState_BROKER_STATE_SUSPECT && s != waldenv1.BrokerState_BROKER_STATE_UNSPECIFIED) {
				continue // a failed or recovering broker stays so
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
			set(e, state)
		case waldenv1.EventKind_EVENT_KIND_DECISION:
			set(e, waldenv1.BrokerState_BROKER_STATE_FAILED)
		case waldenv1.EventKind_EVENT_KIND_JOB:
			switch m := jobRe.FindStringSubmatch(e.GetMessage()); {
			case m == nil:
			case m[1] == waldenv1.JobState_JOB_STATE_RUNNING.Name():
				set(e, waldenv1.BrokerState_BROKER_STATE_RECOVERING)
			case m[1] == waldenv1.JobState_JOB_STATE_SUCCEEDED.Name():
				set(e, waldenv1.BrokerState_BROKER_STATE_RECOVERED)
			default:
				set(e, waldenv1.BrokerState_BROKER_STATE_FAILED)
			}
		case waldenv1.EventKind_EVENT_KIND_MAINTENANCE:
			switch {
			case strings.HasPrefix(e.GetMessage(), "maintenance on"):
				set(e, waldenv1.BrokerState_BROKER_STATE_MAINTENANCE)
			case strings.HasPrefix(e.GetMessage(), "maintenance off") && cur[b] == waldenv1.BrokerState_BROKER_STATE_MAINTENANCE:
				// Back to what the observations say (alive unless a
				// coordinator suspects it).
				state := waldenv1.BrokerState_BROKER_STATE_ALIVE
				for _, s := range observed[b] {
					if s != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE.Name() {
						state = waldenv1.BrokerState_BROKER_STATE_SUSPECT
					}
				}
				set(e, state)
			}
		}
	}
	return out
}
