package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const validAutomqBrokerYAML = `broker_id: b1
mode: automq
listen: 127.0.0.1:9101
wal: {path: /var/lib/walden/b1.wal, capacity: 1048576}
s3: {endpoint: "http://127.0.0.1:9000", bucket: automq-data, path_style: true, access_key_id: a, secret_access_key: b}
streams: [0, 1, 2]
automq:
  node_id: 1
  cluster_id: dev
  controller: {voters: ["127.0.0.1:9093", "127.0.0.1:9094"]}
  metadata_url: http://127.0.0.1:9099
  takeover:
    - {node_id: 2, addr: "127.0.0.1:9102", streams: [10, 11]}
`

func TestParseAutomqBrokerValid(t *testing.T) {
	cfg, err := ParseBroker("broker.yaml", []byte(validAutomqBrokerYAML))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Automq
	if !cfg.IsAutomq() || a.NodeID != 1 || a.ClusterID != "dev" || len(a.Controller.Voters) != 2 ||
		len(a.Takeover) != 1 || a.Takeover[0].NodeID != 2 || a.Takeover[0].Streams[1] != 11 || cfg.Streams[0] != 0 {
		t.Fatalf("decoded %+v", cfg)
	}
	if a.TakeoverAfter != time.Second || a.OpenBackoff != 100*time.Millisecond || a.OpenMaxBackoff != 500*time.Millisecond ||
		a.BlockSize != 512<<10 || a.StreamSplitSize != 8<<20 || a.ProducerScanBytes != 64<<20 || a.Controller.RequestTimeout != 10*time.Second {
		t.Fatalf("defaults %+v", a)
	}
	f := cfg.FailoverConfig()
	if err := f.Validate(); err != nil || f.S3.Bucket != "automq-data" || f.ClusterID != "dev" {
		t.Fatalf("failover config %+v: %v", f, err)
	}
	// Mode walden stays the default.
	w, err := ParseBroker("broker.yaml", []byte(validBrokerYAML))
	if err != nil || w.IsAutomq() || w.Mode != BrokerModeWalden {
		t.Fatalf("%+v %v", w, err)
	}
}

func TestParseAutomqBrokerErrors(t *testing.T) {
	cases := []struct{ name, old, new, key string }{
		{"bad mode", "mode: automq", "mode: kafka", "mode"},
		{"no node id", "  node_id: 1\n", "", "automq.node_id"},
		{"negative node id", "node_id: 1\n", "node_id: -1\n", "automq.node_id"},
		{"no cluster id", "  cluster_id: dev\n", "", "automq.cluster_id"},
		{"no voters", `  controller: {voters: ["127.0.0.1:9093", "127.0.0.1:9094"]}`, "", "automq.controller.voters"},
		{"voter with id", `"127.0.0.1:9093",`, `"1@127.0.0.1:9093",`, "automq.controller.voters[0]"},
		{"no metadata url", "  metadata_url: http://127.0.0.1:9099\n", "", "automq.metadata_url"},
		{"bad metadata url", "metadata_url: http://127.0.0.1:9099", "metadata_url: 127.0.0.1:9099", "automq.metadata_url"},
		{"prefix", "access_key_id: a,", "prefix: x, access_key_id: a,", "s3.prefix"},
		{"coordinators", "streams: [0, 1, 2]", "streams: [0]\ncoordinators: [127.0.0.1:7001]", "coordinators"},
		{"agent", "streams: [0, 1, 2]", "streams: [0]\nagent_listen: 127.0.0.1:7501", "agent_listen"},
		{"stream twice", "streams: [10, 11]", "streams: [1, 11]", "automq.takeover[0].streams[0]"},
		{"own node", "{node_id: 2,", "{node_id: 1,", "automq.takeover[0].node_id"},
		{"no addr", `addr: "127.0.0.1:9102", `, "", "automq.takeover[0].addr"},
		{"no streams", ", streams: [10, 11]}", "}", "automq.takeover[0].streams"},
		{"stream out of range", "streams: [0, 1, 2]", "streams: [9223372036854775808]", "streams[0]"},
		{"takeover after", "  metadata_url:", "  takeover_after: 0s\n  metadata_url:", "automq.takeover_after"},
		{"backoff", "  metadata_url:", "  open_backoff: 1s\n  metadata_url:", "automq.open_max_backoff"},
		{"block size", "  metadata_url:", "  block_size: 0\n  metadata_url:", "automq.block_size"},
		{"sasl", `"127.0.0.1:9094"]}`, `"127.0.0.1:9094"], sasl: {mechanism: GSSAPI}}`, "automq.controller.sasl.mechanism"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			y := strings.Replace(validAutomqBrokerYAML, c.old, c.new, 1)
			if y == validAutomqBrokerYAML {
				t.Fatalf("replacement %q not found", c.old)
			}
			_, err := ParseBroker("broker.yaml", []byte(y))
			var ce *Error
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v", err)
			}
			if !strings.Contains(err.Error(), c.key+":") || !strings.Contains(err.Error(), "broker.yaml:") {
				t.Fatalf("error %q does not name %s and the file", err, c.key)
			}
		})
	}
	// The automq section belongs to mode automq.
	_, err := ParseBroker("broker.yaml", []byte(validBrokerYAML+"automq: {node_id: 1}\n"))
	if err == nil || !strings.Contains(err.Error(), "automq:") {
		t.Fatalf("automq section in mode walden: %v", err)
	}
}
