package gossip

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"

	"walden/filecheck"
)

// Config configures one Pool. The YAML keys (snake_case tags) are relative to
// the `gossip:` section that embeds it. ClusterName, NodeName, Meta and Logger
// are not read from YAML: the process that owns the pool sets them from its
// own identity (the top-level cluster_name, its role and id).
type Config struct {
	// ClusterName is the cluster this pool belongs to; members whose metadata
	// names another cluster are refused. Required. Key "cluster_name".
	ClusterName string `yaml:"-"`
	// NodeName is this member's unique name in the pool, by convention
	// "<role>/<id>": "coordinator/c1", "agent/b1". Required. Key "node_name".
	NodeName string `yaml:"-"`
	// Meta is the metadata this member advertises. Meta.ClusterName may be
	// left empty: Start fills it with ClusterName. Keys "meta.*".
	Meta Meta `yaml:"-"`
	// Logger receives the pool's structured log and memberlist's own log
	// lines. nil discards them.
	Logger *slog.Logger `yaml:"-"`
	// Faults, when set, injects network faults into what this member sends
	// (tests only; nil in production).
	Faults *Faults `yaml:"-"`
	// Listener, when set, holds the sockets the member uses instead of
	// binding BindAddr, which becomes its address: a test binds port 0
	// (Listen) and hands the sockets over, so that no port is picked free
	// and then taken by someone else. Start takes it over. Its transport
	// reads each packet into one buffer kept for every read and hands
	// memberlist a copy of the packet's own size, where memberlist's own
	// transport allocates 64 KiB per packet: the scale benchmark's load
	// generator, which hosts hundreds of members, binds their sockets so.
	Listener *Listener `yaml:"-"`
	// BindAddr is the "ip:port" memberlist listens on, UDP and TCP on the
	// same port. The host must be an IP literal; port 0 picks a free port.
	// Default "0.0.0.0:7946".
	BindAddr string `yaml:"listen"`
	// AdvertiseAddr is the "ip:port" other members use to reach this one,
	// when it differs from BindAddr (NAT, wildcard bind). Optional.
	AdvertiseAddr string `yaml:"advertise"`
	// Join lists "host:port" addresses of members to join at start and
	// whenever this member finds itself alone. Optional.
	Join []string `yaml:"join"`
	// EncryptionKeyFile names a file holding a base64 (standard encoding)
	// AES key of 16, 24 or 32 bytes; surrounding white space is ignored.
	// Every member of the pool must use the same key. Optional: empty means
	// unencrypted gossip.
	EncryptionKeyFile string `yaml:"encryption_key_file"`

	// ProbeInterval is the interval between probes of a random member.
	// Default 1s.
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// ProbeTimeout is how long a probe waits for an ack before indirect
	// probes start; about the 99th percentile of the RTT. Must be less
	// than ProbeInterval. Default 500ms.
	ProbeTimeout time.Duration `yaml:"probe_timeout"`
	// IndirectChecks is the number of members asked to probe a member that
	// did not answer a direct probe. Default 3.
	IndirectChecks int `yaml:"indirect_checks"`
	// SuspicionMult scales the time a member stays suspect before it is
	// declared dead: SuspicionMult * max(1, log10(N)) * ProbeInterval.
	// Default 4.
	SuspicionMult int `yaml:"suspicion_mult"`
	// SuspicionMaxTimeoutMult bounds the suspicion timeout at this multiple
	// of the minimum when no other member confirms. Default 6.
	SuspicionMaxTimeoutMult int `yaml:"suspicion_max_timeout_mult"`
	// RetransmitMult scales how often a gossiped message is retransmitted:
	// RetransmitMult * log(N+1). Default 4.
	RetransmitMult int `yaml:"retransmit_mult"`
	// AwarenessMaxMultiplier bounds how far a member that sees itself
	// degraded stretches its probe interval and timeout. Default 8.
	AwarenessMaxMultiplier int `yaml:"awareness_max_multiplier"`
	// GossipInterval is the interval between gossip rounds. Default 200ms.
	GossipInterval time.Duration `yaml:"gossip_interval"`
	// GossipNodes is the number of members gossiped to per round. Default 3.
	GossipNodes int `yaml:"gossip_nodes"`
	// GossipToTheDeadTime is how long a dead member is still gossiped to,
	// so that it can refute. Default 30s.
	GossipToTheDeadTime time.Duration `yaml:"gossip_to_the_dead_time"`
	// PushPullInterval is the interval between full state syncs with a
	// random member over TCP (anti-entropy). Default 30s.
	PushPullInterval time.Duration `yaml:"push_pull_interval"`
	// TCPTimeout bounds connecting, reading and writing a stream (push/pull,
	// TCP fallback probe). Default 10s.
	TCPTimeout time.Duration `yaml:"tcp_timeout"`
	// DeadNodeReclaimTime is how long after a member was declared dead its
	// name may be taken by a member at another address. 0 means only after
	// the dead member has been forgotten (GossipToTheDeadTime). Default 0.
	DeadNodeReclaimTime time.Duration `yaml:"dead_node_reclaim_time"`

	// PacketSize is the most bytes memberlist puts in one UDP packet, the
	// budget that a probe, its ack and the gossip piggybacked on them
	// share (memberlist's UDPBufferSize). Messages are packed into
	// compound packets up to it, so in a pool of thousands, whose churn is
	// retransmitted by every member, it sets how many state changes one
	// packet carries. It must fit the path MTU less the IP and UDP
	// headers, or packets are fragmented (and lost whole when a fragment
	// is). Default 1400, below any 1,500-byte MTU; 8,900 suits a network
	// of 9,000-byte jumbo frames end to end.
	PacketSize int `yaml:"packet_size"`
	// HandoffQueueDepth is how many received gossip messages memberlist
	// holds for its handler, joins and refutations in one queue,
	// suspicions and deaths in another (probes and acks are answered at
	// once); beyond it they are dropped and learned again from a
	// retransmission or the next state sync, which memberlist spaces out
	// as the pool grows (every 180 s at 1,000 members, 270 s at 5,000). A
	// held message may keep its whole 64 KiB receive buffer (not on a
	// Listener, whose packets are copies of their own size). Default 1024.
	HandoffQueueDepth int `yaml:"handoff_queue_depth"`
	// Compression LZW-compresses the messages this member sends: a packet
	// when that makes it smaller, a state sync always (about fourfold).
	// Every member reads both forms. It costs a fresh LZW table per
	// message sent, nothing for one member on its host but most of the CPU
	// of a process that hosts hundreds of members (the scale benchmark's
	// load generator turns it off). Default true.
	Compression bool `yaml:"compression"`

	// EventQueueSize is the number of events held for a slow consumer of
	// Pool.Events before the oldest are dropped. Default 1024.
	EventQueueSize int `yaml:"event_queue_size"`
	// RejoinInterval is how often a member that finds itself alone retries
	// the Join addresses. 0 disables retrying. Default 5s.
	RejoinInterval time.Duration `yaml:"rejoin_interval"`
}

