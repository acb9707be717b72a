package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"walden/gossip"
	"walden/httplimit"
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
	// Limits bound the agent's endpoint: connections (in all and per
	// source address), header time, idle time (docs/security.md).
	Limits AgentLimits `yaml:"limits"`
	// Broker is how the agent watches the broker beside it: its process
	// (started by the agent, or named by a pid file), a TCP connect to its
	// listener, an exec health check. Empty: the agent does not watch it
	// (walden's reference broker and brokers built on package agent).
	Broker AgentBroker `yaml:"broker"`
	// Watchdog makes the lease binding for a broker that does not check it
	// (AutoMQ): the agent kills the broker before its lease runs out.
	Watchdog AgentWatchdog `yaml:"watchdog"`
	// Automq names the broker's AutoMQ node, for a broker that is AutoMQ's.
	Automq AgentAutomq `yaml:"automq"`
	// Renewals is how the agent sends its lease renewals to the
	// coordinators.
	Renewals AgentRenewals `yaml:"renewals"`

	src *source
}

// AgentRenewals is how an agent renews its lease with each coordinator.
type AgentRenewals struct {
	// Transport is what the renewals travel over: auto (over a connection
	// of their own with each coordinator that serves it, else over a gRPC
	// stream, else with one gRPC call each), frames (a connection of their
	// own only), stream (a gRPC stream, else one call each: for a network
	// that breaks the frames' TLS application protocol) or call (one gRPC
	// call each). Default auto (docs/agent.md).
	Transport string `yaml:"transport"`
}

// The values of renewals.transport.
const (
	// RenewalsAuto renews over a connection of their own (frames) with a
	// coordinator that serves it, else over a gRPC stream, else with one
	// gRPC call each: each coordinator as far down as it needs, trying
	// the better transport again every few minutes.
	RenewalsAuto = "auto"
	// RenewalsFrames renews over a connection of their own only: a
	// coordinator that does not serve it fails every renewal.
	RenewalsFrames = "frames"
	// RenewalsStream renews over a gRPC stream (Agent.RenewLeases), with
	// one call each with a coordinator that does not serve it: for a
	// network that breaks the frames' TLS application protocol.
	RenewalsStream = "stream"
	// RenewalsCall renews with one gRPC call (Agent.RenewLease) each.
	RenewalsCall = "call"
)

// RenewalTransports are the values renewals.transport takes, in order.
var RenewalTransports = []string{RenewalsAuto, RenewalsFrames, RenewalsStream, RenewalsCall}

// AgentBroker is how an agent watches its broker. A broker is dead when its
// process is gone, or when its checks failed FailureThreshold times in a
// row; the agent then stops renewing its lease (docs/agent.md).
type AgentBroker struct {
	// Command, when set, is the broker's command line: the agent starts it
	// as its child, in a process group of its own that dies with the agent
	// (the recommended mode with the watchdog). Exclusive with PIDFile.
	Command []string `yaml:"command"`
	// Dir is the working directory of Command; empty: the agent's.
	Dir string `yaml:"dir"`
	// Env adds NAME=VALUE entries to the agent's environment for Command.
	Env []string `yaml:"env"`
	// PIDFile names a file holding the pid of a broker started by someone
	// else (systemd, a script). Exclusive with Command.
	PIDFile string `yaml:"pid_file"`
	// KafkaAddr, when set, is checked with a TCP connect every
	// CheckInterval (the broker's client listener).
	KafkaAddr string `yaml:"kafka_addr"`
	// HealthCommand, when set, runs every CheckInterval; exit status 0
	// means healthy.
	HealthCommand []string `yaml:"health_command"`
	// HealthTimeout bounds one check (a TCP connect or a health command,
	// whose process group is killed at the timeout). Default 1s; at most
	// CheckInterval.
	HealthTimeout time.Duration `yaml:"health_timeout"`
	// CheckInterval is the period of the checks and of the pid file's
	// process check. Default 1s.
	CheckInterval time.Duration `yaml:"check_interval"`
	// FailureThreshold is how many checks in a row must fail before the
	// broker counts as dead. Default 3.
	FailureThreshold int `yaml:"failure_threshold"`
	// StartTimeout is how long a broker may take, once its lease is valid,
	// to start (its process to appear, and its checks to pass once);
	// failing checks do not count until then. Default 2m.
	StartTimeout time.Duration `yaml:"start_timeout"`
	// Restart makes the agent start Command again after the broker died,
	// once the cluster could fail the dead one over and a new registration
	// is valid. Default true.
	Restart bool `yaml:"restart"`
	// StopTimeout is how long a graceful stop of the agent waits for the
	// broker to exit after SIGTERM (lease still renewed) before it kills
	// the broker's process group. Default 60s.
	StopTimeout time.Duration `yaml:"stop_timeout"`
}

