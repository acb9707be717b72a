package s3test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"walden/objstore"
)

// Bucket is the bucket every server started here has.
const Bucket = "walden-test"

// StartFake starts the in-process fake S3 on a free 127.0.0.1 port with
// Bucket created, and returns its Config. It stops at the end of the test.
func StartFake(t testing.TB) objstore.Config {
	t.Helper()
	fs, err := objstore.ServeFake("", t.TempDir(), nil, Bucket)
	if err != nil {
		t.Fatalf("start the fake S3: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = fs.Close(ctx)
	})
	return objstore.FakeConfig(fs.Endpoint, Bucket)
}

// VersityBin returns the path of the pinned versitygw that
// scripts/install-versitygw.sh installs (bin/tools/versitygw at the module
// root), or "" when it is not there.
func VersityBin() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "bin", "tools", "versitygw")
			if _, err := os.Stat(p); err == nil {
				return p
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Versity credentials of the root account of every gateway started here.
const (
	VersityAccessKeyID     = "waldenroot"
	VersitySecretAccessKey = "waldenroot-secret-key"
)

// StartVersity runs versitygw (binPath; "" means VersityBin) as a POSIX
// gateway on a free 127.0.0.1 port over a temporary directory, creates
// Bucket, and returns its Config. The test is skipped when the binary is
// missing. The gateway is stopped (SIGTERM, then SIGKILL) at the end of the
// test.
func StartVersity(t testing.TB, binPath string) objstore.Config {
	t.Helper()
	if binPath == "" {
		binPath = VersityBin()
	}
	if binPath == "" {
		t.Skip("s3test: bin/tools/versitygw not installed; run scripts/install-versitygw.sh (or make versitygw)")
	}
	if _, err := os.Stat(binPath); err != nil {
		t.Skipf("s3test: versitygw at %s: %v; run scripts/install-versitygw.sh", binPath, err)
	}
	root, sidecar := t.TempDir(), t.TempDir()
	port, err := freePort()
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logf, err := os.Create(filepath.Join(t.TempDir(), "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath,
		"--access", VersityAccessKeyID,
		"--secret", VersitySecretAccessKey,
		"--port", addr,
		"--quiet",
		// Metadata in a sidecar directory: no need for user xattrs on
		// the test file system.
		"posix", "--sidecar", sidecar, root)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY=", "ROOT_SECRET_KEY=")
	if err := cmd.Start(); err != nil {
		t.Fatalf("s3test: start versitygw: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
	})
	endpoint := "http://" + addr
	if err := waitHTTP(endpoint, exited, 15*time.Second); err != nil {
		out, _ := os.ReadFile(logf.Name())
		t.Fatalf("s3test: versitygw did not come up: %v\n%s", err, out)
	}
	cfg := objstore.FakeConfig(endpoint, Bucket)
	cfg.AccessKeyID, cfg.SecretAccessKey = VersityAccessKeyID, VersitySecretAccessKey
	c, err := objstore.New(context.Background(), cfg, objstore.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.EnsureBucket(ctx); err != nil {
		t.Fatalf("s3test: create bucket on versitygw: %v", err)
	}
	return cfg
}

// Backends returns the servers a test should run against: the fake always,
// versitygw when installed. Each is started lazily by its function.
func Backends() map[string]func(testing.TB) objstore.Config {
	return map[string]func(testing.TB) objstore.Config{
		"fake":      StartFake,
		"versitygw": func(t testing.TB) objstore.Config { return StartVersity(t, "") },
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP polls endpoint until it answers HTTP (any status), the process
// exits, or the timeout passes.
func waitHTTP(endpoint string, exited <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %v", err)
		default:
		}
		resp, err := client.Get(endpoint)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !strings.Contains(err.Error(), "refused") {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no answer on %s within %s", endpoint, timeout)
}
