package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const validYAML = `cluster_name: demo
node_id: c1
data_dir: /var/lib/walden/c1
listen:
  admin: 127.0.0.1:7001
  raft: 127.0.0.1:7101
  metrics: 127.0.0.1:7401
  http: 127.0.0.1:7301
initial_cluster:
  - {id: c1, raft: 127.0.0.1:7101, admin: 127.0.0.1:7001}
  - {id: c2, raft: 127.0.0.1:7102, admin: 127.0.0.1:7002}
  - {id: c3, raft: 127.0.0.1:7103, admin: 127.0.0.1:7003}
log: {level: info, format: json}
tls: {cert_file: "", key_file: "", ca_file: ""}
`

func TestParseValid(t *testing.T) {
	cfg, err := ParseServer("c1.yaml", []byte(validYAML))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClusterName != "demo" || cfg.NodeID != "c1" || cfg.Listen.Raft != "127.0.0.1:7101" || cfg.Listen.HTTP != "127.0.0.1:7301" {
		t.Fatalf("decoded %+v", cfg)
	}
	if len(cfg.InitialCluster) != 3 || cfg.InitialCluster[2] != (Member{ID: "c3", Raft: "127.0.0.1:7103", Admin: "127.0.0.1:7003"}) {
		t.Fatalf("initial_cluster %+v", cfg.InitialCluster)
	}
	// Defaults survive for keys the file does not set.
	def := DefaultServerConfig()
	if cfg.Raft != def.Raft || cfg.InitialClusterState != ClusterStateNew {
		t.Fatalf("raft %+v, want defaults %+v", cfg.Raft, def.Raft)
	}
	if cfg.TLS.Enabled() {
		t.Fatal("empty tls strings must mean TLS off")
	}
}

