package devcluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/authz"
	"walden/certs"
	"walden/config"
	"walden/mtls"
	"walden/objstore"
	waldenv1 "walden/proto/walden/v1"
)

// Errors of this package.
var (
	// ErrTimeout is returned when something awaited did not happen before
	// its deadline.
	ErrTimeout = errors.New("timed out")
	// ErrNoCoordinator is returned when no live coordinator answered.
	ErrNoCoordinator = errors.New("no coordinator answered")
	// ErrInvalid is returned for invalid Options.
	ErrInvalid = errors.New("invalid options")
)

// Options describe the cluster Start builds. Zero values take the defaults
// named on each field.
type Options struct {
	// Bin is the walden binary every child runs (required).
	Bin string
	// Dir holds configs, data, WALs and logs (required; created).
	Dir string
	// ClusterName is the coordinators' cluster_name (default "dev").
	ClusterName string
	// S3 is the object store to use; nil starts `walden s3` as a child.
	S3 *objstore.Config
	// Brokers is the number of brokers (default 3).
	Brokers int
	// StreamsPerBroker is the number of streams each broker opens at start
	// (default 3): broker i opens streams i*100+1 … i*100+n.
	StreamsPerBroker int
	// Policy is the body of the coordinators' policy: section as YAML
	// lines ("failure_timeout: 5s"); empty keeps walden's defaults.
	Policy []string
	// Recovery is the body of the recovery: section as YAML lines
	// (e.g. "job_lease: 3s"); empty keeps the defaults.
	Recovery []string
	// WALCapacity is each broker's wal.capacity (default 64 MiB).
	WALCapacity int64
	// UploadInterval is each broker's upload_interval (default 1s).
	UploadInterval time.Duration
	// UploadBytes is each broker's upload_bytes (0: the broker's default).
	UploadBytes int64
	// BacklogStreams gives each broker one more stream (i*100+99), not
	// loaded by the regular load: Failover.Backlog writes to it.
	BacklogStreams bool
	// LogLevel is every child's log.level (default info).
	LogLevel string
	// Host is the loopback address every process binds (default a random
	// 127.0.x.y on Linux, 127.0.0.1 elsewhere).
	Host string
	// Listen, when set, gives the host:port each process binds for a role
	// ("s3"; a coordinator's "admin", "raft", "gossip", "http", "metrics"; a broker's
	// "listen", "agent", "gossip") instead of a free port of Host, e.g. a
	// fixed port on an address of the process's own network namespace.
	Listen func(proc, role string) string
	// Command, when set, builds the command that runs argv for the named
	// process ("s3", "c1", "b1"...) instead of running argv directly, e.g.
	// inside a network namespace.
	Command func(proc string, argv []string) *exec.Cmd
	// Dial, when set, opens every connection this package makes to the
	// processes (gRPC and HTTP), e.g. from another network namespace.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// DialOptions are added to every gRPC connection this package makes
	// to the processes (and to DialOptions' answer), e.g. an interceptor
	// that records the calls.
	DialOptions []grpc.DialOption
	// Insecure runs every process in plaintext (insecure: true in its
	// config) instead of mutual TLS with roles.
	Insecure bool
	// S3Command, when set with S3 nil, is the S3 server run as the "s3"
	// child instead of `walden s3`: given its listen address and a
	// directory of its own, it returns the command line and the Config
	// every process uses.
	S3Command func(listen, dir string) (argv []string, cfg objstore.Config)
	// Broker is the kind of broker: BrokerWalden (the default) or
	// BrokerAutomq (AutoMQ-mode brokers, each started by its agent in
	// watchdog mode, the development AutoMQ controller as the child "amq",
	// and recovery.action automq on the coordinators).
	Broker string
	// TakeoverAfter is, with BrokerAutomq, how long a broker must be
	// unreachable before the others lead its streams (default 1s).
	TakeoverAfter time.Duration
	// LeaseSafetyMargin and KillMargin are, with BrokerAutomq, the
	// agents' lease_safety_margin and watchdog.kill_margin (defaults
	// 500ms each; below half the policy's lease_ttl together).
	LeaseSafetyMargin, KillMargin time.Duration
}

