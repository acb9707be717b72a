package devcontroller

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// HTTPHandler serves the controller's state as JSON for tests, verifiers
// and people:
//
//	GET  /v1/state    everything (View)
//	GET  /v1/nodes    {"nodes": [...], "registered_nodes": [...]}
//	GET  /v1/streams  {"streams": [...]} with their ranges
//	GET  /v1/objects  {"objects": [...]}; ?state=COMMITTED keeps one state
//	POST /v1/active   {"voter": N} makes voter N the active controller
//	POST /v1/nodes    a NodeRegistration: registers a node for AutomqGetNodes
//	GET  /healthz     "ok"
//
// It has no authentication: bind it to loopback.
func (c *Controller) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/state", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, c.Snapshot())
	})
	mux.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, _ *http.Request) {
		v := c.Snapshot()
		writeJSON(w, http.StatusOK, map[string]any{"nodes": v.Nodes, "registered_nodes": v.Registered})
	})
	mux.HandleFunc("GET /v1/streams", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"streams": c.Snapshot().Streams})
	})
	mux.HandleFunc("GET /v1/objects", func(w http.ResponseWriter, r *http.Request) {
		objs := c.Snapshot().Objects
		if s := ObjectState(r.URL.Query().Get("state")); s != "" {
			kept := []ObjectView{}
			for _, o := range objs {
				if o.State == s {
					kept = append(kept, o)
				}
			}
			objs = kept
		}
		writeJSON(w, http.StatusOK, map[string]any{"objects": objs})
	})
	mux.HandleFunc("POST /v1/active", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Voter int `json:"voter"`
		}
		if err := readJSON(r, &body); err != nil {
			writeError(w, http.StatusBadRequest, "the body must be {\"voter\": N}: "+err.Error())
			return
		}
		if err := c.SetActive(body.Voter); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"active_voter": c.Active()})
	})
	mux.HandleFunc("POST /v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		var reg NodeRegistration
		if err := readJSON(r, &reg); err != nil {
			writeError(w, http.StatusBadRequest, "the body must be a node registration {\"node_id\", \"node_epoch\", \"wal_config\", \"state\", \"tags\"}: "+err.Error())
			return
		}
		code, err := c.RegisterNode(reg)
		switch {
		case err != nil:
			writeError(w, http.StatusBadRequest, err.Error())
		case code != None:
			writeJSON(w, http.StatusConflict, map[string]string{"error": "a newer epoch of this node is registered", "code": code.String()})
		default:
			writeJSON(w, http.StatusOK, map[string]string{"code": code.String()})
		}
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}

// readJSON decodes a small JSON body, refusing unknown fields.
func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