func TestParseRaftSection(t *testing.T) {
	cfg, err := ParseServer("c1.yaml", []byte(validYAML+`raft:
  tick_interval: 20ms
  election_ticks: 20
  heartbeat_ticks: 2
  snapshot_count: 100
  snapshot_catchup_entries: 50
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Raft{TickInterval: 20 * time.Millisecond, ElectionTicks: 20, HeartbeatTicks: 2, SnapshotCount: 100, SnapshotCatchUpEntries: 50}
	if cfg.Raft != want {
		t.Fatalf("raft %+v, want %+v", cfg.Raft, want)
	}
}

func TestParseRenewalsSection(t *testing.T) {
	if def := DefaultServerConfig().Renewals.Slot; def != 100*time.Millisecond {
		t.Fatalf("default renewals.slot %v", def)
	}
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{{"renewals:\n  slot: 20ms\n", 20 * time.Millisecond}, {"renewals:\n  slot: 0s\n", 0}, {"renewals:\n  slot: 1s\n", time.Second}} {
		cfg, err := ParseServer("c1.yaml", []byte(validYAML+tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Renewals.Slot != tc.want {
			t.Fatalf("%q: slot %v, want %v", tc.yaml, cfg.Renewals.Slot, tc.want)
		}
		if !cfg.Renewals.Frames {
			t.Fatalf("%q: renewals.frames off, want the default (on)", tc.yaml)
		}
	}
	cfg, err := ParseServer("c1.yaml", []byte(validYAML+"renewals:\n  frames: false\n"))
	if err != nil || cfg.Renewals.Frames || cfg.Renewals.Slot != 100*time.Millisecond {
		t.Fatalf("renewals.frames: false: %+v, %v", cfg.Renewals, err)
	}
}

// replace returns validYAML with old replaced by new (old must occur).
func replace(t *testing.T, old, new string) string {
	t.Helper()
	if !strings.Contains(validYAML, old) {
		t.Fatalf("test bug: %q not in validYAML", old)
	}
	return strings.Replace(validYAML, old, new, 1)
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		yaml func(t *testing.T) string
		line int
		key  string // "" for no key (syntax errors)
		want string
	}{
		{"broken yaml", func(t *testing.T) string { return replace(t, "  raft: 127.0.0.1:7101\n", "  raft: [127.0.0.1:7101\n") }, 0, "", "invalid YAML"},
		{"tab indentation", func(t *testing.T) string { return replace(t, "  http:", "\thttp:") }, 8, "", "invalid YAML"},
		{"empty file", func(*testing.T) string { return "# nothing\n" }, 1, "", "file is empty"},
		{"unknown top-level key", func(t *testing.T) string { return validYAML + "data_dri: /x\n" }, 15, "data_dri", `unknown key (did you mean "data_dir"?)`},
		{"unknown nested key", func(t *testing.T) string { return replace(t, "  metrics:", "  metrix:") }, 7, "listen.metrix", "unknown key"},
		{"the gossip address under listen", func(t *testing.T) string { return replace(t, "  metrics: 127.0.0.1:7401", "  gossip: 127.0.0.1:7201") }, 7,
			"listen.gossip", "moved to gossip.listen"},
		{"unknown key in list item", func(t *testing.T) string { return replace(t, "{id: c2,", "{id: c2, weight: 3,") }, 11, "initial_cluster[1].weight", "unknown key"},
		{"duplicate key", func(t *testing.T) string { return validYAML + "node_id: c2\n" }, 15, "node_id", "duplicate key (first set on line 2)"},
		{"wrong type scalar for mapping", func(t *testing.T) string { return replace(t, "log: {level: info, format: json}", "log: info") }, 13, "log", "expected a mapping"},
		{"wrong type integer for string", func(t *testing.T) string { return replace(t, "node_id: c1", "node_id: 7") }, 2, "node_id", "expected a string, got the integer 7"},
		{"wrong type string for integer", func(t *testing.T) string { return validYAML + "raft:\n  election_ticks: ten\n" }, 16, "raft.election_ticks", "expected an integer"},
		{"negative unsigned", func(t *testing.T) string { return validYAML + "raft:\n  snapshot_count: -1\n" }, 16, "raft.snapshot_count", "must not be negative"},
		{"bad duration", func(t *testing.T) string { return validYAML + "raft:\n  tick_interval: 100\n" }, 16, "raft.tick_interval", "expected a duration"},
		{"unparsable duration", func(t *testing.T) string { return validYAML + "raft:\n  tick_interval: 10 parsecs\n" }, 16, "raft.tick_interval", "invalid duration"},
		{"renewal slot too long", func(t *testing.T) string { return validYAML + "renewals:\n  slot: 2s\n" }, 16, "renewals.slot", "must be 0 (off) or from 1ms to 1s, got 2s"},
		{"renewal frames not a bool", func(t *testing.T) string { return validYAML + "renewals:\n  frames: sometimes\n" }, 16, "renewals.frames", "expected true or false"},
		{"renewal slot too short", func(t *testing.T) string { return validYAML + "renewals:\n  slot: 10us\n" }, 16, "renewals.slot", "must be 0 (off) or from 1ms to 1s"},
		{"list instead of mapping", func(t *testing.T) string { return replace(t, "initial_cluster:\n", "initial_cluster: 3\nx:\n") }, 9, "initial_cluster", "expected a list"},
		{"missing node_id", func(t *testing.T) string { return replace(t, "node_id: c1\n", "") }, 1, "node_id", "missing required key"},
		{"empty node_id", func(t *testing.T) string { return replace(t, "node_id: c1", `node_id: ""`) }, 2, "node_id", "must not be empty"},
		{"missing listen.raft: line of parent", func(t *testing.T) string { return replace(t, "  raft: 127.0.0.1:7101\n", "") }, 4, "listen.raft", "missing required key"},
		{"missing data_dir", func(t *testing.T) string { return replace(t, "data_dir: /var/lib/walden/c1\n", "") }, 1, "data_dir", "missing required key"},
		{"missing initial_cluster", func(t *testing.T) string { return strings.Split(validYAML, "initial_cluster:")[0] }, 1, "initial_cluster", "missing required key"},
		{"invalid address", func(t *testing.T) string { return replace(t, "raft: 127.0.0.1:7101\n", "raft: 127.0.0.1\n") }, 6, "listen.raft", "invalid address"},
		{"invalid port", func(t *testing.T) string { return replace(t, "admin: 127.0.0.1:7001\n", "admin: 127.0.0.1:70001\n") }, 5, "listen.admin", "not a number from 0 to 65535"},
		{"invalid member address", func(t *testing.T) string { return replace(t, "raft: 127.0.0.1:7102", `raft: ":7102"`) }, 11, "initial_cluster[1].raft", "host must not be empty"},
		{"same listen address twice", func(t *testing.T) string { return replace(t, "http: 127.0.0.1:7301", "http: 127.0.0.1:7001") }, 8, "listen.http", "already used by listen.admin"},
		{"duplicate member id", func(t *testing.T) string { return replace(t, "{id: c3,", "{id: c2,") }, 12, "initial_cluster[2].id", `duplicate member id "c2"`},
		{"duplicate member address", func(t *testing.T) string { return replace(t, "raft: 127.0.0.1:7103", "raft: 127.0.0.1:7102") }, 12, "initial_cluster[2].raft", "duplicate address"},
		{"node_id not in initial_cluster", func(t *testing.T) string { return replace(t, "node_id: c1", "node_id: c9") }, 2, "node_id", "not in initial_cluster"},
		{"bad member id", func(t *testing.T) string { return replace(t, "{id: c3,", "{id: 'c 3',") }, 12, "initial_cluster[2].id", "invalid name"},
		{"bad log level", func(t *testing.T) string { return replace(t, "level: info", "level: verbose") }, 13, "log.level", "debug, info, warn, error"},
		{"bad log format", func(t *testing.T) string { return replace(t, "format: json", "format: xml") }, 13, "log.format", "json or text"},
		{"tls half set", func(t *testing.T) string { return replace(t, `cert_file: ""`, `cert_file: a.pem`) }, 14, "tls.key_file", "must be set when any tls file is set"},
		{"bad cluster state", func(t *testing.T) string { return validYAML + "initial_cluster_state: old\n" }, 15, "initial_cluster_state", "new or existing"},
		{"election not above heartbeat", func(t *testing.T) string { return validYAML + "raft:\n  election_ticks: 1\n" }, 16, "raft.election_ticks", "greater than heartbeat_ticks"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseServer("conf/c1.yaml", []byte(tc.yaml(t)))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(err, ErrInvalid) = false for %v", err)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("not an *Error: %T %v", err, err)
			}
			// The first error is the one the case is about.
			prefix := "conf/c1.yaml:"
			if tc.line > 0 {
				prefix += fmt.Sprintf("%d:", tc.line)
			}
			if tc.key != "" {
				prefix += " " + tc.key + ":"
			}
			msg := ce.Error()
			if !strings.HasPrefix(msg, prefix) || !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q\nwant prefix %q and text %q", err, prefix, tc.want)
			}
			if ce.File != "conf/c1.yaml" || ce.Key != tc.key || (tc.line > 0 && ce.Line != tc.line) {
				t.Fatalf("fields %+v", ce)
			}
		})
	}
}

// TestBadAdminAddressReportedOnce: a bad listen.admin is one mistake, not
// a second one from the gossip metadata that carries the same address.
func TestBadAdminAddressReportedOnce(t *testing.T) {
	_, err := ParseServer("c1.yaml", []byte(replace(t, "admin: 127.0.0.1:7001\n", "admin: 127.0.0.1:99999\n")))
	if err == nil {
		t.Fatal("no error")
	}
	if n := strings.Count(err.Error(), "listen.admin"); n != 1 {
		t.Fatalf("listen.admin reported %d times:\n%v", n, err)
	}
}

func TestBrokenYAMLLine(t *testing.T) {
	_, err := ParseServer("x.yaml", []byte("cluster_name: demo\nlisten:\n  admin: [\n"))
	var ce *Error
	if !errors.As(err, &ce) || ce.Line == 0 || !strings.HasPrefix(err.Error(), fmt.Sprintf("x.yaml:%d: invalid YAML", ce.Line)) {
		t.Fatalf("error %v (%+v): want x.yaml:LINE: invalid YAML", err, ce)
	}
}

func TestValidateReportsEveryMistake(t *testing.T) {
	y := strings.NewReplacer("level: info", "level: loud", "format: json", "format: xml").Replace(validYAML)
	_, err := ParseServer("c.yaml", []byte(y))
	if err == nil || !strings.Contains(err.Error(), "c.yaml:13: log.level:") || !strings.Contains(err.Error(), "c.yaml:13: log.format:") {
		t.Fatalf("want both log errors, got %v", err)
	}
}

func TestExistingClusterState(t *testing.T) {
	y := strings.Split(validYAML, "initial_cluster:")[0] + "initial_cluster_state: existing\n"
	if _, err := ParseServer("c4.yaml", []byte(y)); err != nil {
		t.Fatalf("a joining member needs no initial_cluster: %v", err)
	}
}

func TestValidateWithoutFile(t *testing.T) {
	cfg := DefaultServerConfig()
	err := cfg.Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "cluster_name: missing required key") {
		t.Fatalf("got %v", err)
	}
	cfg.ClusterName, cfg.NodeID, cfg.DataDir = "demo", "c1", "/tmp/x"
	cfg.Listen = Listen{Admin: "127.0.0.1:0", Raft: "127.0.0.1:0"}
	cfg.InitialCluster = []Member{{ID: "c1", Raft: "127.0.0.1:7101", Admin: "127.0.0.1:7001"}}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
}

func TestLoadServerFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c1.yaml")
	if err := os.WriteFile(p, []byte(validYAML+"bogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadServer(p)
	if err == nil || !strings.HasPrefix(err.Error(), p+":15: bogus: unknown key") {
		t.Fatalf("got %v", err)
	}
	if _, err := LoadServer(filepath.Join(dir, "absent.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
}
