package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newHTTPHandler serves /metrics and the probes:
//
//   - /healthz is liveness: 200 while the process works, also while this
//     member knows no leader (restarting members during a quorum loss
//     makes it worse); 503 once the raft node has stopped.
//   - /readyz is readiness: 200 only while the member knows a leader and
//     has applied what was committed when it started; 503 with the reason
//     otherwise.
//
// and the web view under /ui/ (ui; nil for none).
func newHTTPHandler(reg *prometheus.Registry, node ClusterNode, ui http.Handler) http.Handler {
	mux := http.NewServeMux()
	if ui != nil {
		mux.Handle("/ui/", ui)
		mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if s, ok := node.(interface{ Stopped() bool }); ok && s.Stopped() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not alive: the raft node stopped\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if node.Ready() {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		if node.LeaderID() == "" {
			_, _ = w.Write([]byte("not ready: no leader\n"))
			return
		}
		_, _ = w.Write([]byte("not ready: catching up with the log\n"))
	})
	return mux
}
