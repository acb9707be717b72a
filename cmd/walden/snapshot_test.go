package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"walden/filecheck"
)

// TestSnapshotFilesAreChecked is finding 6 of the hardening table:
// `walden snapshot status /dev/zero` grew to 2.7 GB and kept growing, a
// FIFO hung it, and restore the same. A snapshot file that is not a
// regular file, or larger than a snapshot may be, is refused at once,
// before it is read.
func TestSnapshotFilesAreChecked(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "snap.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "new.yaml")
	if err := os.WriteFile(cfg, []byte("cluster_name: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"/dev/zero", fifo, dir} {
		for _, args := range [][]string{{"status", file}, {"restore", file, "--config", cfg}} {
			cmd := newSnapshotCmd()
			cmd.SetArgs(args)
			cmd.SetOut(&strings.Builder{})
			cmd.SetErr(&strings.Builder{})
			done := make(chan error, 1)
			go func() { done <- cmd.Execute() }()
			select {
			case err := <-done:
				if !errors.Is(err, filecheck.ErrNotRegular) || !strings.Contains(err.Error(), file) {
					t.Errorf("snapshot %s: %v, want a refusal naming the file as not a regular file", strings.Join(args, " "), err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("snapshot %s: still running after 10s", strings.Join(args, " "))
			}
		}
	}
}
