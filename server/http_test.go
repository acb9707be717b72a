package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

func TestHTTPEndpoints(t *testing.T) {
	f := &fakeNode{}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	srv := httptest.NewServer(newHTTPHandler(reg, f, nil))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "no leader") {
		t.Fatalf("/readyz without leader: %d %q", code, body)
	}
	f.setLeader("c2")
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "catching up") {
		t.Fatalf("/readyz catching up: %d %q", code, body)
	}
	f.mu.Lock()
	f.ready = true
	f.mu.Unlock()
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz ready: %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics %d", code)
	}
}
