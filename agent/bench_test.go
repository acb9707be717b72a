package agent

import (
	"io"
	"net/http"
	"testing"
)

// BenchmarkCheck measures the in-process check a Go broker makes before an
// acknowledgement.
func BenchmarkCheck(b *testing.B) {
	c := newFakeCluster(b, 3, testTTL, testDrift, nil)
	a := startAgent(b, testConfig(c.addrs()...), Options{})
	waitRegistered(b, a)
	b.ResetTimer()
	for b.Loop() {
		_ = a.Check()
	}
}

// BenchmarkLeaseHTTP measures GET /v1/lease over a kept-alive loopback
// connection: what a broker in another language pays per check.
func BenchmarkLeaseHTTP(b *testing.B) {
	c := newFakeCluster(b, 3, testTTL, testDrift, nil)
	a := startAgent(b, testConfig(c.addrs()...), Options{})
	waitRegistered(b, a)
	url := "http://" + a.Addr() + "/v1/lease"
	client := &http.Client{}
	b.ResetTimer()
	for b.Loop() {
		resp, err := client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
