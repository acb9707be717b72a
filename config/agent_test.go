package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const validAgentYAML = `broker_id: b1
cluster_name: demo
coordinators: [127.0.0.1:7001, 127.0.0.1:7002, 127.0.0.1:7003]
gossip: {listen: 127.0.0.1:7401, join: [127.0.0.1:7201]}
listen: 127.0.0.1:7501
wal: {volume_id: vol-b1, path: /var/lib/broker/b1.wal}
`

func TestParseAgentValid(t *testing.T) {
	cfg, err := ParseAgent("agent.yaml", []byte(validAgentYAML))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BrokerID != "b1" || cfg.ClusterName != "demo" || len(cfg.Coordinators) != 3 || cfg.Coordinators[2] != "127.0.0.1:7003" ||
		cfg.Listen != "127.0.0.1:7501" || cfg.WAL != (WALLocation{VolumeID: "vol-b1", Path: "/var/lib/broker/b1.wal"}) {
		t.Fatalf("decoded %+v", cfg)
	}
	if cfg.Gossip.BindAddr != "127.0.0.1:7401" || len(cfg.Gossip.Join) != 1 || cfg.Gossip.Join[0] != "127.0.0.1:7201" {
		t.Fatalf("gossip %+v", cfg.Gossip)
	}
	// Defaults for the keys the file leaves out.
	if cfg.LeaseSafetyMargin != 500*time.Millisecond || cfg.Gossip.ProbeInterval != time.Second || cfg.Log.Level != "info" || cfg.Log.Format != "json" ||
		cfg.Renewals.Transport != RenewalsAuto {
		t.Fatalf("defaults %+v", cfg)
	}
	if cfg.GossipNodeName() != "agent/b1" || cfg.Source() != "agent.yaml" {
		t.Fatalf("node name %q, source %q", cfg.GossipNodeName(), cfg.Source())
	}
}