// Defaults of the keys that have one: memberlist's DefaultLANConfig, plus the
// pool's own keys.
const (
	DefaultBindAddr       = "0.0.0.0:7946"
	DefaultEventQueueSize = 1024
	DefaultRejoinInterval = 5 * time.Second

	// DefaultPacketSize is memberlist's UDP budget: below any 1,500-byte
	// MTU once the IP and UDP headers are added.
	DefaultPacketSize = 1400
	// DefaultHandoffQueueDepth is memberlist's.
	DefaultHandoffQueueDepth = 1024
	// MinPacketSize and MaxPacketSize bound packet_size: below 576 bytes
	// (the least datagram every IPv4 host must accept) a state change with
	// its metadata may not fit; above 65,507 it is no UDP datagram.
	MinPacketSize = 576
	MaxPacketSize = 65507
)

// DefaultConfig returns a Config with memberlist's LAN defaults and every
// required key (ClusterName, NodeName, Meta.Role, Meta.ID) empty.
func DefaultConfig() Config {
	return Config{
		BindAddr:                DefaultBindAddr,
		ProbeInterval:           1 * time.Second,
		ProbeTimeout:            500 * time.Millisecond,
		IndirectChecks:          3,
		SuspicionMult:           4,
		SuspicionMaxTimeoutMult: 6,
		RetransmitMult:          4,
		AwarenessMaxMultiplier:  8,
		GossipInterval:          200 * time.Millisecond,
		GossipNodes:             3,
		GossipToTheDeadTime:     30 * time.Second,
		PushPullInterval:        30 * time.Second,
		TCPTimeout:              10 * time.Second,
		DeadNodeReclaimTime:     0,
		PacketSize:              DefaultPacketSize,
		HandoffQueueDepth:       DefaultHandoffQueueDepth,
		Compression:             true,
		EventQueueSize:          DefaultEventQueueSize,
		RejoinInterval:          DefaultRejoinInterval,
	}
}

