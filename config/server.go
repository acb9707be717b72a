package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"walden/gossip"
	"walden/lease"
	"walden/objstore"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// Server is the configuration of one `walden server` coordinator member.
type Server struct {
	// ClusterName names the Raft group; a data directory or a peer of
	// another cluster is refused. Required.
	ClusterName string `yaml:"cluster_name"`
	// NodeID is this member's id (e.g. "c1"). Required.
	NodeID string `yaml:"node_id"`
	// DataDir holds the raft log (raftlog/) and the snapshots (raft.db),
	// its owner's only: created 0700, and refused when other users may
	// enter it (chmod 700).
	// Required.
	DataDir string `yaml:"data_dir"`
	// Listen holds the addresses this member listens on.
	Listen Listen `yaml:"listen"`
	// InitialClusterState is "new" when the members of InitialCluster found
	// the cluster together, "existing" when this member joins a running
	// cluster after `waldenctl member add`. Default "new".
	InitialClusterState string `yaml:"initial_cluster_state"`
	// InitialCluster lists the founding members; ignored once DataDir holds
	// state. Required when InitialClusterState is "new".
	InitialCluster []Member `yaml:"initial_cluster"`
	// Log configures the process log.
	Log Log `yaml:"log"`
	// TLS, when set, makes every listener and client use mutual TLS, and
	// every call is authorized from the peer's certificate (docs/security.md).
	TLS TLS `yaml:"tls"`
	// Insecure allows plaintext without authorization on addresses other
	// than loopback. Without tls, a listener on a non-loopback address is
	// refused unless insecure is true. Default false.
	Insecure bool `yaml:"insecure"`
	// Raft tunes the consensus module.
	Raft Raft `yaml:"raft"`
	// Limits bound every listener of the member: connections (in all and
	// per source address), handshake time, calls per connection,
	// keepalive pings (docs/security.md).
	Limits ServerLimits `yaml:"limits"`
	// Gossip is this member's membership in the gossip pool (memberlist),
	// used by failure detection: listen address, join list, encryption key
	// file and the probe timings (memberlist's LAN defaults). Gossip is on
	// when gossip.listen is set.
	Gossip gossip.Config `yaml:"gossip"`
	// Policy holds the bootstrap failover policy; `waldenctl policy set`
	// overrides keys at runtime through raft.
	Policy Policy `yaml:"policy"`
	// Renewals tunes how this member answers lease renewals.
	Renewals Renewals `yaml:"renewals"`
	// Recovery configures how this member executes recovery jobs: the
	// action, the fence and attach plugins, the job lease and the upload
	// (see package recovery and docs/recovery.md).
	Recovery recovery.Config `yaml:"recovery"`
	// S3 is where recovered WAL data is uploaded. Optional: without a
	// bucket the builtin recovery cannot upload (its jobs show the error).
	S3 objstore.Config `yaml:"s3"`

	src *source
}

// Listen holds the listen addresses (host:port) of one member.
type Listen struct {
	// Admin serves gRPC: walden.v1.Cluster, health, reflection. Required.
	Admin string `yaml:"admin"`
	// Raft serves the gRPC raft peer transport. Required.
	Raft string `yaml:"raft"`
	// Gossip is refused: the gossip address is gossip.listen (one key for
	// one address; walden before v0.1.0 accepted both).
	Gossip string `yaml:"gossip"`
	// HTTP serves /metrics, /healthz, /readyz and the web view /ui/, with
	// mutual TLS when tls is set. Optional: empty disables it.
	HTTP string `yaml:"http"`
	// Metrics serves /metrics, /healthz and /readyz in plain HTTP, also when
	// tls is set, so that probes and scrapers need no client certificate.
	// Optional: empty disables it.
	Metrics string `yaml:"metrics"`
}

// Member is one founding member: its id and advertised addresses.
type Member struct {
	// ID is the member's id (its node_id). Required; unique in the list;
	// letters, digits, '.', '_' and '-', at most 63.
	ID string `yaml:"id"`
	// Raft is the raft address other members dial (host:port, a host and a
	// non-zero port). Required; unique.
	Raft string `yaml:"raft"`
	// Admin is the admin API address that other members and waldenctl dial
	// (host:port). Required; unique.
	Admin string `yaml:"admin"`
}