func TestParseAgentOptionalKeys(t *testing.T) {
	y := validAgentYAML + `broker_addr: 127.0.0.1:9092
lease_safety_margin: 250ms
log: {level: debug, format: text}
renewals: {transport: stream}
`
	y = strings.Replace(y, "gossip: {listen: 127.0.0.1:7401, join: [127.0.0.1:7201]}",
		"gossip: {listen: 127.0.0.1:7401, join: [127.0.0.1:7201], probe_interval: 200ms, probe_timeout: 100ms, encryption_key_file: /etc/walden/gossip.key}", 1)
	cfg, err := ParseAgent("agent.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BrokerAddr != "127.0.0.1:9092" || cfg.LeaseSafetyMargin != 250*time.Millisecond || cfg.Log.Format != "text" ||
		cfg.Gossip.ProbeInterval != 200*time.Millisecond || cfg.Gossip.EncryptionKeyFile != "/etc/walden/gossip.key" ||
		cfg.Renewals.Transport != RenewalsStream {
		t.Fatalf("decoded %+v", cfg)
	}
}

func TestParseAgentErrors(t *testing.T) {
	cases := []struct {
		name, yaml, key string
		line            int
		reason          string
	}{
		{"unknown key", validAgentYAML + "lease_ttl: 3s\n", "lease_ttl", 7, "unknown key"},
		{"misspelt key", strings.Replace(validAgentYAML, "broker_id:", "broker_di:", 1), "broker_di", 1, `did you mean "broker_id"`},
		{"missing broker_id", strings.Replace(validAgentYAML, "broker_id: b1\n", "", 1), "broker_id", 1, "missing required key"},
		{"no coordinators", strings.Replace(validAgentYAML, "[127.0.0.1:7001, 127.0.0.1:7002, 127.0.0.1:7003]", "[]", 1), "coordinators", 3, "must not be empty"},
		{"bad coordinator", strings.Replace(validAgentYAML, "127.0.0.1:7002", "127.0.0.1", 1), "coordinators[1]", 3, "want host:port"},
		{"duplicate coordinator", strings.Replace(validAgentYAML, "127.0.0.1:7003", "127.0.0.1:7001", 1), "coordinators[2]", 3, "duplicate address"},
		{"listen without host", strings.Replace(validAgentYAML, "listen: 127.0.0.1:7501", "listen: :7501", 1), "listen", 5, "host must not be empty"},
		{"listen on a wildcard", strings.Replace(validAgentYAML, "listen: 127.0.0.1:7501", "listen: 0.0.0.0:7501", 1), "listen", 5, "wildcard"},
		{"missing wal path", strings.Replace(validAgentYAML, ", path: /var/lib/broker/b1.wal", "", 1), "wal.path", 6, "missing required key"},
		{"gossip listen not an ip", strings.Replace(validAgentYAML, "listen: 127.0.0.1:7401", "listen: localhost:7401", 1), "gossip.listen", 4, "not an IP address"},
		{"missing gossip", strings.Replace(validAgentYAML, "gossip: {listen: 127.0.0.1:7401, join: [127.0.0.1:7201]}\n", "", 1), "gossip.listen", 1, "missing required key"},
		{"gossip unknown key", strings.Replace(validAgentYAML, "join:", "joins:", 1), "gossip.joins", 4, `did you mean "join"`},
		{"gossip timing", strings.Replace(validAgentYAML, "join: [127.0.0.1:7201]", "join: [127.0.0.1:7201], probe_timeout: 2s", 1), "gossip.probe_timeout", 4, "less than probe_interval"},
		{"gossip bad duration", strings.Replace(validAgentYAML, "join: [127.0.0.1:7201]", "join: [127.0.0.1:7201], probe_interval: 5", 1), "gossip.probe_interval", 4, "expected a duration"},
		{"same port twice", strings.Replace(validAgentYAML, "listen: 127.0.0.1:7401", "listen: 127.0.0.1:7501", 1), "gossip.listen", 4, "already used by listen"},
		{"negative margin", validAgentYAML + "lease_safety_margin: -1s\n", "lease_safety_margin", 7, "must not be negative"},
		{"bad log level", validAgentYAML + "log: {level: loud}\n", "log.level", 7, "must be one of"},
		{"bad renewal transport", validAgentYAML + "renewals: {transport: grpc}\n", "renewals.transport", 7, "must be one of auto, frames, stream, call, got \"grpc\""},
		{"renewals unknown key", validAgentYAML + "renewals:\n  transprot: stream\n", "renewals.transprot", 8, `did you mean "transport"`},
		{"partial tls", validAgentYAML + "tls: {cert_file: a.pem}\n", "tls.key_file", 7, "must be set"},
		{"bad broker_addr", validAgentYAML + "broker_addr: b1\n", "broker_addr", 7, "want host:port"},
		{"bad broker_id", strings.Replace(validAgentYAML, "broker_id: b1", "broker_id: 'b 1'", 1), "broker_id", 1, "invalid name"},
		{"command and pid file", validAgentYAML + "broker:\n  command: [/bin/broker]\n  pid_file: /run/b.pid\n", "broker.pid_file", 9, "not both"},
		{"relative pid file", validAgentYAML + "broker: {pid_file: run/b.pid}\n", "broker.pid_file", 7, "absolute path"},
		{"empty command", validAgentYAML + "broker:\n  command: []\n", "broker.command", 8, "must not be empty"},
		{"command without a program", validAgentYAML + "broker:\n  command: ['', x]\n", "broker.command[0]", 8, "must name the program"},
		{"command not a list", validAgentYAML + "broker:\n  command: /bin/broker\n", "broker.command", 8, "expected a list"},
		{"bad kafka_addr", validAgentYAML + "broker:\n  kafka_addr: localhost\n", "broker.kafka_addr", 8, "want host:port"},
		{"health timeout above the interval", validAgentYAML + "broker:\n  kafka_addr: 127.0.0.1:9092\n  health_timeout: 2s\n", "broker.health_timeout", 9, "at most broker.check_interval"},
		{"zero threshold", validAgentYAML + "broker:\n  kafka_addr: 127.0.0.1:9092\n  failure_threshold: 0\n", "broker.failure_threshold", 9, "at least 1"},
		{"env without =", validAgentYAML + "broker:\n  command: [/bin/broker]\n  env: [JAVA_HOME]\n", "broker.env[0]", 9, "NAME=VALUE"},
		{"env without command", validAgentYAML + "broker:\n  pid_file: /run/b.pid\n  env: [A=1]\n", "broker.env", 9, "broker.command, which is not set"},
		{"broker unknown key", validAgentYAML + "broker:\n  pidfile: /run/b.pid\n", "broker.pidfile", 8, `did you mean "pid_file"`},
		{"watchdog without a process", validAgentYAML + "broker: {kafka_addr: 127.0.0.1:9092}\nwatchdog:\n  enabled: true\n", "watchdog.enabled", 9, "needs the broker's process"},
		{"negative kill margin", validAgentYAML + "broker: {command: [/bin/broker]}\nwatchdog:\n  enabled: true\n  kill_margin: -1s\n", "watchdog.kill_margin", 10, "must not be negative"},
		{"bad kill margin", validAgentYAML + "watchdog:\n  kill_margin: 500\n", "watchdog.kill_margin", 8, "expected a duration"},
		{"negative node id", validAgentYAML + "broker: {command: [/bin/broker]}\nwatchdog: {enabled: true}\nautomq:\n  node_id: -2\n", "automq.node_id", 10, "0 or more"},
		{"node id not a number", validAgentYAML + "automq:\n  node_id: three\n", "automq.node_id", 8, "expected an integer"},
		{"automq without the watchdog", validAgentYAML + "broker: {command: [/bin/broker]}\nautomq:\n  node_id: 3\n", "automq.node_id", 9, "watchdog.enabled: true"},
		{"external fencing of no AutoMQ broker", validAgentYAML + "automq:\n  external_fencing: true\n", "automq.external_fencing", 8, "set automq.node_id too"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAgent("conf/agent.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v does not match ErrInvalid", err)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("%v is not an *Error", err)
			}
			if ce.File != "conf/agent.yaml" || ce.Key != tc.key || ce.Line != tc.line || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("got %q (file %q line %d key %q), want line %d key %q reason containing %q", err, ce.File, ce.Line, ce.Key, tc.line, tc.key, tc.reason)
			}
			if !strings.HasPrefix(err.Error(), "conf/agent.yaml:") {
				t.Fatalf("message %q does not start with FILE:LINE:", err)
			}
		})
	}
}

