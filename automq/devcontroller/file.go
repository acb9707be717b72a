package devcontroller

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ErrInvalidFile is matched (errors.Is) by every *FileError.
var ErrInvalidFile = errors.New("invalid development controller file")

// FileError is one mistake in a development controller's YAML file. Its
// text is "FILE:LINE: KEY: reason" (LINE and KEY left out when unknown).
type FileError struct {
	File   string
	Line   int
	Key    string
	Reason string
}

func (e *FileError) Error() string {
	s := e.File + ":"
	if e.Line > 0 {
		s += strconv.Itoa(e.Line) + ":"
	}
	s += " "
	if e.Key != "" {
		s += e.Key + ": "
	}
	return s + e.Reason
}

// Is makes errors.Is(err, ErrInvalidFile) true.
func (e *FileError) Is(target error) bool { return target == ErrInvalidFile }

// yamlUnknownField matches yaml.v3's error for a key the file may not have.
var yamlUnknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)

// FileConfig is the YAML file of `walden automq dev-controller --config`.
// Flags given on the command line override its keys.
//
//	cluster_id: dev-cluster
//	listen: [127.0.0.1:9093, 127.0.0.1:9094, 127.0.0.1:9095]  # one per voter
//	http: 127.0.0.1:9099
//	streams: "0-99,1000"            # or a list: [0, 1, "5-9"]
//	nodes:
//	  - {node_id: 1, node_epoch: 0, wal_config: "0@file:///data/wal", state: ACTIVE, tags: {zone: a}}
//	tls: {cert_file: c.pem, key_file: c-key.pem, client_ca_file: ca.pem}
//	sasl: {mechanisms: [SCRAM-SHA-512], users: {walden: secret}}
type FileConfig struct {
	ClusterID string
	Listen    []string
	Voters    int
	HTTP      string
	Streams   []int64
	Nodes     []NodeRegistration
	TLS       FileTLS
	SASL      *SASLConfig
}

// FileTLS names the listeners' certificate files.
type FileTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile, when set, requires client certificates signed by it.
	ClientCAFile string `yaml:"client_ca_file"`
}

// rawFile is the YAML as written; streams and nodes are checked by hand.
type rawFile struct {
	ClusterID string       `yaml:"cluster_id"`
	Listen    stringOrList `yaml:"listen"`
	Voters    int          `yaml:"voters"`
	HTTP      string       `yaml:"http"`
	Streams   stringOrList `yaml:"streams"`
	Nodes     []struct {
		NodeID    int32             `yaml:"node_id"`
		NodeEpoch int64             `yaml:"node_epoch"`
		WALConfig string            `yaml:"wal_config"`
		State     string            `yaml:"state"`
		Tags      map[string]string `yaml:"tags"`
	} `yaml:"nodes"`
	TLS  FileTLS `yaml:"tls"`
	SASL *struct {
		Mechanisms []string          `yaml:"mechanisms"`
		Users      map[string]string `yaml:"users"`
		Iterations int               `yaml:"iterations"`
	} `yaml:"sasl"`
}

// stringOrList reads a scalar ("1-5,9") or a list of scalars.
type stringOrList []string

func (s *stringOrList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*s = []string{n.Value}
		return nil
	case yaml.SequenceNode:
		out := make([]string, 0, len(n.Content))
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: a list of scalars is expected", c.Line)
			}
			out = append(out, c.Value)
		}
		*s = out
		return nil
	}
	return fmt.Errorf("line %d: a scalar or a list is expected", n.Line)
}

// LoadFile reads and checks a development controller's YAML file.
func LoadFile(path string) (*FileConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ParseFile(path, data)
}

