package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"

	"walden/automq/devcontroller"
	"walden/automq/protocol"
)

// TestDevControllerCommand runs `walden automq dev-controller` with two
// voters, a YAML file and flags over it, reads its ready line, talks to the
// voters with franz-go and to the HTTP endpoint, and stops it.
func TestDevControllerCommand(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "dc.yaml")
	if err := os.WriteFile(file, []byte("cluster_id: from-file\nstreams: \"0-1\"\nnodes:\n  - {node_id: 4, node_epoch: 12}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := newAutomqDevControllerCmd()
	out, w := io.Pipe()
	cmd.SetOut(w)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--config", file, "--cluster-id", "dev", "--listen", "127.0.0.1:0", "--voters", "2",
		"--streams", "0-3", "--http", "127.0.0.1:0", "-o", "json"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx); _ = w.Close() }()

	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var ready devControllerReady
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("the command ended: %v", <-done)
		}
		if err := json.Unmarshal([]byte(l), &ready); err != nil {
			t.Fatalf("ready line %q: %v", l, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no ready line")
	}
	if ready.ClusterID != "dev" || len(ready.Voters) != 2 || ready.ActiveVoter != 1 || !strings.HasPrefix(ready.HTTP, "http://127.0.0.1:") {
		t.Fatalf("ready %+v", ready)
	}

	var view devcontroller.View
	getJSONBody(t, ready.HTTP+"/v1/state", &view)
	if len(view.Streams) != 4 || len(view.Registered) != 1 || view.Registered[0].NodeEpoch != 12 || view.ClusterID != "dev" {
		t.Fatalf("state %+v", view)
	}

	versions := kversion.Stable()
	for _, a := range protocol.APIs {
		versions.SetMaxKeyVersion(a.Key, a.MaxVersion)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(ready.Voters[1]), kgo.MaxVersions(versions), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ask := func() int16 {
		rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
		defer rcancel()
		resp, err := cl.SeedBrokers()[0].Request(rctx, &protocol.AutomqGetNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.(*protocol.AutomqGetNodesResponse).ErrorCode
	}
	if code := ask(); devcontroller.Code(code) != devcontroller.NotController {
		t.Fatalf("voter 2 answered %v, want NOT_CONTROLLER", devcontroller.Code(code))
	}
	resp, err := http.Post(ready.HTTP+"/v1/active", "application/json", strings.NewReader(`{"voter": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/active: %s", resp.Status)
	}
	if code := ask(); code != 0 {
		t.Fatalf("voter 2, now active, answered %v", devcontroller.Code(code))
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the command returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the command did not stop")
	}
}

func getJSONBody(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func TestVoterAddrs(t *testing.T) {
	for _, tc := range []struct {
		listen []string
		voters int
		want   string
	}{
		{[]string{"127.0.0.1:0"}, 3, "127.0.0.1:0,127.0.0.1:0,127.0.0.1:0"},
		{[]string{"127.0.0.1:9093"}, 3, "127.0.0.1:9093,127.0.0.1:9094,127.0.0.1:9095"},
		{[]string{"a:1", "b:2"}, 2, "a:1,b:2"},
		{[]string{"a:1", "b:2"}, 3, "error"},
		{[]string{"127.0.0.1:65535"}, 2, "error"},
	} {
		got, err := voterAddrs(tc.listen, tc.voters)
		s := strings.Join(got, ",")
		if err != nil {
			s = "error"
		}
		if s != tc.want {
			t.Errorf("%v × %d = %s (%v), want %s", tc.listen, tc.voters, s, err, tc.want)
		}
	}
}