// Watched reports whether the agent watches a broker at all.
func (b AgentBroker) Watched() bool {
	return len(b.Command) > 0 || b.PIDFile != "" || b.KafkaAddr != "" || len(b.HealthCommand) > 0
}

// HasProcess reports whether the agent knows the broker's process (it
// starts it, or reads its pid file).
func (b AgentBroker) HasProcess() bool { return len(b.Command) > 0 || b.PIDFile != "" }

// AgentWatchdog is the agent's watchdog for a broker that does not check
// its lease.
type AgentWatchdog struct {
	// Enabled arms the watchdog: the broker's process group is killed
	// kill_margin before the agent's lease runs out (and at once when the
	// cluster refuses its epoch or the agent holds no lease). Needs
	// broker.command or broker.pid_file. Default false.
	Enabled bool `yaml:"enabled"`
	// KillMargin is how long before the end of the lease's validity the
	// broker is killed; it must cover the kill's own latency. Default
	// 500ms.
	KillMargin time.Duration `yaml:"kill_margin"`
	// KillCommand, when set, kills the broker instead of SIGKILL to its
	// process group (with WALDEN_BROKER_PID and WALDEN_BROKER_PGID in its
	// environment); if it fails or outlasts KillTimeout, SIGKILL follows.
	KillCommand []string `yaml:"kill_command"`
	// KillTimeout bounds the kill command. Default 1s; less than
	// KillMargin's purpose suggests keeping it short.
	KillTimeout time.Duration `yaml:"kill_timeout"`
}

// AgentAutomq names the broker's AutoMQ 1.x node.
type AgentAutomq struct {
	// NodeID is the broker's AutoMQ (KRaft) node id; nil (the default):
	// the broker is not AutoMQ's. The agent reports it at registration
	// with the node epoch in the WAL header (wal.path).
	NodeID *int32 `yaml:"node_id"`
	// ExternalFencing says that the coordinators fence this broker's
	// machine or volume (power or attach plugins) before they read its WAL,
	// so that it may run without the watchdog. Default false: an AutoMQ
	// broker needs watchdog.enabled.
	ExternalFencing bool `yaml:"external_fencing"`
}

// Configured reports whether the broker is an AutoMQ node.
func (a AgentAutomq) Configured() bool { return a.NodeID != nil }

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

// Defaults of the broker and watchdog sections.
const (
	DefaultBrokerCheckInterval    = time.Second
	DefaultBrokerHealthTimeout    = time.Second
	DefaultBrokerFailureThreshold = 3
	DefaultBrokerStartTimeout     = 2 * time.Minute
	DefaultBrokerStopTimeout      = 60 * time.Second
	DefaultWatchdogKillMargin     = 500 * time.Millisecond
	DefaultWatchdogKillTimeout    = time.Second
)

