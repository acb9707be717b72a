package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// runCerts runs `walden certs ...` in-process on a fresh command tree.
func runCerts(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "walden", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(newCertsCmd())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"certs"}, args...))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCertsCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	out, err := runCerts(t, "init", "--dir", dir)
	if err != nil || !strings.Contains(out, "gossip.key") || !strings.Contains(out, "next: walden certs issue") {
		t.Fatalf("init: %v\n%s", err, out)
	}
	out, err = runCerts(t, "issue", "--dir", dir, "--name", "c1", "--role", "coordinator", "--host", "10.0.0.11")
	if err != nil || !strings.Contains(out, "role    coordinator") || !strings.Contains(out, "10.0.0.11") {
		t.Fatalf("issue c1: %v\n%s", err, out)
	}
	out, err = runCerts(t, "issue", "--dir", dir, "--name", "b1-agent", "--role", "agent", "--broker-id", "b1", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc["role"] != "agent" || doc["broker_id"] != "b1" || doc["cert_file"] != filepath.Join(dir, "b1-agent.pem") {
		t.Fatalf("issue -o json: %v %s", err, out)
	}
	out, err = runCerts(t, "show", filepath.Join(dir, "b1-agent.pem"))
	if err != nil || !strings.Contains(out, "agent of broker b1") || !strings.Contains(out, "a client certificate only") {
		t.Fatalf("show: %v\n%s", err, out)
	}

	// Refusals: one sentence each, nothing written.
	before, _ := os.ReadDir(dir)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"init", "--dir", dir}, "already exists"},
		{[]string{"issue", "--dir", dir, "--name", "c1", "--role", "reader"}, "c1.pem already exists"},
		{[]string{"issue", "--dir", dir, "--name", "x", "--role", "root"}, `unknown role "root"`},
		{[]string{"issue", "--dir", dir, "--name", "x", "--role", "agent"}, "--broker-id is required with --role agent"},
		{[]string{"issue", "--dir", dir, "--name", "x", "--role", "reader", "--broker-id", "b1"}, "only for the agent and broker roles"},
		{[]string{"issue", "--dir", dir, "--name", "x", "--role", "coordinator", "--host", "not a host"}, `host "not a host"`},
		{[]string{"issue", "--dir", dir, "--name", "../x", "--role", "reader"}, "invalid name"},
		{[]string{"issue", "--dir", t.TempDir(), "--name", "x", "--role", "reader"}, "no usable CA"},
		{[]string{"issue", "--dir", dir, "--role", "reader"}, "--name NAME is required"},
	} {
		_, err := runCerts(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "certs: certs") || strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	after, _ := os.ReadDir(dir)
	if !slices.EqualFunc(before, after, func(a, b os.DirEntry) bool { return a.Name() == b.Name() }) {
		t.Fatalf("files changed: %v -> %v", before, after)
	}
}
