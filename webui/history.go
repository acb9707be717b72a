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
// maintenance. The page polls once a second; the history shows the states
// a failover went through even when they lasted less than that.
func brokerHistory(events []*waldenv1.Event) map[string][]transition {
	out := map[string][]transition{}
	observed := map[string]map[string]string{} // broker -> observer -> state
	cur := map[string]string{}
	set := func(e *waldenv1.Event, state string) {
		b := e.GetBrokerId()
		if cur[b] == state {
			return
		}
		cur[b] = state
		h := append(out[b], transition{State: state, UnixMs: e.GetUnixMs(), Index: e.GetIndex()})
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
		switch e.GetKind() {
		case "register":
			observed[b] = map[string]string{}
			set(e, "alive")
		case "observation":
			m := observesRe.FindStringSubmatch(e.GetMessage())
			if m == nil || (cur[b] != "alive" && cur[b] != "suspect" && cur[b] != "") {
				continue // a failed or recovering broker stays so
			}
			if observed[b] == nil {
				observed[b] = map[string]string{}
			}
			observed[b][m[1]] = m[2]
			state := "alive"
			for _, s := range observed[b] {
				if s != "alive" {
					state = "suspect"
				}
			}
			set(e, state)
		case "decision":
			set(e, "failed")
		case "job":
			switch m := jobRe.FindStringSubmatch(e.GetMessage()); {
			case m == nil:
			case m[1] == "running":
				set(e, "recovering")
			case m[1] == "succeeded":
				set(e, "recovered")
			default:
				set(e, "failed")
			}
		case "maintenance":
			if strings.HasPrefix(e.GetMessage(), "maintenance on") {
				set(e, "maintenance")
			}
		}
	}
	return out
}