// DefaultAgentConfig returns an Agent with every default set and every
// required key empty.
func DefaultAgentConfig() *Agent {
	return &Agent{
		Gossip:            gossip.DefaultConfig(),
		LeaseSafetyMargin: DefaultLeaseSafetyMargin,
		Log:               Log{Level: "info", Format: "json"},
		Limits:            AgentLimits{HTTP: httplimit.AgentDefaults()},
		Broker: AgentBroker{
			HealthTimeout:    DefaultBrokerHealthTimeout,
			CheckInterval:    DefaultBrokerCheckInterval,
			FailureThreshold: DefaultBrokerFailureThreshold,
			StartTimeout:     DefaultBrokerStartTimeout,
			StopTimeout:      DefaultBrokerStopTimeout,
			Restart:          true,
		},
		Watchdog: AgentWatchdog{KillMargin: DefaultWatchdogKillMargin, KillTimeout: DefaultWatchdogKillTimeout},
		Renewals: AgentRenewals{Transport: RenewalsAuto},
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

	v.agentBroker(c.Broker)
	v.agentWatchdog(c.Watchdog, c.Broker)
	v.agentAutomq(c.Automq, c.Watchdog)
	if t := c.Renewals.Transport; t != "" && !slices.Contains(RenewalTransports, t) {
		v.add("renewals.transport", "must be one of %s, got %q", strings.Join(RenewalTransports, ", "), t)
	}

	v.logSection(c.Log)
	v.limit("limits.http", c.Limits.HTTP)
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

// agentBroker checks the broker section.
func (v *validator) agentBroker(b AgentBroker) {
	if len(b.Command) > 0 && b.PIDFile != "" {
		v.add("broker.pid_file", "the agent either starts the broker (broker.command) or reads its pid file, not both")
	}
	v.commandLine("broker.command", b.Command)
	v.commandLine("broker.health_command", b.HealthCommand)
	for i, e := range b.Env {
		if name, _, ok := strings.Cut(e, "="); !ok || name == "" {
			v.add(fmt.Sprintf("broker.env[%d]", i), "want NAME=VALUE, got %q", e)
		}
	}
	if len(b.Env) > 0 && len(b.Command) == 0 {
		v.add("broker.env", "is the environment of broker.command, which is not set")
	}
	if b.Dir != "" && len(b.Command) == 0 {
		v.add("broker.dir", "is the working directory of broker.command, which is not set")
	}
	if b.PIDFile != "" && !filepath.IsAbs(b.PIDFile) {
		v.add("broker.pid_file", "must be an absolute path, got %q", b.PIDFile)
	}
	v.optionalPeerAddr("broker.kafka_addr", b.KafkaAddr)
	if !b.Watched() {
		return // the timings below are unused
	}
	if b.CheckInterval <= 0 {
		v.add("broker.check_interval", "must be positive, got %s", b.CheckInterval)
	}
	switch {
	case b.HealthTimeout <= 0:
		v.add("broker.health_timeout", "must be positive, got %s", b.HealthTimeout)
	case b.CheckInterval > 0 && b.HealthTimeout > b.CheckInterval:
		v.add("broker.health_timeout", "must be at most broker.check_interval (%s > %s): a check must end before the next starts", b.HealthTimeout, b.CheckInterval)
	}
	if b.FailureThreshold < 1 {
		v.add("broker.failure_threshold", "must be at least 1, got %d", b.FailureThreshold)
	}
	if b.StartTimeout <= 0 {
		v.add("broker.start_timeout", "must be positive, got %s", b.StartTimeout)
	}
	if b.StopTimeout < 0 {
		v.add("broker.stop_timeout", "must not be negative, got %s", b.StopTimeout)
	}
}

// commandLine checks an optional command line: a list whose first element
// names the program.
func (v *validator) commandLine(key string, argv []string) {
	if v.src.has(key) && len(argv) == 0 {
		v.add(key, "must not be empty: a list, the program then its arguments")
		return
	}
	if len(argv) > 0 && strings.TrimSpace(argv[0]) == "" {
		v.add(key+"[0]", "must name the program")
	}
}

// agentWatchdog checks the watchdog section.
func (v *validator) agentWatchdog(w AgentWatchdog, b AgentBroker) {
	if w.Enabled && !b.HasProcess() {
		v.add("watchdog.enabled", "needs the broker's process to kill: set broker.command (recommended) or broker.pid_file")
	}
	if w.KillMargin < 0 {
		v.add("watchdog.kill_margin", "must not be negative, got %s", w.KillMargin)
	}
	if w.Enabled && w.KillTimeout <= 0 {
		v.add("watchdog.kill_timeout", "must be positive, got %s", w.KillTimeout)
	}
	v.commandLine("watchdog.kill_command", w.KillCommand)
}

// agentAutomq checks the automq section. An AutoMQ broker acknowledges
// writes without asking for the lease: without the watchdog only machine or
// volume fencing protects its WAL, which the configuration must say.
func (v *validator) agentAutomq(a AgentAutomq, w AgentWatchdog) {
	if !a.Configured() {
		if a.ExternalFencing {
			v.add("automq.external_fencing", "is about an AutoMQ broker: set automq.node_id too")
		}
		return
	}
	if *a.NodeID < 0 {
		v.add("automq.node_id", "must be a node id (0 or more), got %d", *a.NodeID)
		return
	}
	if !w.Enabled && !a.ExternalFencing {
		v.add("automq.node_id", "an AutoMQ broker acknowledges writes without asking for its lease: set watchdog.enabled: true "+
			"so that the agent kills it before the lease runs out, or automq.external_fencing: true when the coordinators fence "+
			"its machine or volume before they read its WAL (docs/agent.md)")
	}
}
