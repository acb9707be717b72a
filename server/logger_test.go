package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/config"
	waldenv1 "walden/proto/walden/v1"
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

// lockedBuffer is a bytes.Buffer safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServerLogLinesHaveUniqueKeys runs a member at debug level through its
// start, calls and stop, and checks that no JSON line repeats a key (raft,
// storage, detection and gRPC lines all add node_id and component).
func TestServerLogLinesHaveUniqueKeys(t *testing.T) {
	var out lockedBuffer
	cfg := singleMember(t)
	s, err := New(cfg, NewLogger(config.Log{Level: "debug"}, &out))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	conn, err := grpc.NewClient(s.Addrs().Admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	if _, err := waldenv1.NewClusterClient(conn).MemberList(context.Background(), &waldenv1.MemberListRequest{}); err != nil {
		t.Fatal(err)
	}
	// A broker whose agent does not answer: the observer probes it and
	// reports what it sees.
	if _, err := waldenv1.NewAgentClient(conn).Register(context.Background(), &waldenv1.RegisterRequest{
		ClusterName: cfg.ClusterName, BrokerId: "b1", AgentAddr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), `"component":"observer"`) {
		if time.Now().After(deadline) {
			t.Fatal("the observer logged nothing about the broker")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := keysOnce(t, out.String())
	components := map[string]bool{}
	for _, l := range lines {
		if c, ok := l["component"].(string); ok {
			components[c] = true
		}
	}
	for _, c := range []string{"raft", "storage", "grpc", "observer"} {
		if !components[c] {
			t.Errorf("no line of component %s among %d lines", c, len(lines))
		}
	}
}
