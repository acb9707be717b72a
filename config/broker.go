package config

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"walden/automq/failover"
	"walden/gossip"
	"walden/objstore"
)

// Broker is the configuration of one `walden broker`, the reference broker:
// its data API, its WAL, its S3 bucket, the streams it opens, and the agent
// it embeds (the agent_* and lease keys). With mode automq it is an AutoMQ
// 1.x broker instead: no agent, no coordinators, AutoMQ's controller and
// objects (the automq section).
type Broker struct {
	// BrokerID names the broker in the cluster. Required.
	BrokerID string `yaml:"broker_id"`
	// Mode is "walden" (the default: walden's catalog, objects and lease)
	// or "automq" (AutoMQ 1.x's controller protocol and S3 objects, no
	// lease: the automq section).
	Mode string `yaml:"mode"`
	// Automq configures mode automq.
	Automq BrokerAutomq `yaml:"automq"`
	// ClusterName is the coordinators' cluster_name. Required in mode
	// walden.
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
	// Limits bound the data API and the embedded agent's endpoint:
	// connections (in all and per source address), handshake time, calls
	// per connection, keepalive pings (docs/security.md).
	Limits BrokerLimits `yaml:"limits"`

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

// Values of Broker.Mode.
const (
	BrokerModeWalden = "walden"
	BrokerModeAutomq = "automq"
)

// BrokerAutomq is the `automq` section of a broker in mode automq: it
// behaves as an AutoMQ 1.x broker (node id and node epoch in its WAL,
// AutoMQ's controller extension protocol, AutoMQ's S3 objects and keys) and
// never asks for a lease; the agent beside it, in watchdog mode, is what
// protects its WAL (docs/broker.md).
type BrokerAutomq struct {
	// NodeID is the broker's AutoMQ (KRaft) node id, written in its WAL
	// header. Required, 0 or more.
	NodeID int32 `yaml:"node_id"`
	// ClusterID is the AutoMQ cluster id: it names the object keys'
	// namespace "_kafka_<cluster_id>". Required.
	ClusterID string `yaml:"cluster_id"`
	// Controller is how the broker reaches the active controller (voters,
	// TLS, SASL), with the keys of the coordinators' recovery.automq.
	Controller failover.ControllerConfig `yaml:"controller"`
	// MetadataURL is the base URL of the controller's stream metadata view
	// (the development controller's HTTP endpoint, /v1/streams and
	// /v1/objects): where the broker learns the epoch to open a stream at
	// and the committed objects it reads, as an AutoMQ broker does from
	// the KRaft metadata log. Required.
	MetadataURL string `yaml:"metadata_url"`
	// Takeover lists the streams this broker leads when another node dies,
	// as the KRaft controller moves partition leadership to it: once that
	// node's data API has not accepted a connection for takeover_after,
	// the broker opens its streams, retrying STREAM_NOT_CLOSED with
	// backoff until the node's failover closes them.
	Takeover []BrokerAutomqTakeover `yaml:"takeover"`
	// TakeoverAfter is how long a node must be unreachable before this
	// broker leads its takeover streams (AutoMQ: the controller's broker
	// session timeout). Default 1s.
	TakeoverAfter time.Duration `yaml:"takeover_after"`
	// OpenBackoff and OpenMaxBackoff space the OpenStreams retries of a
	// stream another node still holds (STREAM_NOT_CLOSED), doubling from
	// the first to the second. Defaults 100ms and 500ms.
	OpenBackoff    time.Duration `yaml:"open_backoff"`
	OpenMaxBackoff time.Duration `yaml:"open_max_backoff"`
	// BlockSize is AutoMQ's s3.object.block.size. Default 524288.
	BlockSize int `yaml:"block_size"`
	// StreamSplitSize is AutoMQ's s3.stream.object.split.size: a stream
	// with this many payload bytes in one upload gets a stream object of
	// its own. Default 8 MiB.
	StreamSplitSize int64 `yaml:"stream_split_size"`
	// BucketIndex is the data bucket's index, recorded in the objects'
	// attributes. Default 0.
	BucketIndex int `yaml:"bucket_index"`
	// ProducerScanBytes bounds how much of a stream's newest committed
	// records the broker reads when it opens the stream, to learn each
	// idempotent producer's last batch (as Kafka rebuilds its producer
	// state from the log). Default 64 MiB.
	ProducerScanBytes int64 `yaml:"producer_scan_bytes"`
}

// BrokerAutomqTakeover is one node whose streams a broker leads once the
// node is unreachable.
type BrokerAutomqTakeover struct {
	// NodeID is the node that leads the streams now.
	NodeID int32 `yaml:"node_id"`
	// Addr is that node's data API address, probed with TCP connects (its
	// "heartbeat").
	Addr string `yaml:"addr"`
	// Streams are the streams this broker takes over.
	Streams []uint64 `yaml:"streams"`
}

// Defaults of the broker configuration.
const (
	DefaultBrokerWALCapacity      = 64 << 20
	DefaultBrokerUploadInterval   = time.Second
	DefaultBrokerUploadBytes      = 8 << 20
	DefaultBrokerTakeoverInterval = 500 * time.Millisecond
	DefaultAutomqTakeoverAfter    = time.Second
	DefaultAutomqOpenBackoff      = 100 * time.Millisecond
	DefaultAutomqOpenMaxBackoff   = 500 * time.Millisecond
	DefaultAutomqProducerScan     = 64 << 20
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
		Limits:            DefaultBrokerLimits(),
		Mode:              BrokerModeWalden,
		Automq: BrokerAutomq{
			Controller:        failover.DefaultConfig().Controller,
			TakeoverAfter:     DefaultAutomqTakeoverAfter,
			OpenBackoff:       DefaultAutomqOpenBackoff,
			OpenMaxBackoff:    DefaultAutomqOpenMaxBackoff,
			BlockSize:         failover.DefaultBlockSize,
			StreamSplitSize:   failover.DefaultStreamSplitSize,
			ProducerScanBytes: DefaultAutomqProducerScan,
		},
	}
}

