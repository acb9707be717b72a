package config

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"walden/gossip"
	"walden/objstore"
)

// Broker is the configuration of one `walden broker`, the reference broker:
// its data API, its WAL, its S3 bucket, the streams it opens, and the agent
// it embeds (the agent_* and lease keys).
type Broker struct {
	// BrokerID names the broker in the cluster. Required.
	BrokerID string `yaml:"broker_id"`
	// ClusterName is the coordinators' cluster_name. Required.
	ClusterName string `yaml:"cluster_name"`
	// Listen is the broker's gRPC data API (walden.v1.BrokerAPI); port 0
	// picks a free port. Required.
	Listen string `yaml:"listen"`
	// BrokerAddr is the address producers dial, reported to the cluster
	// (NOT_OWNER hints name it). Default: the bound listen address.
	BrokerAddr string `yaml:"broker_addr"`
	// Coordinators lists the coordinators' admin gRPC addresses. Required.
	Coordinators []string `yaml:"coordinators"`
	// Gossip is the embedded agent's membership in the gossip pool; its
	// listen key is required.
	Gossip gossip.Config `yaml:"gossip"`
	// AgentListen is the embedded agent's HTTP endpoint (GET /v1/lease,
	// probed by the coordinators). Its host must be dialable. Required.
	AgentListen string `yaml:"agent_listen"`
	// WAL is the broker's write-ahead log.
	WAL BrokerWAL `yaml:"wal"`
	// S3 is the bucket the broker uploads its WAL to.
	S3 objstore.Config `yaml:"s3"`
	// Streams are the stream ids the broker opens at start.
	Streams []uint64 `yaml:"streams"`
	// Takeover makes the broker also open CLOSED streams whose owner was
	// failed over. Default false.
	Takeover bool `yaml:"takeover"`
	// TakeoverInterval is how often the broker retries configured streams
	// another broker holds and, when its watch of the coordinators' state
	// is down, looks for CLOSED streams (takeover; while the watch answers
	// it learns of them at once). Default 500ms.
	TakeoverInterval time.Duration `yaml:"takeover_interval"`
	// UploadInterval is the longest time between two uploads of the WAL to
	// S3. Default 1s.
	UploadInterval time.Duration `yaml:"upload_interval"`
	// UploadBytes starts an upload as soon as this much WAL data waits.
	// Default 8 MiB (a quarter of wal.capacity when that is less); at
	// most half of wal.capacity.
	UploadBytes int64 `yaml:"upload_bytes"`
	// LeaseSafetyMargin is the embedded agent's lease_safety_margin.
	// Default 500ms.
	LeaseSafetyMargin time.Duration `yaml:"lease_safety_margin"`
	// TLS makes the connections to the coordinators use mutual TLS, the
	// data API serve mutual TLS with the same certificate (a broker role
	// certificate of this broker id, valid for the broker's host), and the
	// embedded agent's gossip encrypted (the gossip.key beside ca_file).
	TLS TLS `yaml:"tls"`
	// Insecure allows plaintext on addresses other than loopback. Default
	// false.
	Insecure bool `yaml:"insecure"`
	// Log configures the process log.
	Log Log `yaml:"log"`

	src *source
}

// BrokerWAL is the broker's `wal` section.
type BrokerWAL struct {
	// Path is the WAL file (created when missing) or block device.
	// Required.
	Path string `yaml:"path"`
	// Capacity is the size of a new WAL file in bytes, a multiple of 4096.
	// Default 64 MiB.
	Capacity int64 `yaml:"capacity"`
	// VolumeID names the block volume for the coordinators' attach plugin.
	// Optional.
	VolumeID string `yaml:"volume_id"`
}

// Defaults of the broker configuration.
const (
	DefaultBrokerWALCapacity      = 64 << 20
	DefaultBrokerUploadInterval   = time.Second
	DefaultBrokerUploadBytes      = 8 << 20
	DefaultBrokerTakeoverInterval = 500 * time.Millisecond
)

// DefaultBrokerConfig returns a Broker with every default set and every
// required key empty.
func DefaultBrokerConfig() *Broker {
	return &Broker{
		Gossip:            gossip.DefaultConfig(),
		WAL:               BrokerWAL{Capacity: DefaultBrokerWALCapacity},
		S3:                objstore.DefaultConfig(),
		TakeoverInterval:  DefaultBrokerTakeoverInterval,
		UploadInterval:    DefaultBrokerUploadInterval,
		UploadBytes:       DefaultBrokerUploadBytes,
		LeaseSafetyMargin: DefaultLeaseSafetyMargin,
		Log:               Log{Level: "info", Format: "json"},
	}
}

// LoadBroker reads the YAML file at path over DefaultBrokerConfig() and
// validates it. Every error is an *Error naming the file, the line and the
// key.
func LoadBroker(path string) (*Broker, error) {
	cfg := DefaultBrokerConfig()
	src, err := decodeFile(path, cfg)
	return validated(cfg, src, err)
}