// ParseFile checks the YAML data of the file named name.
func ParseFile(name string, data []byte) (*FileConfig, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, &FileError{File: name, Reason: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	lines := map[string]int{}
	keyLines(&root, "", lines)
	bad := func(key, format string, args ...any) error {
		line := lines[key]
		for k := key; line == 0 && k != ""; {
			if i := strings.LastIndexAny(k, ".["); i >= 0 {
				k = k[:i]
			} else {
				k = ""
			}
			line = lines[k]
		}
		return &FileError{File: name, Line: line, Key: key, Reason: fmt.Sprintf(format, args...)}
	}

	var raw rawFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		msg := strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:\n  ")
		first, _, _ := strings.Cut(msg, "\n")
		if m := yamlUnknownField.FindStringSubmatch(first); m != nil {
			line, _ := strconv.Atoi(m[1])
			return nil, &FileError{File: name, Line: line, Key: m[2], Reason: "unknown key"}
		}
		return nil, &FileError{File: name, Reason: first}
	}
	fc := &FileConfig{ClusterID: raw.ClusterID, Listen: raw.Listen, Voters: raw.Voters, HTTP: raw.HTTP, TLS: raw.TLS}
	if fc.Voters < 0 {
		return nil, bad("voters", "must be at least 1")
	}
	if len(raw.Streams) > 0 {
		ids, err := ParseStreams(strings.Join(raw.Streams, ","))
		if err != nil {
			return nil, bad("streams", "%v", err)
		}
		fc.Streams = ids
	}
	seen := map[int32]bool{}
	for i, n := range raw.Nodes {
		key := fmt.Sprintf("nodes[%d]", i)
		if n.NodeID < 0 {
			return nil, bad(key+".node_id", "must not be negative")
		}
		if seen[n.NodeID] {
			return nil, bad(key+".node_id", "node %d is listed twice", n.NodeID)
		}
		seen[n.NodeID] = true
		st := NodeState(n.State)
		if st != "" && !st.Valid() {
			return nil, bad(key+".state", "%q is not ACTIVE, FENCED, CONTROLLED_SHUTDOWN or UNKNOWN", n.State)
		}
		reg := NodeRegistration{NodeID: n.NodeID, NodeEpoch: n.NodeEpoch, WALConfig: n.WALConfig, State: st}
		for _, k := range slices.Sorted(maps.Keys(n.Tags)) {
			reg.Tags = append(reg.Tags, Tag{Key: k, Value: n.Tags[k]})
		}
		fc.Nodes = append(fc.Nodes, reg)
	}
	if (fc.TLS.CertFile == "") != (fc.TLS.KeyFile == "") {
		return nil, bad("tls", "cert_file and key_file go together")
	}
	if fc.TLS.ClientCAFile != "" && fc.TLS.CertFile == "" {
		return nil, bad("tls.client_ca_file", "needs cert_file and key_file")
	}
	if raw.SASL != nil {
		fc.SASL = &SASLConfig{Mechanisms: raw.SASL.Mechanisms, Users: raw.SASL.Users, Iterations: raw.SASL.Iterations}
		if _, err := newSASLAuthenticator(fc.SASL); err != nil {
			var se *SASLConfigError
			if errors.As(err, &se) {
				return nil, bad(se.Key, "%s", se.Reason)
			}
			return nil, bad("sasl", "%v", err)
		}
	}
	return fc, nil
}

// keyLines records the line of every mapping key under prefix.
func keyLines(n *yaml.Node, prefix string, out map[string]int) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			keyLines(c, prefix, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			if prefix != "" {
				key = prefix + "." + key
			}
			out[key] = n.Content[i].Line
			keyLines(n.Content[i+1], key, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			key := fmt.Sprintf("%s[%d]", prefix, i)
			out[key] = c.Line
			keyLines(c, key, out)
		}
	}
}

// ParseStreams reads a list of stream ids and inclusive ranges, e.g.
// "0-99,1000,1002": each id once, none negative, at most a million.
func ParseStreams(spec string) ([]int64, error) {
	var out []int64
	seen := map[int64]bool{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.ParseInt(strings.TrimSpace(lo), 10, 64)
		if err != nil || first < 0 {
			return nil, fmt.Errorf("%q is not a stream id or a range FIRST-LAST of them", part)
		}
		last := first
		if isRange {
			last, err = strconv.ParseInt(strings.TrimSpace(hi), 10, 64)
			if err != nil || last < first {
				return nil, fmt.Errorf("%q is not a range FIRST-LAST with FIRST <= LAST", part)
			}
		}
		if last-first >= 1_000_000 || len(out)+int(last-first+1) > 1_000_000 {
			return nil, fmt.Errorf("more than a million streams")
		}
		for id := first; id <= last; id++ {
			if seen[id] {
				return nil, fmt.Errorf("stream %d is listed twice", id)
			}
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

// ServerTLS loads the listeners' TLS configuration; nil when no
// certificate is configured.
func (t FileTLS) ServerTLS() (*tls.Config, error) {
	if t.CertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: cert_file %s, key_file %s: %w", t.CertFile, t.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: client_ca_file %s holds no PEM certificate", t.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