// IsAutomq reports whether the broker runs in mode automq.
func (c *Broker) IsAutomq() bool { return c.Mode == BrokerModeAutomq }

// FailoverConfig returns the automq section in the terms of the
// coordinators' recovery.automq (cluster id, controller, object settings),
// with the broker's s3 section as the data bucket.
func (c *Broker) FailoverConfig() failover.Config {
	f := failover.DefaultConfig()
	f.ClusterID = c.Automq.ClusterID
	f.Controller = c.Automq.Controller
	f.S3 = c.S3
	f.BucketIndex = c.Automq.BucketIndex
	f.BlockSize = c.Automq.BlockSize
	f.StreamSplitSize = c.Automq.StreamSplitSize
	return f
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
		Limits:            AgentLimits{HTTP: c.Limits.AgentHTTP},
	}
}

// Validate checks every key and returns all mistakes found (errors.Join of
// *Error), or nil.
func (c *Broker) Validate() error {
	switch c.Mode {
	case BrokerModeWalden:
	case BrokerModeAutomq:
		return c.validateAutomq()
	default:
		v := validator{src: c.src}
		v.add("mode", "must be walden or automq, got %q", c.Mode)
		return errors.Join(v.errs...)
	}
	v := validator{src: c.src}
	if c.src.has("automq") {
		v.add("automq", "is the section of mode automq; set mode: automq, or remove it")
	}
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
	v.brokerS3(c.S3)
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
	v.uploads(c)
	if c.LeaseSafetyMargin < 0 {
		v.add("lease_safety_margin", "must not be negative, got %s", c.LeaseSafetyMargin)
	}
	v.logSection(c.Log)
	v.limit("limits.api", c.Limits.API)
	v.limit("limits.agent_http", c.Limits.AgentHTTP)
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

// brokerS3 checks the s3 section, naming the key the error is about.
func (v *validator) brokerS3(s objstore.Config) {
	if err := s.Validate(); err != nil {
		key := "s3"
		for _, k := range []string{"bucket", "region", "endpoint", "access_key_id", "prefix"} {
			if strings.Contains(err.Error(), "s3."+k) {
				key = "s3." + k
				break
			}
		}
		v.add(key, "%s", strings.TrimPrefix(err.Error(), "objstore: "))
	}
}

// uploads checks upload_interval and upload_bytes.
func (v *validator) uploads(c *Broker) {
	if c.UploadInterval <= 0 {
		v.add("upload_interval", "must be positive, got %s", c.UploadInterval)
	}
	if c.UploadBytes <= 0 {
		v.add("upload_bytes", "must be positive, got %d", c.UploadBytes)
	} else if c.WAL.Capacity > 0 && c.UploadBytes > c.WAL.Capacity/2 {
		v.add("upload_bytes", "must be at most half of wal.capacity (%d), got %d", c.WAL.Capacity/2, c.UploadBytes)
	}
}

// validateAutomq checks a broker in mode automq: the keys it shares with
// mode walden, the automq section, and no key of the walden protocol (an
// AutoMQ broker never talks to the coordinators: the agent beside it does).
func (c *Broker) validateAutomq() error {
	v := validator{src: c.src}
	for _, key := range []string{"cluster_name", "coordinators", "gossip", "agent_listen", "broker_addr", "takeover",
		"takeover_interval", "lease_safety_margin"} {
		if c.src.has(key) {
			v.add(key, "is not used in mode automq: an AutoMQ broker does not talk to walden's coordinators "+
				"(the agent beside it, in watchdog mode, does; docs/broker.md)")
		}
	}
	v.name("broker_id", c.BrokerID)
	v.listenAddr("listen", c.Listen, true)
	v.required("wal.path", c.WAL.Path, "the broker's WAL file or device")
	if c.WAL.Capacity < 16<<10 || c.WAL.Capacity%4096 != 0 {
		v.add("wal.capacity", "must be a multiple of 4096 and at least 16384, got %d", c.WAL.Capacity)
	}
	v.brokerS3(c.S3)
	if c.S3.Prefix != "" {
		v.add("s3.prefix", "must be empty in mode automq: AutoMQ's object keys start at the bucket's root")
	}
	a := c.Automq
	if c.src != nil && !c.src.has("automq.node_id") {
		// 0 is a node id: the file must say it.
		v.missing("automq.node_id", "the broker's AutoMQ node id")
	} else if a.NodeID < 0 {
		v.add("automq.node_id", "must be 0 or more, got %d", a.NodeID)
	}
	f := c.FailoverConfig()
	f.S3 = objstore.Config{} // checked above, under its own keys
	if err := f.Validate(); err != nil {
		var fe *failover.ConfigError
		if errors.As(err, &fe) {
			v.add("automq."+fe.Key, "%s", fe.Reason)
		} else {
			v.add("automq", "%v", err)
		}
	}
	v.metadataURL("automq.metadata_url", a.MetadataURL)
	streams := map[uint64]string{}
	streamID := func(key string, id uint64) {
		if id > math.MaxInt64 {
			v.add(key, "stream id %d is not an AutoMQ stream id (0 to 2^63-1)", id)
			return
		}
		if other, dup := streams[id]; dup {
			v.add(key, "stream %d is also %s", id, other)
		}
		streams[id] = key
	}
	for i, id := range c.Streams {
		streamID(fmt.Sprintf("streams[%d]", i), id)
	}
	nodes := map[int32]int{}
	for i, t := range a.Takeover {
		key := fmt.Sprintf("automq.takeover[%d]", i)
		switch {
		case c.src.has(key) && !c.src.has(key+".node_id"):
			v.missing(key+".node_id", "the node whose streams this broker takes over")
		case t.NodeID < 0:
			v.add(key+".node_id", "must be 0 or more, got %d", t.NodeID)
		case t.NodeID == a.NodeID:
			v.add(key+".node_id", "is this broker's own node id %d", t.NodeID)
		default:
			if j, dup := nodes[t.NodeID]; dup {
				v.add(key+".node_id", "node %d is also automq.takeover[%d]", t.NodeID, j)
			}
			nodes[t.NodeID] = i
		}
		v.peerAddr(key+".addr", t.Addr)
		if len(t.Streams) == 0 {
			v.missing(key+".streams", "the streams this broker leads once that node is unreachable")
		}
		for j, id := range t.Streams {
			streamID(fmt.Sprintf("%s.streams[%d]", key, j), id)
		}
	}
	if a.TakeoverAfter <= 0 {
		v.add("automq.takeover_after", "must be positive, got %s", a.TakeoverAfter)
	}
	if a.OpenBackoff <= 0 {
		v.add("automq.open_backoff", "must be positive, got %s", a.OpenBackoff)
	}
	if a.OpenMaxBackoff < a.OpenBackoff {
		v.add("automq.open_max_backoff", "must be at least automq.open_backoff (%s), got %s", a.OpenBackoff, a.OpenMaxBackoff)
	}
	if a.ProducerScanBytes < 0 {
		v.add("automq.producer_scan_bytes", "must not be negative, got %d", a.ProducerScanBytes)
	}
	v.uploads(c)
	v.logSection(c.Log)
	v.limit("limits.api", c.Limits.API)
	v.tlsSection(c.TLS)
	v.plaintext(c.TLS, c.Insecure, []keyAddr{{"listen", c.Listen}})
	return errors.Join(v.errs...)
}

// metadataURL checks the base URL of a controller's metadata view.
func (v *validator) metadataURL(key, val string) {
	if !v.required(key, val, "the controller's metadata view, e.g. http://127.0.0.1:9099") {
		return
	}
	u, err := url.Parse(val)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.add(key, "want an http:// or https:// URL with a host, got %q", val)
	}
}
