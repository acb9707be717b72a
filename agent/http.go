package agent

import (
	"encoding/json"
	"net/http"
)

// LeaseJSON is the body of GET /v1/lease.
type LeaseJSON struct {
	BrokerID string `json:"broker_id"`
	Epoch    uint64 `json:"epoch"`
	Valid    bool   `json:"valid"`
	// RemainingMS is how many milliseconds the lease stays valid without
	// another renewal (rounded down; 0 when not valid).
	RemainingMS int64 `json:"remaining_ms"`
	Fenced      bool  `json:"fenced"`
}

// Handler serves the agent's local endpoint:
//
//	GET /v1/lease  → 200 LeaseJSON (whatever the lease's state)
//	GET /healthz   → 200 "ok" while the agent runs
//
// A Go broker embedding the agent may mount it on its own server instead of
// the agent's listen address.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/lease", func(w http.ResponseWriter, _ *http.Request) {
		l := a.Lease()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(LeaseJSON{
			BrokerID:    l.BrokerID,
			Epoch:       l.Epoch,
			Valid:       l.Valid,
			RemainingMS: max(0, l.Remaining.Milliseconds()),
			Fenced:      l.Fenced,
		})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
