package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"walden/config"
)

// keysOnce decodes every JSON line of out and fails when a key repeats
// at any level.
func keysOnce(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		dec := json.NewDecoder(strings.NewReader(line))
		if err := checkObject(dec); err != nil {
			t.Fatalf("%v in %s", err, line)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	return lines
}

// checkObject reads one JSON value from dec, failing on a repeated key of
// any object in it.
func checkObject(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok || (d != '{' && d != '[') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		if d == '{' {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key := k.(string)
			if seen[key] {
				return &repeatedKey{key}
			}
			seen[key] = true
		}
		if err := checkObject(dec); err != nil {
			return err
		}
	}
	_, err = dec.Token()
	return err
}

type repeatedKey struct{ key string }

func (e *repeatedKey) Error() string { return "key " + e.key + " repeated" }

func TestLoggerWritesEachKeyOnce(t *testing.T) {
	var buf bytes.Buffer
	l := NewLogger(config.Log{Level: "debug"}, &buf)
	l = l.With("node_id", "c1", "component", "server")
	l.With("node_id", "c1", "component", "raft").Info("leader changed", "term", 3, "component", "raft-transport")
	l.WithGroup("job").With("id", "j1").Info("step", "id", "j2", "node_id", "inner")
	l.Info("inline group", slog.Group("", slog.String("node_id", "c9")))
	lines := keysOnce(t, buf.String())
	if got := lines[0]; got["node_id"] != "c1" || got["component"] != "raft-transport" || got["term"] != float64(3) {
		t.Fatalf("line 1 = %v", got)
	}
	job, _ := lines[1]["job"].(map[string]any)
	if lines[1]["node_id"] != "c1" || job["id"] != "j2" || job["node_id"] != "inner" {
		t.Fatalf("line 2 = %v", lines[1])
	}
	if lines[2]["node_id"] != "c9" {
		t.Fatalf("line 3 = %v", lines[2])
	}
}

func TestLoggerLevelChangesAtRunTime(t *testing.T) {
	var buf bytes.Buffer
	level := new(slog.LevelVar)
	l := NewLevelLogger(config.Log{Level: "warn"}, &buf, level)
	l.Info("hidden")
	level.Set(ParseLevel("debug"))
	l.Debug("shown")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, "shown") {
		t.Fatalf("output %q", out)
	}
}
