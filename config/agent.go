package config

import (
	"errors"
	"strings"
	"time"

	"walden/gossip"
)

// Agent is the configuration of one `walden agent`, the sidecar (or, through
// package agent, the library) that holds one broker's lease.
type Agent struct {
	// BrokerID is the broker this agent speaks for. Required.
	BrokerID string `yaml:"broker_id"`
	// ClusterName is the coordinators' cluster_name; gossip members and
	// registrations of another cluster are refused. Required.
	ClusterName string `yaml:"cluster_name"`
	// Coordinators lists the coordinators' admin gRPC addresses (host:port).
	// Any member answers: followers forward to the leader or name it.
	// Required, at least one.
	Coordinators []string `yaml:"coordinators"`
	// Gossip is the agent's membership in the gossip pool (memberlist). Its
	// listen key is required; the timing keys default to memberlist's LAN
	// values and must match the coordinators'.
	Gossip gossip.Config `yaml:"gossip"`
	// Listen is the local HTTP endpoint (GET /v1/lease, GET /healthz) that
	// the broker asks and the coordinators probe. Its host must be one the
	// coordinators can dial; port 0 picks a free port. Required.
	Listen string `yaml:"listen"`
	// BrokerAddr is the broker's own API address, reported to the cluster.
	// Optional.
	BrokerAddr string `yaml:"broker_addr"`
	// WAL says where the broker's write-ahead log lives, so that a
	// coordinator can recover it. Required.
	WAL WALLocation `yaml:"wal"`
	// LeaseSafetyMargin is subtracted from the lease granted by a successful
	// renewal: the agent stops confirming the lease at
	// sent + lease_ttl - lease_safety_margin. Default 500ms; must be less
	// than the cluster's lease_ttl (checked at registration).
	LeaseSafetyMargin time.Duration `yaml:"lease_safety_margin"`
	// TLS, when set, makes the agent's gRPC connections to the coordinators
	// use mutual TLS (the local HTTP endpoint stays plain HTTP), and its
	// gossip encrypted with the gossip.key beside ca_file unless
	// gossip.encryption_key_file names another.
	TLS TLS `yaml:"tls"`
	// Insecure allows plaintext (gossip unencrypted, no certificate) on
	// addresses other than loopback. Default false.
	Insecure bool `yaml:"insecure"`
	// Log configures the process log.
	Log Log `yaml:"log"`

	src *source
}

// WALLocation says where a broker's write-ahead log lives.
type WALLocation struct {
	// VolumeID names the block volume (e.g. an EBS volume id) for attach
	// plugins that need it. Optional.
	VolumeID string `yaml:"volume_id"`
	// Path is the WAL file or device as the broker's host sees it. Required.
	Path string `yaml:"path"`
}

// DefaultLeaseSafetyMargin is the default of lease_safety_margin.
const DefaultLeaseSafetyMargin = 500 * time.Millisecond

// DefaultAgentConfig returns an Agent with every default set and every
// required key empty.
func DefaultAgentConfig() *Agent {
	return &Agent{
		Gossip:            gossip.DefaultConfig(),
		LeaseSafetyMargin: DefaultLeaseSafetyMargin,
		Log:               Log{Level: "info", Format: "json"},
	}
}

// LoadAgent reads the YAML file at path over DefaultAgentConfig() and
// validates it. Every error is an *Error naming the file, the line and the
// key. It reads nothing but path.
func LoadAgent(path string) (*Agent, error) {
	cfg := DefaultAgentConfig()
	src, err := decodeFile(path, cfg)
	return validated(cfg, src, err)
}

// ParseAgent is LoadAgent for YAML already in memory; name is used as the
// file name in errors.
func ParseAgent(name string, data []byte) (*Agent, error) {
	cfg := DefaultAgentConfig()
	src, err := decodeBytes(name, data, cfg)
	return validated(cfg, src, err)
}

// setSource keeps the source the configuration was read from.
func (c *Agent) setSource(src *source) { c.src = src }

// GossipKeyFile is the gossip encryption key file: gossip.encryption_key_file,
// or with tls set, the gossip.key beside tls.ca_file.
func (c *Agent) GossipKeyFile() string {
	if c.Gossip.EncryptionKeyFile != "" {
		return c.Gossip.EncryptionKeyFile
	}
	return c.TLS.GossipKeyFile()
}

// GossipNodeName is the agent's name in the gossip pool: "agent/<broker_id>".
func (c *Agent) GossipNodeName() string { return string(gossip.RoleAgent) + "/" + c.BrokerID }

// Validate checks every key and returns all mistakes found (errors.Join of
// *Error), or nil.
func (c *Agent) Validate() error {
	v := validator{src: c.src}
	v.name("broker_id", c.BrokerID)
	v.name("cluster_name", c.ClusterName)
	v.coordinators(c.Coordinators)

	v.agentListen("listen", c.Listen)
	v.optionalPeerAddr("broker_addr", c.BrokerAddr)
	v.required("wal.path", c.WAL.Path, "the broker's WAL file or device")

	if v.agentGossip(c.Gossip, c.ClusterName, c.BrokerID, "ip:port of the agent's gossip member") &&
		c.Gossip.BindAddr == c.Listen && c.Listen != "" && !strings.HasSuffix(c.Listen, ":0") {
		v.add("gossip.listen", "address %s is already used by listen", c.Listen)
	}

	if c.LeaseSafetyMargin < 0 {
		v.add("lease_safety_margin", "must not be negative, got %s", c.LeaseSafetyMargin)
	}

	v.logSection(c.Log)
	v.tlsSection(c.TLS)
	v.plaintext(c.TLS, c.Insecure, []keyAddr{{"listen", c.Listen}, {"gossip.listen", c.Gossip.BindAddr}})
	return errors.Join(v.errs...)
}

// Source returns the file the configuration was read from ("" when built
// in code).
func (c *Agent) Source() string {
	if c.src == nil {
		return ""
	}
	return c.src.file
}