// Log configures the process log.
type Log struct {
	// Level is debug, info, warn or error. Default info. SIGHUP applies a
	// change at once.
	Level string `yaml:"level"`
	// Format is json or text (slog, on stderr). Default json.
	Format string `yaml:"format"`
}

// TLS names the PEM files for mutual TLS. All three are set, or none.
type TLS struct {
	// CertFile is the PEM certificate of this process (walden certs
	// issue), used as server and as client certificate; it must carry this
	// process's identity (a coordinator's node_id, an agent's broker id).
	CertFile string `yaml:"cert_file"`
	// KeyFile is the PEM private key of cert_file, readable by its owner
	// only (or its group too with allow_group_readable_key).
	KeyFile string `yaml:"key_file"`
	// CAFile is the PEM CA that signed every member's, agent's and user's
	// certificate (walden certs init). The three keys are set together or
	// not at all. The gossip key is the gossip.key beside it unless
	// gossip.encryption_key_file names another.
	CAFile string `yaml:"ca_file"`
	// AllowGroupReadableKey lets key_file (and the gossip key) be
	// readable by their group, as a key mounted from a Kubernetes secret
	// with an fsGroup is (0440). Without it a private key that anyone
	// but its owner may read is refused, as ssh refuses one. Others may
	// never read it. Default false.
	AllowGroupReadableKey bool `yaml:"allow_group_readable_key"`
}

// Enabled reports whether TLS is configured.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.CAFile != "" }

// GossipKeyFileName is the name of the gossip encryption key that
// `walden certs init` writes beside the CA certificate.
const GossipKeyFileName = "gossip.key"

// GossipKeyFile is the gossip key beside ca_file ("" with TLS off): gossip
// is encrypted whenever TLS is on.
func (t TLS) GossipKeyFile() string {
	if !t.Enabled() || t.CAFile == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(t.CAFile), GossipKeyFileName)
}

// Upper bounds of the raft keys (etcd bounds its election timeout at 50s).
const (
	MaxRaftTick            = time.Second
	MaxRaftElectionTicks   = 1000
	MaxRaftElectionTimeout = time.Minute
	MaxRaftSnapshotEntries = 100_000_000
)

// Raft tunes the consensus module.
type Raft struct {
	// TickInterval is the length of one raft tick. Default 100ms; from 1ms
	// to 1s.
	TickInterval time.Duration `yaml:"tick_interval"`
	// ElectionTicks is the election timeout in ticks. Default 10; more than
	// heartbeat_ticks, at most 1000, and election_ticks × tick_interval at
	// most 1m.
	ElectionTicks int `yaml:"election_ticks"`
	// HeartbeatTicks is the leader's heartbeat interval in ticks. Default 1;
	// at least 1.
	HeartbeatTicks int `yaml:"heartbeat_ticks"`
	// SnapshotCount is the number of applied entries between snapshots
	// (each followed by log compaction). Default 10000; from 1 to
	// 100,000,000.
	SnapshotCount uint64 `yaml:"snapshot_count"`
	// SnapshotCatchUpEntries is the number of entries kept in the log after
	// a snapshot, so that a slow follower can catch up without one.
	// Default 5000; at most 100,000,000.
	SnapshotCatchUpEntries uint64 `yaml:"snapshot_catchup_entries"`
}

// Renewals is the `renewals:` section.
type Renewals struct {
	// Slot is the length of this member's renewal slots: every grant asks
	// the agent to renew at the last slot boundary before a third of the
	// lease has passed, so that renewals arrive together and one wake-up
	// of the member answers many of them (docs/scale.md, "Renewal
	// slots"). Agents renew no later for it, and no grant lasts longer or
	// shorter. 0 turns the slots off: agents renew a third of the lease
	// after each renewal they sent. A slot longer than a sixth of the
	// lease is off too. Default 100ms; 0 or from 1ms to 1s.
	Slot time.Duration `yaml:"slot"`
	// Frames lets agents renew over their own connection on the admin
	// port: the renewals and answers of the RenewLeases stream, each in a
	// frame of its own (package renewframe; under TLS the handshake offers
	// the protocol walden-renewals/1, without TLS the connection opens
	// with a preface): one goroutine a connection on this member and no
	// HTTP/2 buffers, instead of a gRPC stream's. The grants are the same.
	// With false this member offers no such protocol and agents renew
	// over gRPC streams. Default true.
	Frames bool `yaml:"frames"`
}

