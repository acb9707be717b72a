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

// RegistrationJSON is the body of GET /v1/registration.
type RegistrationJSON struct {
	BrokerID string `json:"broker_id"`
	// Registered is false until the cluster first answered the
	// registration.
	Registered bool   `json:"registered"`
	Epoch      uint64 `json:"epoch"`
	// RecoveredWALOffset is the WAL offset up to which the last recovery
	// uploaded the broker's WAL; the broker trims its WAL to it before it
	// serves. -1 when no recovery ran.
	RecoveredWALOffset int64 `json:"recovered_wal_offset"`
}

// BrokerJSON is the body of GET /v1/broker.
type BrokerJSON struct {
	// State is one of BrokerStates ("not_watched" without a broker
	// section).
	State  BrokerState `json:"state"`
	PID    int         `json:"pid"`
	Reason string      `json:"reason"`
	// SinceUnixMS is when the broker entered State (0: not watched).
	SinceUnixMS int64 `json:"since_unix_ms"`
	Starts      int   `json:"starts"`
	// WatchdogArmed is true while the watchdog holds a deadline for a live
	// broker; KillInMS is then how long until it kills it.
	WatchdogArmed bool  `json:"watchdog_armed"`
	KillInMS      int64 `json:"kill_in_ms"`
	// RegisterInMS is, while down, how long until the agent registers
	// again (-1: not before it restarts).
	RegisterInMS int64 `json:"register_in_ms"`
}

// Handler serves the agent's local endpoint:
//
//	GET /v1/lease         → 200 LeaseJSON (whatever the lease's state)
//	GET /v1/registration  → 200 RegistrationJSON
//	GET /v1/broker        → 200 BrokerJSON
//	GET /healthz          → 200 "ok" while the agent runs and its broker
//	                        is not down; 503 "broker down: REASON" when it is
//	GET /metrics          → Options.Metrics (when set)
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
	mux.HandleFunc("GET /v1/registration", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		body := RegistrationJSON{BrokerID: a.cfg.BrokerID, Registered: a.st.registered, Epoch: a.st.epoch, RecoveredWALOffset: -1}
		if a.st.registered {
			body.RecoveredWALOffset = a.st.recovered
		}
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(body)
	})
	if a.opts.Metrics != nil {
		mux.Handle("GET /metrics", a.opts.Metrics)
	}
	mux.HandleFunc("GET /v1/broker", func(w http.ResponseWriter, _ *http.Request) {
		b := a.Broker()
		body := BrokerJSON{State: b.State, PID: b.PID, Reason: b.Reason, Starts: b.Starts, WatchdogArmed: b.WatchdogArmed,
			KillInMS: b.KillIn.Milliseconds(), RegisterInMS: b.RegisterIn.Milliseconds()}
		if b.RegisterIn < 0 {
			body.RegisterInMS = -1
		}
		if !b.Since.IsZero() {
			body.SinceUnixMS = b.Since.UnixMilli()
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		// The coordinators probe this: a dead broker beside a live agent
		// must look dead.
		if a.sup != nil {
			if down, why := a.sup.isDown(); down {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte("broker down: " + why + "\n"))
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
