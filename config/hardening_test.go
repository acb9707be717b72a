package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHardeningConfigFiles is the configuration rows of the hardening
// table (docs/security.md): each input is refused promptly with an error
// naming the file (and the line and key when there is one), and nothing
// is created — the data_dir the file names does not exist afterwards.
func TestHardeningConfigFiles(t *testing.T) {
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	valid := strings.Replace(validYAML, "data_dir: /var/lib/walden/c1", "data_dir: "+dataDir, 1)
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := write("big.yaml", valid+"# "+strings.Repeat("x", MaxFileBytes)+"\n")

	cases := []struct {
		name, path string
		line       int
		key        string
		want       string
	}{
		{"/dev/zero (endless)", "/dev/zero", 0, "", "not a regular file (a character device)"},
		{"a FIFO (would block)", fifo, 0, "", "not a regular file (a FIFO)"},
		{"a directory", dir, 0, "", "not a regular file (a directory)"},
		{"over 1 MiB", big, 0, "", "larger than a configuration may be (1048576 bytes)"},
		{"a second YAML document", write("two.yaml", valid+"---\ncluster_name: other\n"), 15, "", "more than one YAML document"},
		{"a second document that is not YAML", write("two-bad.yaml", valid+"---\n: : :\n"), 0, "", "more than one YAML document"},
		{"a duration that overflows a sum", write("overflow.yaml", valid+"policy:\n  failure_timeout: 2562047h\n  restart_grace: 2562047h\n"),
			16, "policy.failure_timeout", "longer than any walden accepts (720h0m0s)"},
		{"a duration of more than 30 days", write("long.yaml", valid+"policy:\n  cooldown: 721h\n"), 16, "policy.cooldown", "longer than any walden accepts"},
		{"a raft tick of 10s", write("tick.yaml", valid+"raft:\n  tick_interval: 10s\n"), 16, "raft.tick_interval", "must be from 1ms to 1s"},
		{"an election of 5000 ticks", write("ticks.yaml", valid+"raft:\n  election_ticks: 5000\n"), 16, "raft.election_ticks", "at most 1000"},
		{"an election timeout of 100s", write("election.yaml", valid+"raft:\n  tick_interval: 1s\n  election_ticks: 100\n"), 17, "raft.election_ticks",
			"1m40s, longer than the longest election timeout walden accepts (1m0s)"},
		{"a snapshot count of 10^12", write("snap.yaml", valid+"raft:\n  snapshot_count: 1000000000000\n"), 16, "raft.snapshot_count", "at most 100000000"},
		// The listeners' limits (finding 2).
		{"no connection at all", write("conns.yaml", valid+"limits:\n  admin:\n    max_conns: 0\n"), 17, "limits.admin.max_conns", "must be from 1 to 1000000"},
		{"more per source than in all", write("source.yaml", valid+"limits:\n  raft:\n    max_conns_per_source: 300\n"), 17, "limits.raft.max_conns_per_source",
			"must be from 1 to max_conns (256)"},
		{"an hour to shake hands", write("hs.yaml", valid+"limits:\n  admin:\n    handshake_timeout: 1h\n"), 17, "limits.admin.handshake_timeout", "must be from 100ms to 5m0s"},
		{"no stream per connection", write("streams.yaml", valid+"limits:\n  admin:\n    max_concurrent_streams: 0\n"), 17, "limits.admin.max_concurrent_streams", "must be from 1 to 100000"},
		{"pings every millisecond", write("ping.yaml", valid+"limits:\n  raft:\n    keepalive_min_time: 1ms\n"), 17, "limits.raft.keepalive_min_time", "must be from 1s to 1h0m0s"},
		{"HTTP connections per source", write("httpsrc.yaml", valid+"limits:\n  http:\n    max_conns: 10\n    max_conns_per_source: 20\n"), 18, "limits.http.max_conns_per_source",
			"must be from 1 to max_conns (10)"},
	}
	for _, tc := range cases {
		done := make(chan error, 1)
		go func() { _, err := LoadServer(tc.path); done <- err }()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: LoadServer(%s) still running after 10s", tc.name, tc.path)
		}
		var ce *Error
		if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want a config error", tc.name, err)
			continue
		}
		if ce.File != tc.path || ce.Line != tc.line || ce.Key != tc.key || !strings.Contains(ce.Reason, tc.want) {
			t.Errorf("%s: %s:%d: %s: %q, want line %d key %q reason containing %q", tc.name, ce.File, ce.Line, ce.Key, ce.Reason, tc.line, tc.key, tc.want)
		}
		if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: data_dir created", tc.name)
		}
	}
	if st, err := os.Stat(fifo); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the FIFO changed: %v %v", st, err)
	}

	// Stream ids 0 and 2^64-1 in a broker's streams.
	for _, id := range []string{"0", "18446744073709551615"} {
		_, err := ParseBroker("b.yaml", []byte(strings.Replace(validBrokerYAML, "streams: [1, 2, 3]", "streams: [1, "+id+", 3]", 1)))
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != "streams[1]" || ce.Line != 9 || !strings.Contains(ce.Reason, "not allowed") {
			t.Errorf("stream %s: %v", id, err)
		}
	}

	// The valid file still loads, with 30-day durations.
	if _, err := LoadServer(write("ok.yaml", valid+"policy:\n  cooldown: 720h\n  restart_grace: 720h\n")); err != nil {
		t.Fatal(err)
	}
}