// Policy is the `policy:` section: the failover policy's bootstrap values.
// Every key defaults to policy.Defaults(); see package policy for what each
// guards against.
type Policy struct {
	// FailureTimeout is how long a quorum of coordinators must observe a
	// broker suspect or dead before it may be declared failed. Default 5s.
	FailureTimeout time.Duration `yaml:"failure_timeout"`
	// SuspicionQuorum is the number of coordinators that must agree; 0
	// means a majority of the voters. Default 0.
	SuspicionQuorum uint32 `yaml:"suspicion_quorum"`
	// LeaseTTL is the broker lease; the agent renews every third of it.
	// Default 3s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// RestartGrace extends FailureTimeout for a broker that left
	// gracefully. Default 0s.
	RestartGrace time.Duration `yaml:"restart_grace"`
	// MaxConcurrentRecoveries bounds the running recoveries. Default 4.
	MaxConcurrentRecoveries uint32 `yaml:"max_concurrent_recoveries"`
	// MaxFailedFraction freezes automatic failover when more than this
	// fraction of brokers look failed at once. Default 0.5.
	MaxFailedFraction float64 `yaml:"max_failed_fraction"`
	// Cooldown blocks a second automatic failover of a recovered broker
	// until an operator acks it. Default 10m.
	Cooldown time.Duration `yaml:"cooldown"`
	// DryRun records decisions without fencing. Default false.
	DryRun bool `yaml:"dry_run"`
	// DriftMargin is added to lease expiry before a decision. Default
	// 500ms.
	DriftMargin time.Duration `yaml:"drift_margin"`
}

// DefaultPolicy returns policy.Defaults() as a config section.
func DefaultPolicy() Policy {
	d := policy.Defaults()
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	return Policy{
		FailureTimeout:          ms(d.GetFailureTimeoutMs()),
		SuspicionQuorum:         d.GetSuspicionQuorum(),
		LeaseTTL:                ms(d.GetLeaseTtlMs()),
		RestartGrace:            ms(d.GetRestartGraceMs()),
		MaxConcurrentRecoveries: d.GetMaxConcurrentRecoveries(),
		MaxFailedFraction:       d.GetMaxFailedFraction(),
		Cooldown:                ms(d.GetCooldownMs()),
		DryRun:                  d.GetDryRun(),
		DriftMargin:             ms(d.GetDriftMarginMs()),
	}
}

// Proto returns the section as the replicated policy message.
func (p Policy) Proto() *waldenv1.Policy {
	return &waldenv1.Policy{
		FailureTimeoutMs:        p.FailureTimeout.Milliseconds(),
		SuspicionQuorum:         p.SuspicionQuorum,
		LeaseTtlMs:              p.LeaseTTL.Milliseconds(),
		RestartGraceMs:          p.RestartGrace.Milliseconds(),
		MaxConcurrentRecoveries: p.MaxConcurrentRecoveries,
		MaxFailedFraction:       p.MaxFailedFraction,
		CooldownMs:              p.Cooldown.Milliseconds(),
		DryRun:                  p.DryRun,
		DriftMarginMs:           p.DriftMargin.Milliseconds(),
	}
}

// GossipConfig returns the gossip pool configuration of this member, and
// whether gossip is on: gossip.listen is the bind address; the node name is "coordinator/<node_id>". With tls set and no
// gossip.encryption_key_file, the key is the gossip.key beside tls.ca_file.
func (c *Server) GossipConfig() (gossip.Config, bool) {
	g := c.Gossip
	g.ClusterName = c.ClusterName
	g.NodeName = string(gossip.RoleCoordinator) + "/" + c.NodeID
	g.Meta = gossip.Meta{Role: gossip.RoleCoordinator, ID: c.NodeID}
	if g.EncryptionKeyFile == "" {
		g.EncryptionKeyFile = c.TLS.GossipKeyFile()
	}
	if !strings.HasSuffix(c.Listen.Admin, ":0") {
		g.Meta.AdminAddr = c.Listen.Admin
	}
	return g, g.BindAddr != ""
}

// Values of InitialClusterState.
const (
	ClusterStateNew      = "new"
	ClusterStateExisting = "existing"
)

