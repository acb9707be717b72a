package s3test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"walden/objstore"
)

func TestStartFake(t *testing.T) {
	cfg := StartFake(t)
	if !strings.HasPrefix(cfg.Endpoint, "http://127.0.0.1:") || cfg.Bucket != Bucket || !cfg.PathStyle {
		t.Fatalf("config %+v", cfg)
	}
	c, err := objstore.New(context.Background(), cfg, objstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(context.Background(), "k", strings.NewReader("v"), 1, nil); err != nil {
		t.Fatalf("upload to the fake's bucket: %v", err)
	}
}

func TestStartVersitySkipsWithoutBinary(t *testing.T) {
	var inner *testing.T
	t.Run("missing", func(t *testing.T) {
		inner = t
		StartVersity(t, filepath.Join(t.TempDir(), "no-such-versitygw"))
		t.Error("StartVersity returned for a missing binary")
	})
	if !inner.Skipped() {
		t.Fatal("a missing versitygw did not skip the test")
	}
}

func TestStartVersity(t *testing.T) {
	cfg := StartVersity(t, "")
	c, err := objstore.New(context.Background(), cfg, objstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(context.Background(), "k", strings.NewReader("v"), 1, nil); err != nil {
		t.Fatalf("upload to versitygw: %v", err)
	}
	// A wrong secret is refused: the gateway checks signatures.
	bad := cfg
	bad.SecretAccessKey = "wrong"
	cb, err := objstore.New(context.Background(), bad, objstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Get(context.Background(), "k"); err == nil {
		t.Fatal("versitygw accepted a wrong secret")
	}
}