// TestParseAgentBrokerSections: the broker, watchdog and automq sections
// decode with their defaults; an AutoMQ broker without the watchdog is
// accepted only when the file says watchdog.enabled: false itself.
func TestParseAgentBrokerSections(t *testing.T) {
	cfg, err := ParseAgent("agent.yaml", []byte(validAgentYAML))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Broker.Watched() || cfg.Watchdog.Enabled || cfg.Automq.Configured() || !cfg.Broker.Restart ||
		cfg.Broker.CheckInterval != time.Second || cfg.Broker.FailureThreshold != 3 || cfg.Watchdog.KillMargin != 500*time.Millisecond {
		t.Fatalf("defaults: broker %+v, watchdog %+v, automq %+v", cfg.Broker, cfg.Watchdog, cfg.Automq)
	}
	y := validAgentYAML + `broker:
  command: [/opt/automq/bin/kafka-server-start.sh, /opt/automq/config/kraft/server.properties]
  dir: /opt/automq
  env: [KAFKA_HEAP_OPTS=-Xmx6g]
  kafka_addr: 127.0.0.1:9092
  health_command: [/usr/local/bin/check-broker, --quick]
  health_timeout: 500ms
  check_interval: 2s
  failure_threshold: 5
  start_timeout: 90s
  restart: false
  stop_timeout: 20s
watchdog:
  enabled: true
  kill_margin: 300ms
  kill_command: [systemctl, kill, --signal=SIGKILL, automq]
  kill_timeout: 200ms
automq:
  node_id: 0
`
	cfg, err = ParseAgent("agent.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	b, w := cfg.Broker, cfg.Watchdog
	if len(b.Command) != 2 || b.Dir != "/opt/automq" || b.Env[0] != "KAFKA_HEAP_OPTS=-Xmx6g" || b.KafkaAddr != "127.0.0.1:9092" ||
		len(b.HealthCommand) != 2 || b.HealthTimeout != 500*time.Millisecond || b.CheckInterval != 2*time.Second ||
		b.FailureThreshold != 5 || b.StartTimeout != 90*time.Second || b.Restart || b.StopTimeout != 20*time.Second || !b.HasProcess() {
		t.Fatalf("broker %+v", b)
	}
	if !w.Enabled || w.KillMargin != 300*time.Millisecond || len(w.KillCommand) != 4 || w.KillTimeout != 200*time.Millisecond {
		t.Fatalf("watchdog %+v", w)
	}
	if !cfg.Automq.Configured() || *cfg.Automq.NodeID != 0 {
		t.Fatalf("automq %+v", cfg.Automq)
	}
	external := validAgentYAML + "broker: {pid_file: /run/automq.pid}\nautomq: {node_id: 4, external_fencing: true}\n"
	if cfg, err := ParseAgent("agent.yaml", []byte(external)); err != nil || !cfg.Automq.ExternalFencing {
		t.Fatalf("an AutoMQ broker fenced by the coordinators' plugins: %v", err)
	}
}

func TestLoadAgentFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(validAgentYAML+"bogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadAgent(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":7: bogus: unknown key") {
		t.Fatalf("LoadAgent = %v", err)
	}
	if _, err := LoadAgent(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("LoadAgent of a missing file succeeded")
	}
}

func TestAgentValidateInCode(t *testing.T) {
	c := DefaultAgentConfig()
	c.BrokerID, c.ClusterName, c.Listen = "b1", "demo", "127.0.0.1:0"
	c.Coordinators = []string{"127.0.0.1:7001"}
	c.WAL.Path = "/tmp/b1.wal"
	c.Gossip.BindAddr = "127.0.0.1:0"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Coordinators = nil
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "coordinators: missing required key") {
		t.Fatalf("Validate = %v", err)
	}
}