// DefaultServerConfig returns a Server with every default set and every
// required key empty.
func DefaultServerConfig() *Server {
	return &Server{
		InitialClusterState: ClusterStateNew,
		Log:                 Log{Level: "info", Format: "json"},
		Raft: Raft{
			TickInterval:           100 * time.Millisecond,
			ElectionTicks:          10,
			HeartbeatTicks:         1,
			SnapshotCount:          10000,
			SnapshotCatchUpEntries: 5000,
		},
		Limits:   DefaultServerLimits(),
		Gossip:   func() gossip.Config { g := gossip.DefaultConfig(); g.BindAddr = ""; return g }(),
		Policy:   DefaultPolicy(),
		Renewals: Renewals{Slot: 100 * time.Millisecond, Frames: true},
		Recovery: recovery.DefaultConfig(),
		S3:       objstore.DefaultConfig(),
	}
}

// LoadServer reads the YAML file at path over DefaultServerConfig() and
// validates it. Every error is an *Error naming the file, the line and the
// key. It reads nothing but path.
func LoadServer(path string) (*Server, error) {
	cfg := DefaultServerConfig()
	src, err := decodeFile(path, cfg)
	return validated(cfg, src, err)
}

// ParseServer is LoadServer for YAML already in memory; name is used as
// the file name in errors.
func ParseServer(name string, data []byte) (*Server, error) {
	cfg := DefaultServerConfig()
	src, err := decodeBytes(name, data, cfg)
	return validated(cfg, src, err)
}

