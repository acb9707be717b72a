package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

const tlsYAML = "tls: {cert_file: /etc/walden/c1.pem, key_file: /etc/walden/c1-key.pem, ca_file: /etc/walden/ca.pem}\n"

// TestSecureByDefault: without tls, a listener on an address other than
// loopback is refused in one line naming the file, the line and the key,
// unless insecure: true; insecure together with tls is refused.
func TestSecureByDefault(t *testing.T) {
	parse := map[string]func(name string, data []byte) error{
		"server": func(n string, d []byte) error { _, err := ParseServer(n, d); return err },
		"agent":  func(n string, d []byte) error { _, err := ParseAgent(n, d); return err },
		"broker": func(n string, d []byte) error { _, err := ParseBroker(n, d); return err },
	}
	cases := []struct {
		name, kind, yaml string
		key              string // "" when accepted
		line             int
		also             string
	}{
		{"server on loopback", "server", validYAML, "", 0, ""},
		{"server on a LAN address", "server", strings.Replace(validYAML, "admin: 127.0.0.1:7001\n", "admin: 10.0.0.5:7001\n", 1), "listen.admin", 5, ""},
		{"server on every interface", "server", strings.Replace(strings.Replace(validYAML, "raft: 127.0.0.1:7101\n", "raft: :7101\n", 1),
			"http: 127.0.0.1:7301", "http: 0.0.0.0:7301", 1), "listen.raft", 6, "(also listen.http)"},
		{"server gossip on a LAN address", "server", validYAML + "gossip: {listen: 10.0.0.5:7201}\n", "gossip.listen", 15, ""},
		{"server on a LAN address, insecure", "server", strings.Replace(validYAML, "admin: 127.0.0.1:7001\n", "admin: 10.0.0.5:7001\n", 1) + "insecure: true\n", "", 0, ""},
		{"server on a LAN address with tls", "server", strings.Replace(strings.Replace(validYAML, "admin: 127.0.0.1:7001\n", "admin: 10.0.0.5:7001\n", 1),
			"tls: {cert_file: \"\", key_file: \"\", ca_file: \"\"}\n", tlsYAML, 1), "", 0, ""},
		{"server insecure with tls", "server", strings.Replace(validYAML, "tls: {cert_file: \"\", key_file: \"\", ca_file: \"\"}\n", tlsYAML, 1) + "insecure: true\n", "insecure", 15, ""},
		{"server metrics listener is plain by design", "server", strings.Replace(validYAML, "metrics: 127.0.0.1:7401", "metrics: 0.0.0.0:9100", 1), "", 0, ""},
		{"server on localhost", "server", strings.Replace(validYAML, "admin: 127.0.0.1:7001\n", "admin: localhost:7001\n", 1), "", 0, ""},
		{"agent on a LAN address", "agent", strings.Replace(validAgentYAML, "listen: 127.0.0.1:7501", "listen: 10.0.0.7:7501", 1), "listen", 5, ""},
		{"agent gossip on a LAN address", "agent", strings.Replace(validAgentYAML, "gossip: {listen: 127.0.0.1:7401", "gossip: {listen: 10.0.0.7:7401", 1), "gossip.listen", 4, ""},
		{"agent insecure", "agent", strings.Replace(validAgentYAML, "listen: 127.0.0.1:7501", "listen: 10.0.0.7:7501", 1) + "insecure: true\n", "", 0, ""},
		{"broker data API on a LAN address", "broker", strings.Replace(validBrokerYAML, "listen: 127.0.0.1:9101", "listen: 10.0.0.7:9101", 1), "listen", 3, ""},
		{"broker with tls", "broker", strings.Replace(validBrokerYAML, "listen: 127.0.0.1:9101", "listen: 10.0.0.7:9101", 1) + tlsYAML, "", 0, ""},
	}
	for _, tc := range cases {
		err := parse[tc.kind](tc.kind+".yaml", []byte(tc.yaml))
		if tc.key == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var ce *Error
		if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if ce.Key != tc.key || ce.Line != tc.line || ce.File != tc.kind+".yaml" {
			t.Errorf("%s: %q at %s:%d, want key %s at line %d", tc.name, ce.Key, ce.File, ce.Line, tc.key, tc.line)
		}
		if strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), tc.also) {
			t.Errorf("%s: not one line or lacks %q: %q", tc.name, tc.also, err)
		}
		if tc.key != "insecure" && !strings.Contains(err.Error(), "insecure: true") {
			t.Errorf("%s: does not say how: %q", tc.name, err)
		}
	}
}

// TestGossipKeyBesideCA: with tls on and no encryption_key_file, members and
// agents use gossip.key beside ca_file; a named file wins.
func TestGossipKeyBesideCA(t *testing.T) {
	cfg, err := ParseServer("c1.yaml", []byte(strings.Replace(validYAML, "tls: {cert_file: \"\", key_file: \"\", ca_file: \"\"}\n", tlsYAML, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := cfg.GossipConfig(); g.EncryptionKeyFile != filepath.FromSlash("/etc/walden/gossip.key") {
		t.Fatalf("server gossip key %q", g.EncryptionKeyFile)
	}
	cfg, err = ParseServer("c1.yaml", []byte(validYAML))
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := cfg.GossipConfig(); g.EncryptionKeyFile != "" {
		t.Fatalf("gossip key without tls %q", g.EncryptionKeyFile)
	}
	a, err := ParseAgent("a.yaml", []byte(validAgentYAML+tlsYAML))
	if err != nil {
		t.Fatal(err)
	}
	if a.GossipKeyFile() != "/etc/walden/gossip.key" {
		t.Fatalf("agent gossip key %q", a.GossipKeyFile())
	}
	a, err = ParseAgent("a.yaml", []byte(strings.Replace(validAgentYAML, "join: [127.0.0.1:7201]}", "join: [127.0.0.1:7201], encryption_key_file: /k}", 1)+tlsYAML))
	if err != nil {
		t.Fatal(err)
	}
	if a.GossipKeyFile() != "/k" {
		t.Fatalf("named agent gossip key %q", a.GossipKeyFile())
	}
	b, err := ParseBroker("b.yaml", []byte(validBrokerYAML+tlsYAML))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.AgentConfig("127.0.0.1:9101").GossipKeyFile(); got != "/etc/walden/gossip.key" {
		t.Fatalf("broker's agent gossip key %q", got)
	}
}
