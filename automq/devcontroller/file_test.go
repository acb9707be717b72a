package devcontroller

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseFile(t *testing.T) {
	fc, err := ParseFile("dev.yaml", []byte(`
cluster_id: dev
listen: [127.0.0.1:0, 127.0.0.1:0]
http: 127.0.0.1:0
streams: [0, "3-5", 9]
nodes:
  - node_id: 1
    node_epoch: 1700000000000
    wal_config: 0@file:///wal
    tags: {zone: b, rack: r1}
  - {node_id: 2, state: FENCED}
sasl:
  mechanisms: [SCRAM-SHA-512]
  users: {walden: secret}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := &FileConfig{
		ClusterID: "dev",
		Listen:    []string{"127.0.0.1:0", "127.0.0.1:0"},
		HTTP:      "127.0.0.1:0",
		Streams:   []int64{0, 3, 4, 5, 9},
		Nodes: []NodeRegistration{
			{NodeID: 1, NodeEpoch: 1700000000000, WALConfig: "0@file:///wal", Tags: []Tag{{"rack", "r1"}, {"zone", "b"}}},
			{NodeID: 2, State: NodeFencedState},
		},
		SASL: &SASLConfig{Mechanisms: []string{MechanismSCRAMSHA512}, Users: map[string]string{"walden": "secret"}},
	}
	if !reflect.DeepEqual(fc, want) {
		t.Fatalf("got %+v\nwant %+v", fc, want)
	}
}

func TestParseFileErrors(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want string
	}{
		{"cluster_id: c\nbogus: 1\n", "dev.yaml:2: bogus: unknown key"},
		{"cluster_id: c\nstreams: \"2-1\"\n", "dev.yaml:2: streams: \"2-1\" is not a range"},
		{"cluster_id: c\nstreams: [1, 1]\n", "dev.yaml:2: streams: stream 1 is listed twice"},
		{"nodes:\n  - node_id: 1\n  - node_id: 1\n", "dev.yaml:3: nodes[1].node_id: node 1 is listed twice"},
		{"nodes:\n  - node_id: 1\n    state: DEAD\n", "dev.yaml:3: nodes[0].state: \"DEAD\" is not ACTIVE"},
		{"tls:\n  cert_file: a.pem\n", "dev.yaml:1: tls: cert_file and key_file go together"},
		{"sasl:\n  users: {a: \"\"}\n", "dev.yaml:2: sasl.users: user names and passwords must not be empty"},
		{"sasl:\n  users: {a: b}\n  mechanisms: [MD5]\n", "dev.yaml:3: sasl.mechanisms: \"MD5\" is not PLAIN"},
		{"voters: -1\n", "dev.yaml:1: voters: must be at least 1"},
		{"cluster_id: [c\n", "dev.yaml: not valid YAML"},
	} {
		_, err := ParseFile("dev.yaml", []byte(tc.yaml))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.Is(err, ErrInvalidFile) {
			t.Errorf("%q: err = %v, want %q...", tc.yaml, err, tc.want)
		}
	}
}

func TestParseStreams(t *testing.T) {
	got, err := ParseStreams(" 7, 0-2 ,,10")
	if err != nil || !reflect.DeepEqual(got, []int64{7, 0, 1, 2, 10}) {
		t.Fatalf("got %v %v", got, err)
	}
	for _, bad := range []string{"-1", "a", "3-1", "1-2,2", "0-2000000"} {
		if _, err := ParseStreams(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