// setSource keeps the source the configuration was read from.
func (c *Server) setSource(src *source) { c.src = src }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Validate checks every key and returns all mistakes found (errors.Join of
// *Error, in file order of the checks), or nil.
func (c *Server) Validate() error {
	v := validator{src: c.src}
	v.name("cluster_name", c.ClusterName)
	v.name("node_id", c.NodeID)
	v.required("data_dir", c.DataDir, "directory of the raft log")
	adminOK := v.serverListen(c.Listen)
	v.initialCluster(c)
	v.logSection(c.Log)
	v.tlsSection(c.TLS)
	g, _ := c.GossipConfig()
	v.plaintext(c.TLS, c.Insecure, []keyAddr{
		{"listen.admin", c.Listen.Admin}, {"listen.raft", c.Listen.Raft}, {"listen.http", c.Listen.HTTP},
		{gossipKey(c.Gossip.BindAddr), g.BindAddr},
	})
	v.raftSection(c.Raft)
	if sl := c.Renewals.Slot; sl != 0 && (sl < time.Millisecond || sl > lease.MaxRenewalSlot) {
		v.add("renewals.slot", "must be 0 (off) or from 1ms to %s, got %s", lease.MaxRenewalSlot, sl)
	}
	v.limit("limits.admin", c.Limits.Admin)
	v.limit("limits.raft", c.Limits.Raft)
	v.limit("limits.http", c.Limits.HTTP)
	v.limit("limits.metrics", c.Limits.Metrics)
	v.serverGossip(c, adminOK)
	section(&v, "policy", policy.Validate(c.Policy.Proto()), func(e *policy.KeyError) (string, string) { return e.Key, e.Reason })
	section(&v, "recovery", c.Recovery.Validate(), func(e *recovery.ConfigError) (string, string) { return e.Key, e.Reason })
	if c.S3 != (objstore.Config{Region: c.S3.Region}) {
		section(&v, "s3", c.S3.Validate(), func(e *objstore.ConfigError) (string, string) { return e.Key, e.Reason })
	}
	return errors.Join(v.errs...)
}

// section adds the error a section's own Validate returned: under
// prefix.<key> when it is a keyed error E (keyReason says its key and
// reason), else under prefix.
func section[E error](v *validator, prefix string, err error, keyReason func(E) (key, reason string)) {
	if err == nil {
		return
	}
	var e E
	if errors.As(err, &e) {
		key, reason := keyReason(e)
		v.add(prefix+"."+key, "%s", reason)
		return
	}
	v.add(prefix, "%v", err)
}

// serverListen checks the listen section: the addresses, and no two
// listeners on one address. It reports whether listen.admin is valid.
func (v *validator) serverListen(l Listen) (adminOK bool) {
	adminOK = v.listenAddr("listen.admin", l.Admin, true)
	v.listenAddr("listen.raft", l.Raft, true)
	if l.Gossip != "" {
		v.add("listen.gossip", "moved to gossip.listen: write gossip: {listen: %s} (one key for the gossip address)", l.Gossip)
	}
	v.listenAddr("listen.http", l.HTTP, false)
	v.listenAddr("listen.metrics", l.Metrics, false)
	seen := map[string]string{}
	for _, a := range []keyAddr{
		{"listen.admin", l.Admin}, {"listen.raft", l.Raft},
		{"listen.gossip", l.Gossip}, {"listen.http", l.HTTP},
		{"listen.metrics", l.Metrics},
	} {
		if a.addr == "" || strings.HasSuffix(a.addr, ":0") {
			continue // port 0 picks a free port: never a clash
		}
		if other, dup := seen[a.addr]; dup {
			v.add(a.key, "address %s is already used by %s", a.addr, other)
		}
		seen[a.addr] = a.key
	}
	return adminOK
}

// initialCluster checks initial_cluster_state and initial_cluster: each
// member's id and addresses valid and unique, and a founding member listing
// itself.
func (v *validator) initialCluster(c *Server) {
	switch c.InitialClusterState {
	case ClusterStateNew, ClusterStateExisting:
	default:
		v.add("initial_cluster_state", "must be new or existing, got %q", c.InitialClusterState)
	}
	if len(c.InitialCluster) == 0 && c.InitialClusterState != ClusterStateExisting {
		v.missing("initial_cluster", "must list the founding members")
	}
	ids, raftAddrs, adminAddrs := map[string]int{}, map[string]int{}, map[string]int{}
	self := false
	for i, m := range c.InitialCluster {
		p := fmt.Sprintf("initial_cluster[%d]", i)
		if v.name(p+".id", m.ID) {
			v.unique(ids, m.ID, i, p+".id", "duplicate member id %q (also initial_cluster[%d])")
		}
		if v.peerAddr(p+".raft", m.Raft) {
			v.unique(raftAddrs, m.Raft, i, p+".raft", "duplicate address %s (also initial_cluster[%d])")
		}
		if v.peerAddr(p+".admin", m.Admin) {
			v.unique(adminAddrs, m.Admin, i, p+".admin", "duplicate address %s (also initial_cluster[%d])")
		}
		self = self || m.ID == c.NodeID
	}
	if c.InitialClusterState == ClusterStateNew && len(c.InitialCluster) > 0 && c.NodeID != "" && !self {
		v.add("node_id", "%q is not in initial_cluster (a founding member must list itself)", c.NodeID)
	}
}

// unique adds the mistake format (of the value and the index of its first
// use) under key when val is in seen already, and records it at index i.
func (v *validator) unique(seen map[string]int, val string, i int, key, format string) {
	if j, dup := seen[val]; dup {
		v.add(key, format, val, j)
	}
	seen[val] = i
}

// raftSection checks the raft section: the tick, the heartbeat and the
// election (whose timeout is bounded), and the snapshot counts.
func (v *validator) raftSection(r Raft) {
	if r.TickInterval < time.Millisecond || r.TickInterval > MaxRaftTick {
		v.add("raft.tick_interval", "must be from 1ms to %s, got %s", MaxRaftTick, r.TickInterval)
	}
	if r.HeartbeatTicks < 1 {
		v.add("raft.heartbeat_ticks", "must be at least 1, got %d", r.HeartbeatTicks)
	}
	if r.ElectionTicks <= r.HeartbeatTicks {
		v.add("raft.election_ticks", "must be greater than heartbeat_ticks (%d), got %d", r.HeartbeatTicks, r.ElectionTicks)
	} else if r.ElectionTicks > MaxRaftElectionTicks {
		v.add("raft.election_ticks", "must be at most %d, got %d", MaxRaftElectionTicks, r.ElectionTicks)
	} else if el := time.Duration(r.ElectionTicks) * r.TickInterval; r.TickInterval <= MaxRaftTick && el > MaxRaftElectionTimeout {
		v.add("raft.election_ticks", "election_ticks × tick_interval is %s, longer than the longest election timeout walden accepts (%s): a leader lost would go unnoticed that long",
			el, MaxRaftElectionTimeout)
	}
	if r.SnapshotCount > MaxRaftSnapshotEntries {
		v.add("raft.snapshot_count", "must be at most %d, got %d", MaxRaftSnapshotEntries, r.SnapshotCount)
	}
	if r.SnapshotCatchUpEntries > MaxRaftSnapshotEntries {
		v.add("raft.snapshot_catchup_entries", "must be at most %d, got %d", MaxRaftSnapshotEntries, r.SnapshotCatchUpEntries)
	}
	if r.SnapshotCount < 1 {
		v.add("raft.snapshot_count", "must be at least 1")
	}
}

// serverGossip checks the gossip pool settings of the coordinator's member
// once cluster_name and node_id are known. The gossip address may be
// written as listen.gossip; a bad advertised admin address is
// listen.admin's mistake (reported once: adminOK false says it is).
func (v *validator) serverGossip(c *Server, adminOK bool) {
	g, on := c.GossipConfig()
	if !on || c.ClusterName == "" || c.NodeID == "" {
		return
	}
	err := g.Validate()
	if err == nil {
		return
	}
	var ge *gossip.ConfigError
	switch {
	case errors.As(err, &ge) && !strings.HasPrefix(ge.Key, "meta") && ge.Key != "cluster_name" && ge.Key != "node_name":
		key := "gossip." + ge.Key
		if ge.Key == "listen" && c.Gossip.BindAddr == "" {
			key = "listen.gossip"
		}
		v.add(key, "%s", ge.Reason)
	case errors.As(err, &ge) && strings.HasPrefix(ge.Key, "meta.admin_addr"):
		if adminOK { // else listen.admin's mistake is reported already
			v.add("listen.admin", "%s", ge.Reason)
		}
	default:
		v.add("gossip", "%v", err)
	}
}

// Source returns the file the configuration was read from ("" when built
// in code).
func (c *Server) Source() string {
	if c.src == nil {
		return ""
	}
	return c.src.file
}

type validator struct {
	src  *source
	errs []error
}

func (v *validator) add(key, format string, args ...any) {
	v.errs = append(v.errs, v.src.errAt(key, format, args...))
}

// missing reports a required key that is absent or empty; what, when set,
// says what the key should hold.
func (v *validator) missing(key, what string) {
	if what != "" {
		what = " (" + what + ")"
	}
	if v.src.has(key) {
		v.add(key, "must not be empty%s", what)
	} else {
		v.add(key, "missing required key%s", what)
	}
}

func (v *validator) required(key, val, what string) bool {
	if val == "" {
		v.missing(key, what)
		return false
	}
	return true
}

func (v *validator) name(key, val string) bool {
	if !v.required(key, val, "") {
		return false
	}
	if err := CheckName(val); err != nil {
		v.add(key, "%v", err)
		return false
	}
	return true
}

// listenAddr checks a host:port to listen on; the host may be empty (all
// interfaces) and the port 0 (any free port).
func (v *validator) listenAddr(key, val string, required bool) bool {
	return v.hostPort(key, val, required, false)
}

// peerAddr checks an address other members dial: host and a non-zero port.
func (v *validator) peerAddr(key, val string) bool {
	return v.hostPort(key, val, true, true)
}

// optionalPeerAddr is peerAddr for a key that may be left empty.
func (v *validator) optionalPeerAddr(key, val string) bool {
	return v.hostPort(key, val, false, true)
}

// hostPort checks a host:port as checkHostPort does; an empty one is a
// mistake when required.
func (v *validator) hostPort(key, val string, required, dial bool) bool {
	if val == "" {
		if required {
			v.missing(key, "host:port")
		}
		return false
	}
	if err := checkHostPort(val, dial); err != nil {
		v.add(key, "invalid address %q: %v", val, err)
		return false
	}
	return true
}

// CheckName reports why name is not a valid cluster or member name.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("invalid name %q (letters, digits, '.', '_' and '-', at most 63, starting with a letter or digit)", name)
	}
	return nil
}

// CheckHostPort reports why addr is not a usable host:port. With dial set,
// the host must be present and the port non-zero (an address others dial).
func CheckHostPort(addr string, dial bool) error { return checkHostPort(addr, dial) }

func checkHostPort(addr string, dial bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port")
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if dial && p == 0 {
		return errors.New("port must not be 0")
	}
	if dial && host == "" {
		return errors.New("host must not be empty")
	}
	if host != "" && net.ParseIP(host) == nil && !hostnameRE.MatchString(host) {
		return fmt.Errorf("host %q is neither an IP address nor a host name", host)
	}
	return nil
}

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?$`)
