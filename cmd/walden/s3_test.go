package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"walden/objstore"
)

// TestS3Process builds walden, runs `walden s3` on a free loopback port,
// puts and gets an object through the SDK, and stops it with SIGTERM.
func TestS3Process(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the walden binary")
	}
	bin := filepath.Join(t.TempDir(), "walden")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "s3data")
	cmd := exec.Command(bin, "s3", "--listen", "127.0.0.1:0", "--dir", dir, "--bucket", "one,two")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	}()

	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var endpoint string
	select {
	case l := <-lines:
		endpoint = strings.TrimPrefix(l, "endpoint ")
	case <-time.After(20 * time.Second):
		t.Fatalf("no endpoint line; stderr:\n%s", stderr.String())
	}
	if !strings.HasPrefix(endpoint, "http://127.0.0.1:") {
		t.Fatalf("endpoint %q", endpoint)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, bucket := range []string{"one", "two"} {
		c, err := objstore.New(ctx, objstore.FakeConfig(endpoint, bucket), objstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Upload(ctx, "a/b.obj", strings.NewReader("payload-"+bucket), int64(len("payload-"+bucket)), nil); err != nil {
			t.Fatalf("upload to %s: %v", bucket, err)
		}
		got, err := c.Get(ctx, "a/b.obj")
		if err != nil || string(got) != "payload-"+bucket {
			t.Fatalf("get from %s = %q, %v", bucket, got, err)
		}
	}
	// The data lives in the directory.
	if _, err := os.Stat(filepath.Join(dir, "buckets", "one", "a", "b.obj")); err != nil {
		t.Errorf("object not under --dir: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) || err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10s after SIGTERM")
	}
	if !strings.Contains(stderr.String(), "embedded S3 server listening") {
		t.Errorf("no listening log line:\n%s", stderr.String())
	}
}

func TestS3RequiresDir(t *testing.T) {
	cmd := newS3Cmd()
	cmd.SetArgs([]string{"--listen", "127.0.0.1:0"})
	cmd.SetOut(&strings.Builder{})
	cmd.SetErr(&strings.Builder{})
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "--dir") {
		t.Fatalf("without --dir: %v", err)
	}
}