func (o *Options) fill() error {
	if o.Bin == "" || o.Dir == "" {
		return fmt.Errorf("%w: Bin and Dir are required", ErrInvalid)
	}
	if o.ClusterName == "" {
		o.ClusterName = "dev"
	}
	if o.Brokers == 0 {
		o.Brokers = 3
	}
	if o.StreamsPerBroker == 0 {
		o.StreamsPerBroker = 3
	}
	if o.WALCapacity == 0 {
		o.WALCapacity = 64 << 20
	}
	if o.UploadInterval == 0 {
		o.UploadInterval = time.Second
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	switch o.Broker {
	case "":
		o.Broker = BrokerWalden
	case BrokerWalden, BrokerAutomq:
	default:
		return fmt.Errorf("%w: Broker %q is not %s or %s", ErrInvalid, o.Broker, BrokerWalden, BrokerAutomq)
	}
	if o.TakeoverAfter == 0 {
		o.TakeoverAfter = time.Second
	}
	if o.LeaseSafetyMargin == 0 {
		o.LeaseSafetyMargin = 500 * time.Millisecond
	}
	if o.KillMargin == 0 {
		o.KillMargin = 500 * time.Millisecond
	}
	return nil
}

// Proc is one child process of the cluster: the S3 server, a coordinator or
// a broker. It can be killed, stopped, continued and started again with the
// same config (and so the same addresses and data).
type Proc struct {
	// Name is "s3", "c1".., "b1"..., "amq" (the AutoMQ controller).
	Name string
	// Log is the file receiving the child's stdout and stderr.
	Log string
	// Config is the child's config file (empty for s3). In a cluster of
	// AutoMQ-mode brokers, a broker's process is its agent: Config is the
	// agent's, BrokerConfig the broker's, which the agent starts.
	Config       string
	BrokerConfig string

	// Coordinator addresses. HTTP serves mutual TLS when the cluster does;
	// Metrics (listen.metrics) serves /metrics, /healthz and /readyz in
	// plain HTTP always.
	Admin, Raft, Gossip, HTTP, Metrics string
	// Broker addresses and streams.
	Listen, AgentListen string
	Streams             []uint64
	// BacklogStream is the broker's extra stream (0: none).
	BacklogStream uint64

	bin     string
	args    []string
	command func(proc string, argv []string) *exec.Cmd
	// host is the name Command runs the process as (its network
	// namespace's); "" for Name. A coordinator replaced under a new name
	// runs where the old one did.
	host string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts the process (again). It is an error to start a live one.
func (p *Proc) Start() error { return p.StartWith() }

// StartWith starts the process (again) with extra arguments after its own,
// for this start only (walden server --force-new-cluster).
func (p *Proc) StartWith(extra ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited != nil {
		select {
		case <-p.exited:
		default:
			return fmt.Errorf("start %s: already running", p.Name)
		}
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	args := append(slices.Clone(p.args), extra...)
	var cmd *exec.Cmd
	if p.command != nil {
		host := p.host
		if host == "" {
			host = p.Name
		}
		cmd = p.command(host, append([]string{p.bin}, args...))
	} else {
		cmd = exec.Command(p.bin, args...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	return nil
}

// Kill sends SIGKILL (kill -9) and waits until the process is gone. A
// stopped (SIGSTOP) process dies too.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Signal sends sig to the live process.
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if !p.Alive() {
		return fmt.Errorf("signal %s: not running", p.Name)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	return nil
}

// Alive reports whether the process runs (a stopped process counts).
func (p *Proc) Alive() bool {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// Pid is the process id of the current run (0 when never started).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Cluster is an S3 server, three coordinators and the brokers, each a child
// process. Unless Options.Insecure, every process runs mutual TLS with
// roles: a CA of the cluster's own in Dir/pki (walden certs), a coordinator
// certificate per member, a broker certificate per broker, and the clients
// of this package present an admin certificate.
type Cluster struct {
	Opts Options
	// S3Config is the object store every process uses.
	S3Config objstore.Config
	// S3 is the `walden s3` child (nil when Options.S3 was given).
	S3 *Proc
	// Coords are the coordinators c1..c3; Brokers b1..bN.
	Coords  []*Proc
	Brokers []*Proc

	// PKI is the directory of the CA, the gossip key and the certificates
	// ("" when Options.Insecure).
	PKI string
	// Automq is the development AutoMQ controller (nil unless
	// Options.Broker is BrokerAutomq).
	Automq *Automq

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	// pkiMu serializes issuing certificates (never held with mu).
	pkiMu sync.Mutex
}

// ClientIdentity is the identity of the clients this package makes: an
// admin (it fails brokers over, sets the policy, adds members).
var ClientIdentity = authz.Identity{Name: "admin", Role: authz.RoleAdmin}

// FreeAddr returns a free port of host (a loopback address) as host:port.
// The port is free when FreeAddr returns; a process of another program may
// still take it before the child binds it, which is why each cluster uses
// a loopback address of its own.
func FreeAddr(host string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// New lays the cluster out (ports, config files) without starting anything.
func New(o Options) (*Cluster, error) {
	if err := o.fill(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{Opts: o, conns: map[string]*grpc.ClientConn{}}
	// A loopback address of its own (127.0.x.y) keeps the cluster's ports
	// apart from everything else on 127.0.0.1.
	host := o.Host
	if host == "" && runtime.GOOS != "linux" {
		host = "127.0.0.1" // only Linux routes all of 127.0.0.0/8 by default
	}
	if host == "" {
		host = fmt.Sprintf("127.0.%d.%d", 2+rand.IntN(250), 2+rand.IntN(250))
	}
	// addrs fills the addresses of proc's roles (role1, addr1, role2,
	// addr2...).
	// A port the kernel handed out once may come back for the next
	// listener: every address of the cluster is a different one.
	taken := map[string]bool{}
	addrs := func(proc string, roles ...any) error {
		for i := 0; i < len(roles); i += 2 {
			role, p := roles[i].(string), roles[i+1].(*string)
			if o.Listen != nil {
				*p = o.Listen(proc, role)
				continue
			}
			for {
				a, err := FreeAddr(host)
				if err != nil {
					return err
				}
				if !taken[a] {
					taken[a] = true
					*p = a
					break
				}
			}
		}
		return nil
	}
	switch {
	case o.S3 != nil:
		c.S3Config = *o.S3
	case o.S3Command != nil:
		var listen string
		if err := addrs("s3", "s3", &listen); err != nil {
			return nil, err
		}
		argv, cfg := o.S3Command(listen, filepath.Join(o.Dir, "s3"))
		c.S3 = &Proc{Name: "s3", Log: filepath.Join(o.Dir, "s3.log"), bin: argv[0], args: argv[1:], command: o.Command}
		c.S3Config = cfg
	default:
		var listen string
		if err := addrs("s3", "s3", &listen); err != nil {
			return nil, err
		}
		c.S3 = &Proc{Name: "s3", Log: filepath.Join(o.Dir, "s3.log"), bin: o.Bin, command: o.Command,
			args: []string{"s3", "--listen", listen, "--dir", filepath.Join(o.Dir, "s3"), "--bucket", "walden"}}
		c.S3Config = objstore.FakeConfig("http://"+listen, "walden")
	}
	for i := 1; i <= 3; i++ {
		p := &Proc{Name: fmt.Sprintf("c%d", i), bin: o.Bin, command: o.Command}
		if err := addrs(p.Name, "admin", &p.Admin, "raft", &p.Raft, "gossip", &p.Gossip, "http", &p.HTTP, "metrics", &p.Metrics); err != nil {
			return nil, err
		}
		c.Coords = append(c.Coords, p)
	}
	for i := 1; i <= o.Brokers; i++ {
		p := &Proc{Name: fmt.Sprintf("b%d", i), bin: o.Bin, command: o.Command}
		if err := addrs(p.Name, "listen", &p.Listen, "agent", &p.AgentListen, "gossip", &p.Gossip); err != nil {
			return nil, err
		}
		for s := 1; s <= o.StreamsPerBroker; s++ {
			p.Streams = append(p.Streams, uint64(i*100+s))
		}
		if o.BacklogStreams {
			p.BacklogStream = uint64(i*100 + 99)
		}
		c.Brokers = append(c.Brokers, p)
	}
	if o.Broker == BrokerAutomq {
		if err := c.layoutAutomq(addrs); err != nil {
			return nil, err
		}
	}
	if !o.Insecure {
		if err := c.makePKI(); err != nil {
			return nil, err
		}
	}
	if err := c.writeConfigs(); err != nil {
		return nil, err
	}
	return c, nil
}

// hostOf is the host of a host:port.
func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// makePKI creates the cluster's CA and gossip key in Dir/pki and the
// certificates of the coordinators (valid for their hosts) and brokers.
func (c *Cluster) makePKI() error {
	c.PKI = filepath.Join(c.Opts.Dir, "pki")
	if _, err := certs.Init(c.PKI, "walden "+c.Opts.ClusterName+" CA (throwaway)", 0); err != nil {
		return err
	}
	for _, m := range c.Coords {
		id := authz.Identity{Name: m.Name, Role: authz.RoleCoordinator}
		if _, err := c.issue(id, hostOf(m.Admin), hostOf(m.Raft), hostOf(m.HTTP)); err != nil {
			return err
		}
	}
	for _, b := range c.Brokers {
		id := authz.Identity{Name: b.Name, Role: authz.RoleBroker, BrokerID: b.Name}
		if _, err := c.issue(id, hostOf(b.Listen)); err != nil {
			return err
		}
	}
	return nil
}

// issue writes id's certificate into the PKI directory, unless it is there.
func (c *Cluster) issue(id authz.Identity, hosts ...string) (config.TLS, error) {
	t := config.TLS{CertFile: filepath.Join(c.PKI, id.Name+".pem"), KeyFile: filepath.Join(c.PKI, id.Name+"-key.pem"),
		CAFile: filepath.Join(c.PKI, certs.CAFile)}
	c.pkiMu.Lock()
	defer c.pkiMu.Unlock()
	if _, err := os.Stat(t.CertFile); err == nil {
		return t, nil
	}
	var hs []string
	for _, h := range hosts {
		if h != "" && !slices.Contains(hs, h) {
			hs = append(hs, h)
		}
	}
	if _, err := certs.IssueFiles(c.PKI, "", certs.Request{Identity: id, Hosts: hs}); err != nil {
		return config.TLS{}, fmt.Errorf("certificate of %s: %w", id.Name, err)
	}
	return t, nil
}

// TLSOf returns the tls section of id's certificate, issuing it on first
// use (e.g. a reader, or the agent of one broker). It fails when the
// cluster runs Insecure.
func (c *Cluster) TLSOf(id authz.Identity) (config.TLS, error) {
	if c.PKI == "" {
		return config.TLS{}, fmt.Errorf("%w: the cluster runs without TLS", ErrInvalid)
	}
	return c.issue(id)
}

// ClientFlags are the command-line flags (--cacert, --cert, --key) of
// waldenctl, walden load and walden verify that present id's certificate;
// none when the cluster runs Insecure.
func (c *Cluster) ClientFlags(id authz.Identity) ([]string, error) {
	if c.PKI == "" {
		return nil, nil
	}
	t, err := c.issue(id)
	if err != nil {
		return nil, err
	}
	return []string{"--cacert", t.CAFile, "--cert", t.CertFile, "--key", t.KeyFile}, nil
}

// tlsYAML is a process's tls section, or insecure: true.
func (c *Cluster) tlsYAML(id authz.Identity) (string, error) {
	if c.PKI == "" {
		return "insecure: true\n", nil
	}
	t, err := c.issue(id)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("tls: {cert_file: %q, key_file: %q, ca_file: %q}\n", t.CertFile, t.KeyFile, t.CAFile), nil
}

func yamlList(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func section(name string, lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return name + ":\n  " + strings.Join(lines, "\n  ") + "\n"
}

func (c *Cluster) s3YAML() string {
	s := c.S3Config
	region := s.Region
	if region == "" {
		region = "us-east-1"
	}
	return fmt.Sprintf("s3: {endpoint: %q, region: %q, bucket: %q, path_style: %v, access_key_id: %q, secret_access_key: %q, prefix: %q}\n",
		s.Endpoint, region, s.Bucket, s.PathStyle, s.AccessKeyID, s.SecretAccessKey, s.Prefix)
}

func (c *Cluster) writeConfigs() error {
	o := c.Opts
	var peers strings.Builder
	var gossipJoin []string
	for _, m := range c.Coords {
		fmt.Fprintf(&peers, "  - {id: %s, raft: %q, admin: %q}\n", m.Name, m.Raft, m.Admin)
		gossipJoin = append(gossipJoin, m.Gossip)
	}
	recovery := o.Recovery
	if c.Automq != nil {
		recovery = c.automqRecovery()
	}
	for _, m := range c.Coords {
		m.Config = filepath.Join(o.Dir, m.Name+".yaml")
		m.Log = filepath.Join(o.Dir, m.Name+".log")
		m.args = []string{"server", "--config", m.Config}
		tlsText, err := c.tlsYAML(authz.Identity{Name: m.Name, Role: authz.RoleCoordinator})
		if err != nil {
			return err
		}
		text := fmt.Sprintf(`cluster_name: %s
node_id: %s
data_dir: %q
listen:
  admin: %q
  raft: %q
  http: %q
  metrics: %q
initial_cluster:
%sgossip:
  listen: %q
  join: %s
%s%s%s%slog: {level: %s, format: json}
`, o.ClusterName, m.Name, filepath.Join(o.Dir, m.Name), m.Admin, m.Raft, m.HTTP, m.Metrics, peers.String(),
			m.Gossip, yamlList(gossipJoin), section("policy", o.Policy), section("recovery", recovery), c.s3YAML(), tlsText, o.LogLevel)
		if err := os.WriteFile(m.Config, []byte(text), 0o644); err != nil {
			return err
		}
	}
	for _, b := range c.Brokers {
		if c.Automq != nil {
			if err := c.writeAutomqBroker(b, gossipJoin); err != nil {
				return err
			}
			continue
		}
		b.Config = filepath.Join(o.Dir, b.Name+".yaml")
		b.Log = filepath.Join(o.Dir, b.Name+".log")
		b.args = []string{"broker", "--config", b.Config}
		streams := make([]string, len(b.Streams))
		for i, s := range b.Streams {
			streams[i] = fmt.Sprint(s)
		}
		if b.BacklogStream != 0 {
			streams = append(streams, fmt.Sprint(b.BacklogStream))
		}
		tlsText, err := c.tlsYAML(authz.Identity{Name: b.Name, Role: authz.RoleBroker, BrokerID: b.Name})
		if err != nil {
			return err
		}
		upload := fmt.Sprintf("upload_interval: %s\n", o.UploadInterval)
		if o.UploadBytes > 0 {
			upload += fmt.Sprintf("upload_bytes: %d\n", o.UploadBytes)
		}
		text := fmt.Sprintf(`broker_id: %s
cluster_name: %s
listen: %q
agent_listen: %q
coordinators: %s
gossip: {listen: %q, join: %s}
wal: {path: %q, capacity: %d}
%sstreams: [%s]
takeover: true
%s%slog: {level: %s, format: json}
`, b.Name, o.ClusterName, b.Listen, b.AgentListen, yamlList(c.AdminAddrs()), b.Gossip, yamlList(gossipJoin),
			filepath.Join(o.Dir, b.Name+".wal"), o.WALCapacity, c.s3YAML(), strings.Join(streams, ", "), upload, tlsText, o.LogLevel)
		if err := os.WriteFile(b.Config, []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// AdminAddrs are the coordinators' admin addresses.
func (c *Cluster) AdminAddrs() []string {
	out := make([]string, len(c.Coords))
	for i, m := range c.Coords {
		out[i] = m.Admin
	}
	return out
}

// procs are every child: S3, the AutoMQ controller, the coordinators, the
// brokers (some may be nil).
func (c *Cluster) procs() []*Proc {
	out := []*Proc{c.S3}
	if c.Automq != nil {
		out = append(out, c.Automq.Controller)
	}
	return append(append(out, c.Coords...), c.Brokers...)
}

// Proc returns the child named name, or nil.
func (c *Cluster) Proc(name string) *Proc {
	for _, p := range c.procs() {
		if p != nil && p.Name == name {
			return p
		}
	}
	return nil
}

// Start starts S3 (when it is a child), the coordinators, waits for a
// leader, starts the brokers and waits until every broker's streams are
// open. On error the started processes keep running: call Close.
func (c *Cluster) Start(ctx context.Context, timeout time.Duration) error {
	if c.S3 != nil {
		if err := c.S3.Start(); err != nil {
			return err
		}
		if err := waitHTTP(ctx, c.HTTPClient(time.Second), c.S3Config.Endpoint, c.S3, timeout); err != nil {
			return err
		}
	}
	if c.Automq != nil {
		if err := c.startAutomq(ctx, timeout); err != nil {
			return err
		}
	}
	for _, m := range c.Coords {
		if err := m.Start(); err != nil {
			return err
		}
	}
	if _, err := c.WaitLeader(ctx, "", timeout); err != nil {
		return fmt.Errorf("%w%s", err, c.exitedNote())
	}
	for _, b := range c.Brokers {
		if err := b.Start(); err != nil {
			return err
		}
	}
	if err := c.WaitStreamsOpen(ctx, timeout); err != nil {
		return fmt.Errorf("%w%s", err, c.exitedNote())
	}
	return nil
}

// Close kills every child and closes the client connections.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for _, p := range append(append([]*Proc{}, c.Brokers...), c.Coords...) {
		wg.Add(1)
		go func() { defer wg.Done(); p.Kill() }()
	}
	wg.Wait()
	if c.S3 != nil {
		c.S3.Kill()
	}
	if c.Automq != nil {
		c.Automq.Controller.Kill()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.conns {
		cc.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
}

func (c *Cluster) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.DialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// DialOptions are the gRPC options of every connection to the processes
// (mutual TLS as ClientIdentity, or plain gRPC when Insecure; through
// Options.Dial when set): pass them to clients of the cluster built
// elsewhere (a load, a verify).
func (c *Cluster) DialOptions() []grpc.DialOption {
	opts, err := c.DialOptionsAs(ClientIdentity)
	if err != nil {
		// The PKI was made by New; only a removed directory fails here,
		// and then every call fails with the handshake naming it.
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if c.Opts.Dial != nil {
			opts = append(opts, grpc.WithContextDialer(c.Opts.Dial))
		}
		return append(opts, c.Opts.DialOptions...)
	}
	return opts
}

// DialOptionsAs are DialOptions presenting id's certificate (issued on
// first use). The harness dials coordinators and brokers' data APIs alike:
// the server's certificate must carry one of those two roles (a product
// client requires the one it dials: mtls.ClientCreds, BrokerClientCreds).
func (c *Cluster) DialOptionsAs(id authz.Identity) ([]grpc.DialOption, error) {
	creds := insecure.NewCredentials()
	if c.PKI != "" {
		t, err := c.issue(id)
		if err != nil {
			return nil, err
		}
		m, err := mtls.Load(t)
		if err != nil {
			return nil, err
		}
		creds = mtls.CredsFor(mtls.ForServerRole(m.Client, authz.RoleCoordinator, authz.RoleBroker), "")
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.Opts.Dial != nil {
		opts = append(opts, grpc.WithContextDialer(c.Opts.Dial))
	}
	return append(opts, c.Opts.DialOptions...), nil
}

// HTTPClient returns an HTTP client with the given timeout whose
// connections go through Options.Dial when set. With TLS on it presents
// ClientIdentity's certificate to https:// URLs (a coordinator's HTTP
// listener); http:// URLs (S3, an agent's endpoint, listen.metrics) stay
// plain.
func (c *Cluster) HTTPClient(timeout time.Duration) *http.Client {
	tr := &http.Transport{}
	if c.Opts.Dial != nil {
		tr.DialContext = func(ctx context.Context, _, addr string) (net.Conn, error) {
			return c.Opts.Dial(ctx, addr)
		}
	}
	if c.PKI != "" {
		if t, err := c.issue(ClientIdentity); err == nil {
			if m, err := mtls.Load(t); err == nil {
				tr.TLSClientConfig = m.Client
			}
		}
	}
	return &http.Client{Timeout: timeout, Transport: tr}
}

// Conn returns a client connection to addr (cached).
func (c *Cluster) Conn(addr string) (*grpc.ClientConn, error) { return c.conn(addr) }

// Call runs f against each live coordinator in turn (the leader first when
// known) until one answers without error; f gets a context bounded to 2s.
func (c *Cluster) Call(ctx context.Context, f func(ctx context.Context, cc *grpc.ClientConn) error) error {
	return c.call(ctx, c.conn, f)
}

// CallAs is Call presenting id's certificate (issued on first use): a
// broker's own identity, a reader, the agent of one broker.
func (c *Cluster) CallAs(ctx context.Context, id authz.Identity, f func(ctx context.Context, cc *grpc.ClientConn) error) error {
	opts, err := c.DialOptionsAs(id)
	if err != nil {
		return err
	}
	var conns []*grpc.ClientConn
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	return c.call(ctx, func(addr string) (*grpc.ClientConn, error) {
		cc, err := grpc.NewClient(addr, opts...)
		if err == nil {
			conns = append(conns, cc)
		}
		return cc, err
	}, f)
}

func (c *Cluster) call(ctx context.Context, dial func(addr string) (*grpc.ClientConn, error), f func(ctx context.Context, cc *grpc.ClientConn) error) error {
	var last error = ErrNoCoordinator
	for _, m := range c.Coords {
		if !m.Alive() {
			continue
		}
		cc, err := dial(m.Admin)
		if err != nil {
			last = err
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = f(cctx, cc)
		cancel()
		if err == nil {
			return nil
		}
		last = err
	}
	return last
}

// Status asks one coordinator for its raft status.
func (c *Cluster) Status(ctx context.Context, m *Proc) (*waldenv1.StatusResponse, error) {
	cc, err := c.conn(m.Admin)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return waldenv1.NewClusterClient(cc).Status(ctx, &waldenv1.StatusRequest{})
}

// WaitLeader polls the live coordinators until one of them is the leader
// (and not exclude); it returns that coordinator.
func (c *Cluster) WaitLeader(ctx context.Context, exclude string, timeout time.Duration) (*Proc, error) {
	var leader *Proc
	err := Poll(ctx, timeout, "a raft leader", func() error {
		for _, m := range c.Coords {
			if !m.Alive() || m.Name == exclude {
				continue
			}
			st, err := c.Status(ctx, m)
			if err == nil && st.GetLeaderId() == m.Name {
				leader = m
				return nil
			}
		}
		return errors.New("no member says it leads")
	})
	return leader, err
}

// ListBrokers returns the registry as a coordinator sees it.
func (c *Cluster) ListBrokers(ctx context.Context) ([]*waldenv1.Broker, error) {
	var out []*waldenv1.Broker
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		r, err := waldenv1.NewBrokersClient(cc).ListBrokers(ctx, &waldenv1.ListBrokersRequest{})
		out = r.GetBrokers()
		return err
	})
	return out, err
}

// GetBroker returns one broker of the registry.
func (c *Cluster) GetBroker(ctx context.Context, id string) (*waldenv1.Broker, error) {
	var out *waldenv1.Broker
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		r, err := waldenv1.NewBrokersClient(cc).GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: id})
		out = r.GetBroker()
		return err
	})
	return out, err
}

// ListJobs returns the recovery jobs (of one broker when id is not empty).
func (c *Cluster) ListJobs(ctx context.Context, id string) ([]*waldenv1.Job, error) {
	var out []*waldenv1.Job
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		r, err := waldenv1.NewJobsClient(cc).ListJobs(ctx, &waldenv1.ListJobsRequest{BrokerId: id})
		out = r.GetJobs()
		return err
	})
	return out, err
}

// ListStreams returns every stream of the catalog, ordered by id.
func (c *Cluster) ListStreams(ctx context.Context) ([]*waldenv1.Stream, error) {
	var out []*waldenv1.Stream
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		r, err := waldenv1.NewCatalogClient(cc).ListStreams(ctx, &waldenv1.ListStreamsRequest{})
		out = r.GetStreams()
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].GetStreamId() < out[j].GetStreamId() })
	return out, err
}

// ListEvents returns the replicated event log (oldest first).
func (c *Cluster) ListEvents(ctx context.Context) ([]*waldenv1.Event, error) {
	var out []*waldenv1.Event
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		r, err := waldenv1.NewBrokersClient(cc).ListEvents(ctx, &waldenv1.ListEventsRequest{})
		out = r.GetEvents()
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].GetIndex() < out[j].GetIndex() })
	return out, err
}

