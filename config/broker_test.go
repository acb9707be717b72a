package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const validBrokerYAML = `broker_id: b1
cluster_name: demo
listen: 127.0.0.1:9101
coordinators: [127.0.0.1:7001, 127.0.0.1:7002]
gossip: {listen: 127.0.0.1:7401, join: [127.0.0.1:7201]}
agent_listen: 127.0.0.1:7501
wal: {path: /var/lib/walden/b1.wal, capacity: 1048576}
s3: {endpoint: "http://127.0.0.1:9000", bucket: walden, path_style: true, access_key_id: a, secret_access_key: b}
streams: [1, 2, 3]
`

func TestParseBrokerValid(t *testing.T) {
	cfg, err := ParseBroker("broker.yaml", []byte(validBrokerYAML))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BrokerID != "b1" || cfg.Listen != "127.0.0.1:9101" || len(cfg.Streams) != 3 || cfg.Streams[2] != 3 ||
		cfg.WAL.Capacity != 1<<20 || cfg.S3.Bucket != "walden" || !cfg.S3.PathStyle || cfg.S3.Region != "us-east-1" {
		t.Fatalf("decoded %+v", cfg)
	}
	if cfg.UploadInterval != time.Second || cfg.UploadBytes != 1<<18 ||
		cfg.Takeover || cfg.TakeoverInterval != 500*time.Millisecond || cfg.LeaseSafetyMargin != 500*time.Millisecond {
		t.Fatalf("defaults %+v", cfg)
	}
	a := cfg.AgentConfig("127.0.0.1:9101")
	if err := a.Validate(); err != nil {
		t.Fatalf("agent config: %v", err)
	}
	if a.Listen != "127.0.0.1:7501" || a.BrokerAddr != "127.0.0.1:9101" || a.WAL.Path != cfg.WAL.Path {
		t.Fatalf("agent config %+v", a)
	}
}

func TestParseBrokerErrors(t *testing.T) {
	cases := []struct{ name, old, new, key string }{
		{"unknown key", "streams: [1, 2, 3]", "stream: [1]", "stream"},
		{"missing wal path", "wal: {path: /var/lib/walden/b1.wal, capacity: 1048576}", "wal: {capacity: 1048576}", "wal.path"},
		{"bad capacity", "capacity: 1048576", "capacity: 1000", "wal.capacity"},
		{"negative stream", "streams: [1, 2, 3]", "streams: [1, -2]", "streams[1]"},
		{"duplicate stream", "streams: [1, 2, 3]", "streams: [1, 2, 1]", "streams[2]"},
		{"no bucket", "bucket: walden, ", "", "s3.bucket"},
		{"wildcard agent", "agent_listen: 127.0.0.1:7501", "agent_listen: 0.0.0.0:7501", "agent_listen"},
		{"no gossip", "gossip: {listen: 127.0.0.1:7401, join: [127.0.0.1:7201]}\n", "", "gossip.listen"},
		{"upload bytes", "streams: [1, 2, 3]", "upload_bytes: 900000", "upload_bytes"},
		{"interval", "streams: [1, 2, 3]", "upload_interval: 0s", "upload_interval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			y := strings.Replace(validBrokerYAML, c.old, c.new, 1)
			if y == validBrokerYAML {
				t.Fatalf("replacement %q not found", c.old)
			}
			_, err := ParseBroker("broker.yaml", []byte(y))
			var ce *Error
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v", err)
			}
			if !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), "broker.yaml:") {
				t.Fatalf("error %q does not name %s and the file", err, c.key)
			}
		})
	}
}

func TestLoadBrokerFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "broker.yaml")
	if err := os.WriteFile(p, []byte(validBrokerYAML+"takeover: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadBroker(p)
	if err != nil || !cfg.Takeover || cfg.Source() != p {
		t.Fatalf("%+v %v", cfg, err)
	}
}