// ParseBroker is LoadBroker for YAML already in memory; name is used as the
// file name in errors.
func ParseBroker(name string, data []byte) (*Broker, error) {
	cfg := DefaultBrokerConfig()
	src, err := decodeBytes(name, data, cfg)
	return validated(cfg, src, err)
}

// setSource keeps src and fills the defaults that depend on what it set.
func (c *Broker) setSource(src *source) {
	c.src = src
	c.defaultUploadBytes()
}

// defaultUploadBytes lowers the default upload_bytes to a quarter of a small
// wal.capacity when the file does not set it.
func (c *Broker) defaultUploadBytes() {
	if !c.src.has("upload_bytes") && c.WAL.Capacity > 0 && c.UploadBytes > c.WAL.Capacity/4 {
		c.UploadBytes = max(c.WAL.Capacity/4, 1)
	}
}

// AgentConfig returns the configuration of the agent the broker embeds;
// brokerAddr is the address reported to the cluster.
func (c *Broker) AgentConfig(brokerAddr string) *Agent {
	return &Agent{
		BrokerID:          c.BrokerID,
		ClusterName:       c.ClusterName,
		Coordinators:      append([]string(nil), c.Coordinators...),
		Gossip:            c.Gossip,
		Listen:            c.AgentListen,
		BrokerAddr:        brokerAddr,
		WAL:               WALLocation{VolumeID: c.WAL.VolumeID, Path: c.WAL.Path},
		LeaseSafetyMargin: c.LeaseSafetyMargin,
		TLS:               c.TLS,
		Insecure:          c.Insecure,
		Log:               c.Log,
	}
}

// Validate checks every key and returns all mistakes found (errors.Join of
// *Error), or nil.
func (c *Broker) Validate() error {
	v := validator{src: c.src}
	v.name("broker_id", c.BrokerID)
	v.name("cluster_name", c.ClusterName)
	v.listenAddr("listen", c.Listen, true)
	v.optionalPeerAddr("broker_addr", c.BrokerAddr)
	v.coordinators(c.Coordinators)
	if v.agentListen("agent_listen", c.AgentListen) && c.AgentListen == c.Listen && !strings.HasSuffix(c.Listen, ":0") {
		v.add("agent_listen", "address %s is already used by listen", c.AgentListen)
	}
	v.agentGossip(c.Gossip, c.ClusterName, c.BrokerID, "ip:port of the broker's gossip member")
	v.required("wal.path", c.WAL.Path, "the broker's WAL file or device")
	if c.WAL.Capacity < 16<<10 || c.WAL.Capacity%4096 != 0 {
		v.add("wal.capacity", "must be a multiple of 4096 and at least 16384, got %d", c.WAL.Capacity)
	}
	if err := c.S3.Validate(); err != nil {
		key := "s3"
		for _, k := range []string{"bucket", "region", "endpoint", "access_key_id", "prefix"} {
			if strings.Contains(err.Error(), "s3."+k) {
				key = "s3." + k
				break
			}
		}
		v.add(key, "%s", strings.TrimPrefix(err.Error(), "objstore: "))
	}
	streams := map[uint64]int{}
	for i, id := range c.Streams {
		if id == 0 || id == math.MaxUint64 {
			v.add(fmt.Sprintf("streams[%d]", i), "stream id %d is not allowed (ids are from 1 to 2^64-2)", id)
			continue
		}
		if j, dup := streams[id]; dup {
			v.add(fmt.Sprintf("streams[%d]", i), "duplicate stream %d (also streams[%d])", id, j)
		}
		streams[id] = i
	}
	if c.TakeoverInterval <= 0 {
		v.add("takeover_interval", "must be positive, got %s", c.TakeoverInterval)
	}
	if c.UploadInterval <= 0 {
		v.add("upload_interval", "must be positive, got %s", c.UploadInterval)
	}
	if c.UploadBytes <= 0 {
		v.add("upload_bytes", "must be positive, got %d", c.UploadBytes)
	} else if c.WAL.Capacity > 0 && c.UploadBytes > c.WAL.Capacity/2 {
		v.add("upload_bytes", "must be at most half of wal.capacity (%d), got %d", c.WAL.Capacity/2, c.UploadBytes)
	}
	if c.LeaseSafetyMargin < 0 {
		v.add("lease_safety_margin", "must not be negative, got %s", c.LeaseSafetyMargin)
	}
	v.logSection(c.Log)
	v.tlsSection(c.TLS)
	v.plaintext(c.TLS, c.Insecure, []keyAddr{{"listen", c.Listen}, {"agent_listen", c.AgentListen}, {"gossip.listen", c.Gossip.BindAddr}})
	return errors.Join(v.errs...)
}

// Source returns the file the configuration was read from ("" when built
// in code).
func (c *Broker) Source() string {
	if c.src == nil {
		return ""
	}
	return c.src.file
}