// ConfigError is one invalid key. Its text is "gossip: KEY: reason"; Key is
// relative to the gossip section ("probe_timeout", "join[1]", "meta.role").
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string { return "gossip: " + e.Key + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

func invalid(key, format string, args ...any) error {
	return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks every key and returns a *ConfigError naming the first
// invalid one. It does not read the encryption key file (Start does).
func (c *Config) Validate() error {
	if err := validName("cluster_name", c.ClusterName, maxClusterNameLen); err != nil {
		return err
	}
	if err := validName("node_name", c.NodeName, maxNodeNameLen); err != nil {
		return err
	}
	if c.Meta.ClusterName != "" && c.Meta.ClusterName != c.ClusterName {
		return invalid("meta.cluster_name", "%q differs from cluster_name %q", c.Meta.ClusterName, c.ClusterName)
	}
	m := c.Meta
	m.ClusterName = c.ClusterName
	if err := m.validate(); err != nil {
		return err
	}
	if _, err := parseIPPort("listen", c.BindAddr, true); err != nil {
		return err
	}
	if c.AdvertiseAddr != "" {
		if _, err := parseIPPort("advertise", c.AdvertiseAddr, false); err != nil {
			return err
		}
	}
	for i, a := range c.Join {
		if err := validHostPort(fmt.Sprintf("join[%d]", i), a); err != nil {
			return err
		}
	}
	if c.EncryptionKeyFile != "" && strings.TrimSpace(c.EncryptionKeyFile) != c.EncryptionKeyFile {
		return invalid("encryption_key_file", "%q has leading or trailing white space", c.EncryptionKeyFile)
	}

	positive := []struct {
		key string
		d   time.Duration
	}{
		{"probe_interval", c.ProbeInterval},
		{"probe_timeout", c.ProbeTimeout},
		{"gossip_interval", c.GossipInterval},
		{"gossip_to_the_dead_time", c.GossipToTheDeadTime},
		{"push_pull_interval", c.PushPullInterval},
		{"tcp_timeout", c.TCPTimeout},
	}
	for _, p := range positive {
		if p.d <= 0 {
			return invalid(p.key, "must be positive, got %v", p.d)
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		return invalid("probe_timeout", "must be less than probe_interval (%v >= %v)", c.ProbeTimeout, c.ProbeInterval)
	}
	if c.DeadNodeReclaimTime < 0 {
		return invalid("dead_node_reclaim_time", "must not be negative, got %v", c.DeadNodeReclaimTime)
	}
	if c.RejoinInterval < 0 {
		return invalid("rejoin_interval", "must not be negative (0 disables), got %v", c.RejoinInterval)
	}
	atLeastOne := []struct {
		key string
		n   int
	}{
		{"indirect_checks", c.IndirectChecks},
		{"suspicion_mult", c.SuspicionMult},
		{"suspicion_max_timeout_mult", c.SuspicionMaxTimeoutMult},
		{"retransmit_mult", c.RetransmitMult},
		{"awareness_max_multiplier", c.AwarenessMaxMultiplier},
		{"gossip_nodes", c.GossipNodes},
		{"handoff_queue_depth", c.HandoffQueueDepth},
		{"event_queue_size", c.EventQueueSize},
	}
	for _, p := range atLeastOne {
		if p.n < 1 {
			return invalid(p.key, "must be at least 1, got %d", p.n)
		}
	}
	if c.PacketSize < MinPacketSize || c.PacketSize > MaxPacketSize {
		return invalid("packet_size", "must be from %d to %d bytes (a UDP datagram that fits the network's MTU), got %d", MinPacketSize, MaxPacketSize, c.PacketSize)
	}
	return nil
}

const (
	maxClusterNameLen = 64
	maxNodeNameLen    = 128
)

// validName accepts a non-empty printable name without white space.
func validName(key, s string, max int) error {
	if s == "" {
		return invalid(key, "required")
	}
	if len(s) > max {
		return invalid(key, "longer than %d bytes", max)
	}
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return invalid(key, "%q holds white space or a control character", s)
		}
	}
	return nil
}

// parseIPPort parses "ip:port" with an IP literal host.
func parseIPPort(key, s string, portZeroOK bool) (netip.AddrPort, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, invalid(key, "%q is not ip:port: %v", s, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, invalid(key, "host %q is not an IP address", host)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return netip.AddrPort{}, invalid(key, "port %q is not a number from 0 to 65535", portStr)
	}
	if port == 0 && !portZeroOK {
		return netip.AddrPort{}, invalid(key, "port must not be 0")
	}
	return netip.AddrPortFrom(ip, uint16(port)), nil
}

// validHostPort accepts "host:port" where host is an IP or a DNS name.
func validHostPort(key, s string) error {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return invalid(key, "%q is not host:port: %v", s, err)
	}
	if host == "" {
		return invalid(key, "%q has no host", s)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return invalid(key, "port %q is not a number from 1 to 65535", portStr)
	}
	return nil
}

// LoadEncryptionKey reads a gossip encryption key file: the base64 (standard
// encoding, padded) text of a 16, 24 or 32-byte AES key, optionally
// surrounded by white space such as a trailing newline. Every error matches
// ErrEncryptionKey and names the file.
func LoadEncryptionKey(path string) ([]byte, error) {
	raw, err := filecheck.ReadRegular(path, "the file", 4096)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrEncryptionKey, path, err)
	}
	text := strings.TrimSpace(string(raw))
	if text == "" {
		return nil, fmt.Errorf("%w %s: the file is empty", ErrEncryptionKey, path)
	}
	key, err := base64.StdEncoding.DecodeString(text)
	if err != nil {
		return nil, fmt.Errorf("%w %s: not base64 (standard encoding): %w", ErrEncryptionKey, path, err)
	}
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("%w %s: key is %d bytes, want 16, 24 or 32 (AES-128, -192, -256)", ErrEncryptionKey, path, len(key))
}
