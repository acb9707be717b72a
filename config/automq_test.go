package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"walden/automq/failover"
	"walden/config"
)

// TestLoadAutoMQFailover: the failover tool's file holds the keys of the
// recovery.automq section; flags win over it; errors name file, line and
// key.
func TestLoadAutoMQFailover(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "automq.yaml")
	yaml := "cluster_id: prod\ncontroller:\n  voters: [\"10.0.0.1:9093\"]\n  sasl:\n    mechanism: SCRAM-SHA-512\n    username: walden\n    password_file: /etc/walden/pw\nblock_size: 1048576\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadAutoMQFailover(path, func(c *failover.Config) { c.S3.Bucket = "data" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClusterID != "prod" || cfg.BlockSize != 1<<20 || cfg.Controller.SASL.Mechanism != "SCRAM-SHA-512" || cfg.S3.Bucket != "data" ||
		cfg.StreamSplitSize != failover.DefaultStreamSplitSize {
		t.Fatalf("config %+v", cfg)
	}
	bad := "cluster_id: prod\ncontroller:\n  voters: [\"10.0.0.1:9093\"]\nblock_size: -3\n"
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = config.LoadAutoMQFailover(path, nil)
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "block_size" || ce.Line != 4 || ce.File != path {
		t.Fatalf("error %v, want block_size at line 4 of %s", err, path)
	}
	if err := os.WriteFile(path, []byte("cluster_id: prod\nvoters: [x]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.LoadAutoMQFailover(path, nil); err == nil || !strings.Contains(err.Error(), "voters") {
		t.Fatalf("an unknown top-level key: %v", err)
	}
}
