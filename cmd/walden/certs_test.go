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

// TestCertsIssueP12 writes the browser's bundle beside the PEM files, with
// the passphrase from a file; every refusal writes nothing at all.
func TestCertsIssueP12(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := runCerts(t, "init", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("correct horse battery\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p12 := filepath.Join(t.TempDir(), "alice.p12")
	before, _ := os.ReadDir(dir)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--p12", p12, "--p12-password-file", short}, "at least 8 characters"},
		{[]string{"--p12", p12, "--p12-password-file", filepath.Join(dir, "missing")}, "--p12-password-file"},
		{[]string{"--p12-password-file", pw}, "goes with --p12"},
	} {
		_, err := runCerts(t, append([]string{"issue", "--dir", dir, "--name", "alice", "--role", "reader"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	after, _ := os.ReadDir(dir)
	if len(before) != len(after) {
		t.Fatalf("a refused issue wrote files: %v -> %v", before, after)
	}
	if _, err := os.Stat(p12); !os.IsNotExist(err) {
		t.Fatalf("a refused issue wrote %s", p12)
	}
	out, err := runCerts(t, "issue", "--dir", dir, "--name", "alice", "--role", "reader", "--p12", p12, "--p12-password-file", pw, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc["p12_file"] != p12 || doc["role"] != "reader" {
		t.Fatalf("issue --p12 -o json: %v %s", err, out)
	}
	if _, err := runCerts(t, "issue", "--dir", dir, "--name", "bob", "--role", "reader", "--p12", p12, "--p12-password-file", pw); err == nil ||
		!strings.Contains(err.Error(), "already exists") {
		t.Fatalf("a bundle over an existing file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "bob.pem")); !os.IsNotExist(err) {
		t.Fatal("bob's certificate was issued although its bundle could not be written")
	}
}
