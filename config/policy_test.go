package config

import (
	"strings"
	"testing"
	"time"
)

func TestParsePolicyAndGossipSections(t *testing.T) {
	y := validYAML + `gossip:
  listen: 127.0.0.1:7201
  probe_interval: 500ms
  probe_timeout: 200ms
  join: [127.0.0.1:7202]
policy:
  failure_timeout: 8s
  suspicion_quorum: 3
  lease_ttl: 2s
  max_failed_fraction: 0.3
  max_concurrent_recoveries: 2
  cooldown: 1h
  dry_run: true
`
	cfg, err := ParseServer("c1.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Policy.Proto()
	if p.GetFailureTimeoutMs() != 8000 || p.GetSuspicionQuorum() != 3 || p.GetLeaseTtlMs() != 2000 ||
		p.GetMaxFailedFraction() != 0.3 || p.GetMaxConcurrentRecoveries() != 2 || p.GetCooldownMs() != 3600000 ||
		!p.GetDryRun() || p.GetDriftMarginMs() != 500 {
		t.Fatalf("policy %v", p)
	}
	g, on := cfg.GossipConfig()
	if !on || g.BindAddr != "127.0.0.1:7201" || g.ProbeInterval != 500*time.Millisecond || g.NodeName != "coordinator/c1" ||
		g.SuspicionMult != 4 || len(g.Join) != 1 {
		t.Fatalf("gossip %+v on=%v", g, on)
	}
}

func TestParsePolicyDefaults(t *testing.T) {
	cfg, err := ParseServer("c1.yaml", []byte(validYAML))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Policy != DefaultPolicy() || cfg.Policy.FailureTimeout != 5*time.Second {
		t.Fatalf("policy %+v", cfg.Policy)
	}
}

func TestParsePolicyErrors(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"policy:\n  failure_timeout: 3s\n", "c1.yaml:16: policy.failure_timeout: must be greater than lease_ttl + drift_margin"},
		{"policy:\n  max_failed_fraction: 1.5\n", "policy.max_failed_fraction"},
		{"policy:\n  max_failed_fraction: lots\n", "policy.max_failed_fraction: expected a number"},
		{"policy:\n  failure_timout: 3s\n", "policy.failure_timout: unknown key"},
		{"gossip:\n  probe_timeout: 2s\n", "gossip.probe_timeout: must be less than probe_interval"},
	} {
		y := validYAML + c.yaml
		if strings.HasPrefix(c.yaml, "gossip:") {
			y += "  listen: 127.0.0.1:7201\n"
		}
		_, err := ParseServer("c1.yaml", []byte(y))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.yaml, err, c.want)
		}
	}
}