// AllStreams lists the stream ids the brokers were configured with (not
// the backlog streams).
func (c *Cluster) AllStreams() []uint64 {
	var out []uint64
	for _, b := range c.Brokers {
		out = append(out, b.Streams...)
	}
	return out
}

func (c *Cluster) allStreamsWithBacklog() []uint64 {
	out := c.AllStreams()
	for _, b := range c.Brokers {
		if b.BacklogStream != 0 {
			out = append(out, b.BacklogStream)
		}
	}
	return out
}

// WaitStreamsOpen polls the catalog (the AutoMQ controller's view for
// AutoMQ-mode brokers) until every configured stream is OPENED (by any
// broker).
func (c *Cluster) WaitStreamsOpen(ctx context.Context, timeout time.Duration) error {
	if c.Automq != nil {
		return c.waitAutomqStreams(ctx, timeout)
	}
	want := c.allStreamsWithBacklog()
	return Poll(ctx, timeout, "every stream opened", func() error {
		ss, err := c.ListStreams(ctx)
		if err != nil {
			return err
		}
		open := map[uint64]bool{}
		for _, s := range ss {
			if s.GetState() == "opened" {
				open[s.GetStreamId()] = true
			}
		}
		for _, id := range want {
			if !open[id] {
				return fmt.Errorf("stream %d not opened", id)
			}
		}
		return nil
	})
}

