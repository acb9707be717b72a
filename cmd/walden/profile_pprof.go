//go:build walden_pprof

package main

import (
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof/ on http.DefaultServeMux
	"os"
)

// A binary built with -tags walden_pprof serves Go's profiles on the
// address in WALDEN_PPROF_ADDR (127.0.0.1:port), for benchmarks that need
// to know where a coordinator's time goes. Release builds have no such
// endpoint.
func init() {
	if addr := os.Getenv("WALDEN_PPROF_ADDR"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
