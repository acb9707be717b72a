package gossip

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func validConfig() Config {
	c := DefaultConfig()
	c.ClusterName = "demo"
	c.NodeName = "agent/b1"
	c.Meta = Meta{Role: RoleAgent, ID: "b1", AgentAddr: "127.0.0.1:7501"}
	return c
}

// TestDefaultConfigIsMemberlistLAN pins the defaults to memberlist's
// DefaultLANConfig, so that an upgrade that changes them is noticed.
func TestDefaultConfigIsMemberlistLAN(t *testing.T) {
	c := DefaultConfig()
	lan := memberlist.DefaultLANConfig()
	durations := []struct {
		key       string
		got, want time.Duration
	}{
		{"probe_interval", c.ProbeInterval, lan.ProbeInterval},
		{"probe_timeout", c.ProbeTimeout, lan.ProbeTimeout},
		{"gossip_interval", c.GossipInterval, lan.GossipInterval},
		{"gossip_to_the_dead_time", c.GossipToTheDeadTime, lan.GossipToTheDeadTime},
		{"push_pull_interval", c.PushPullInterval, lan.PushPullInterval},
		{"tcp_timeout", c.TCPTimeout, lan.TCPTimeout},
		{"dead_node_reclaim_time", c.DeadNodeReclaimTime, lan.DeadNodeReclaimTime},
	}
	for _, d := range durations {
		if d.got != d.want {
			t.Errorf("%s: default %v, memberlist LAN %v", d.key, d.got, d.want)
		}
	}
	ints := []struct {
		key       string
		got, want int
	}{
		{"indirect_checks", c.IndirectChecks, lan.IndirectChecks},
		{"suspicion_mult", c.SuspicionMult, lan.SuspicionMult},
		{"suspicion_max_timeout_mult", c.SuspicionMaxTimeoutMult, lan.SuspicionMaxTimeoutMult},
		{"retransmit_mult", c.RetransmitMult, lan.RetransmitMult},
		{"awareness_max_multiplier", c.AwarenessMaxMultiplier, lan.AwarenessMaxMultiplier},
		{"gossip_nodes", c.GossipNodes, lan.GossipNodes},
		{"packet_size", c.PacketSize, lan.UDPBufferSize},
		{"handoff_queue_depth", c.HandoffQueueDepth, lan.HandoffQueueDepth},
	}
	for _, d := range ints {
		if d.got != d.want {
			t.Errorf("%s: default %d, memberlist LAN %d", d.key, d.got, d.want)
		}
	}
	if c.Compression != lan.EnableCompression {
		t.Errorf("compression: default %v, memberlist LAN %v", c.Compression, lan.EnableCompression)
	}
	// The values the documentation promises.
	if c.ProbeInterval != time.Second || c.ProbeTimeout != 500*time.Millisecond || c.SuspicionMult != 4 ||
		c.GossipInterval != 200*time.Millisecond || c.GossipNodes != 3 || c.PushPullInterval != 30*time.Second ||
		c.TCPTimeout != 10*time.Second || c.BindAddr != "0.0.0.0:7946" || c.EventQueueSize != 1024 ||
		c.RejoinInterval != 5*time.Second || c.PacketSize != 1400 || c.HandoffQueueDepth != 1024 || !c.Compression {
		t.Errorf("defaults differ from the documented ones: %+v", c)
	}
	// Required keys are empty, so the default alone does not validate.
	var ce *ConfigError
	if err := c.Validate(); !errors.As(err, &ce) || ce.Key != "cluster_name" {
		t.Errorf("DefaultConfig().Validate() = %v, want cluster_name required", err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := func() error { c := validConfig(); return c.Validate() }(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	long := strings.Repeat("x", 300)
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string // "" means valid
		reason string // substring of the reason
	}{
		{"coordinator meta", func(c *Config) {
			c.NodeName = "coordinator/c1"
			c.Meta = Meta{Role: RoleCoordinator, ID: "c1", AdminAddr: "127.0.0.1:7001"}
		}, "", ""},
		{"meta cluster equal", func(c *Config) { c.Meta.ClusterName = "demo" }, "", ""},
		{"port 0", func(c *Config) { c.BindAddr = "127.0.0.1:0" }, "", ""},
		{"ipv6 listen", func(c *Config) { c.BindAddr = "[::1]:7946" }, "", ""},
		{"advertise", func(c *Config) { c.AdvertiseAddr = "10.0.0.1:7946" }, "", ""},
		{"join names", func(c *Config) { c.Join = []string{"127.0.0.1:7201", "c2.example:7201"} }, "", ""},
		{"reclaim and rejoin zero", func(c *Config) { c.DeadNodeReclaimTime, c.RejoinInterval = 0, 0 }, "", ""},

		{"no cluster", func(c *Config) { c.ClusterName = "" }, "cluster_name", "required"},
		{"cluster space", func(c *Config) { c.ClusterName = "a b" }, "cluster_name", "white space"},
		{"cluster long", func(c *Config) { c.ClusterName = long }, "cluster_name", "longer"},
		{"no node", func(c *Config) { c.NodeName = "" }, "node_name", "required"},
		{"node control", func(c *Config) { c.NodeName = "a\x01" }, "node_name", "control"},
		{"meta cluster differs", func(c *Config) { c.Meta.ClusterName = "other" }, "meta.cluster_name", "differs"},
		{"no role", func(c *Config) { c.Meta.Role = "" }, "meta.role", "is not"},
		{"bad role", func(c *Config) { c.Meta.Role = "broker" }, "meta.role", "is not"},
		{"no id", func(c *Config) { c.Meta.ID = "" }, "meta.id", "required"},
		{"bad agent addr", func(c *Config) { c.Meta.AgentAddr = "nohost" }, "meta.agent_addr", "host:port"},
		{"bad admin addr", func(c *Config) { c.Meta.AdminAddr = "h:0" }, "meta.admin_addr", "port"},
		{"meta too large", func(c *Config) {
			c.Meta.AgentAddr = strings.Repeat("a", 250) + ":1"
			c.Meta.AdminAddr = strings.Repeat("b", 250) + ":1"
		}, "meta", "limit of 512"},
		{"listen empty", func(c *Config) { c.BindAddr = "" }, "listen", "ip:port"},
		{"listen hostname", func(c *Config) { c.BindAddr = "localhost:7946" }, "listen", "not an IP"},
		{"listen no port", func(c *Config) { c.BindAddr = "127.0.0.1" }, "listen", "ip:port"},
		{"listen bad port", func(c *Config) { c.BindAddr = "127.0.0.1:70000" }, "listen", "port"},
		{"advertise port 0", func(c *Config) { c.AdvertiseAddr = "10.0.0.1:0" }, "advertise", "port must not be 0"},
		{"advertise hostname", func(c *Config) { c.AdvertiseAddr = "host:1" }, "advertise", "not an IP"},
		{"join no port", func(c *Config) { c.Join = []string{"127.0.0.1:7201", "c2"} }, "join[1]", "host:port"},
		{"join empty host", func(c *Config) { c.Join = []string{":7201"} }, "join[0]", "no host"},
		{"join port 0", func(c *Config) { c.Join = []string{"c1:0"} }, "join[0]", "port"},
		{"key file space", func(c *Config) { c.EncryptionKeyFile = " /k" }, "encryption_key_file", "white space"},
		{"probe interval 0", func(c *Config) { c.ProbeInterval = 0 }, "probe_interval", "positive"},
		{"probe timeout 0", func(c *Config) { c.ProbeTimeout = 0 }, "probe_timeout", "positive"},
		{"probe timeout = interval", func(c *Config) { c.ProbeTimeout = c.ProbeInterval }, "probe_timeout", "less than probe_interval"},
		{"gossip interval 0", func(c *Config) { c.GossipInterval = 0 }, "gossip_interval", "positive"},
		{"to the dead negative", func(c *Config) { c.GossipToTheDeadTime = -time.Second }, "gossip_to_the_dead_time", "positive"},
		{"push pull 0", func(c *Config) { c.PushPullInterval = 0 }, "push_pull_interval", "positive"},
		{"tcp timeout 0", func(c *Config) { c.TCPTimeout = 0 }, "tcp_timeout", "positive"},
		{"reclaim negative", func(c *Config) { c.DeadNodeReclaimTime = -1 }, "dead_node_reclaim_time", "negative"},
		{"rejoin negative", func(c *Config) { c.RejoinInterval = -1 }, "rejoin_interval", "negative"},
		{"indirect 0", func(c *Config) { c.IndirectChecks = 0 }, "indirect_checks", "at least 1"},
		{"suspicion 0", func(c *Config) { c.SuspicionMult = 0 }, "suspicion_mult", "at least 1"},
		{"suspicion max 0", func(c *Config) { c.SuspicionMaxTimeoutMult = 0 }, "suspicion_max_timeout_mult", "at least 1"},
		{"retransmit 0", func(c *Config) { c.RetransmitMult = 0 }, "retransmit_mult", "at least 1"},
		{"awareness 0", func(c *Config) { c.AwarenessMaxMultiplier = 0 }, "awareness_max_multiplier", "at least 1"},
		{"gossip nodes 0", func(c *Config) { c.GossipNodes = 0 }, "gossip_nodes", "at least 1"},
		{"queue 0", func(c *Config) { c.EventQueueSize = 0 }, "event_queue_size", "at least 1"},
		{"handoff 0", func(c *Config) { c.HandoffQueueDepth = 0 }, "handoff_queue_depth", "at least 1"},
		{"packet jumbo", func(c *Config) { c.PacketSize = 8900 }, "", ""},
		{"packet least", func(c *Config) { c.PacketSize = MinPacketSize }, "", ""},
		{"packet small", func(c *Config) { c.PacketSize = 500 }, "packet_size", "from 576 to 65507 bytes"},
		{"packet 0", func(c *Config) { c.PacketSize = 0 }, "packet_size", "got 0"},
		{"packet beyond udp", func(c *Config) { c.PacketSize = 65508 }, "packet_size", "UDP datagram"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate()
			if tt.key == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Validate() = %v, want a *ConfigError for %s", err, tt.key)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("errors.Is(%v, ErrInvalidConfig) = false", err)
			}
			if ce.Key != tt.key || !strings.Contains(ce.Reason, tt.reason) {
				t.Errorf("Validate() = %q (key %q), want key %q with reason containing %q", err, ce.Key, tt.key, tt.reason)
			}
			if !strings.HasPrefix(err.Error(), "gossip: "+tt.key+": ") {
				t.Errorf("error text %q does not start with the key", err)
			}
		})
	}
}

func writeKeyFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadEncryptionKey(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{16, 24, 32} {
		raw := make([]byte, n)
		for i := range raw {
			raw[i] = byte(i + n)
		}
		path := writeKeyFile(t, dir, "ok", "  "+base64.StdEncoding.EncodeToString(raw)+"\n")
		got, err := LoadEncryptionKey(path)
		if err != nil {
			t.Fatalf("%d-byte key: %v", n, err)
		}
		if string(got) != string(raw) {
			t.Fatalf("%d-byte key: got %x, want %x", n, got, raw)
		}
	}

	tests := []struct {
		name, content, reason string
	}{
		{"empty", "", "empty"},
		{"blank", " \n\t\n", "empty"},
		{"not base64", "this is not base64!\n", "not base64"},
		{"url-safe alphabet", "AAAAAAAAAAAAAAAAAAAA-_8=", "not base64"},
		{"20 bytes", base64.StdEncoding.EncodeToString(make([]byte, 20)), "key is 20 bytes, want 16, 24 or 32"},
		{"8 bytes", base64.StdEncoding.EncodeToString(make([]byte, 8)), "key is 8 bytes"},
		{"64 bytes", base64.StdEncoding.EncodeToString(make([]byte, 64)), "key is 64 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeKeyFile(t, dir, strings.ReplaceAll(tt.name, " ", "_")+".key", tt.content)
			_, err := LoadEncryptionKey(path)
			if !errors.Is(err, ErrEncryptionKey) {
				t.Fatalf("LoadEncryptionKey = %v, want ErrEncryptionKey", err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.reason) {
				t.Fatalf("error %q should name %s and say %q", err, path, tt.reason)
			}
		})
	}

	t.Run("missing file", func(t *testing.T) {
		path := filepath.Join(dir, "absent.key")
		_, err := LoadEncryptionKey(path)
		if !errors.Is(err, ErrEncryptionKey) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), path) {
			t.Fatalf("LoadEncryptionKey(missing) = %v, want ErrEncryptionKey and ErrNotExist naming the file", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		_, err := LoadEncryptionKey(dir)
		if !errors.Is(err, ErrEncryptionKey) || !strings.Contains(err.Error(), dir) {
			t.Fatalf("LoadEncryptionKey(dir) = %v, want ErrEncryptionKey naming it", err)
		}
	})
	t.Run("Start refuses a bad key file", func(t *testing.T) {
		c := validConfig()
		c.BindAddr = "127.0.0.1:0"
		c.EncryptionKeyFile = writeKeyFile(t, dir, "short.key", base64.StdEncoding.EncodeToString(make([]byte, 5)))
		p, err := Start(c)
		if err == nil {
			_ = p.Shutdown()
			t.Fatal("Start with a 5-byte key succeeded")
		}
		if !errors.Is(err, ErrEncryptionKey) || !strings.Contains(err.Error(), c.EncryptionKeyFile) {
			t.Fatalf("Start = %v, want ErrEncryptionKey naming %s", err, c.EncryptionKeyFile)
		}
	})
	t.Run("Start refuses an invalid config", func(t *testing.T) {
		c := validConfig()
		c.ProbeTimeout = 2 * c.ProbeInterval
		if _, err := Start(c); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("Start = %v, want ErrInvalidConfig", err)
		}
	})
}