// exitedNote names the started children that are no longer running.
func (c *Cluster) exitedNote() string {
	var out []string
	for _, p := range c.procs() {
		if p != nil && p.Pid() != 0 && !p.Alive() {
			out = append(out, fmt.Sprintf("%s exited (see %s)", p.Name, p.Log))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "; " + strings.Join(out, ", ")
}

// StreamsOf returns the streams the catalog shows owned by broker id.
func StreamsOf(ss []*waldenv1.Stream, id string) []*waldenv1.Stream {
	var out []*waldenv1.Stream
	for _, s := range ss {
		if s.GetOwnerBrokerId() == id {
			out = append(out, s)
		}
	}
	return out
}

// permanent marks an error that ends Poll at once.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so that Poll stops at once and returns it.
func Permanent(err error) error { return permanent{err} }

// Poll calls f every 100ms until it returns nil, returns a Permanent error,
// ctx ends or timeout passes; the error then names what and f's last error.
func Poll(ctx context.Context, timeout time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		err := f()
		if err == nil {
			return nil
		}
		var p permanent
		if errors.As(err, &p) {
			return p.err
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s waiting for %s: %v", ErrTimeout, timeout, what, last)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

func waitHTTP(ctx context.Context, client *http.Client, endpoint string, p *Proc, timeout time.Duration) error {
	return Poll(ctx, timeout, p.Name+" answering HTTP", func() error {
		if !p.Alive() {
			return Permanent(fmt.Errorf("%s exited; see %s", p.Name, p.Log))
		}
		resp, err := client.Get(endpoint)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
}
