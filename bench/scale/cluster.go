package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	waldenv1 "walden/proto/walden/v1"
)

// coordinator is one `walden server` process.
type coordinator struct {
	id                                string
	admin, raft, gossip, metrics, dir string
	pprof                             string
	cmd                               *exec.Cmd
	exited                            chan struct{}
	conn                              *grpc.ClientConn
}

// cluster is the 3 coordinators of one measurement.
type cluster struct {
	dir    string
	coords []*coordinator
}

func freeAddr(host string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// freeUDPTCP returns a port free for both TCP and UDP (gossip binds both).
func freeUDPTCP(host string) (string, error) {
	for range 50 {
		addr, err := freeAddr(host)
		if err != nil {
			return "", err
		}
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue
		}
		pc.Close()
		return addr, nil
	}
	return "", fmt.Errorf("scale: no free gossip port on %s", host)
}

// policyYAML is the policy section: the chosen policy, with the two gates
// opened that would hold a decision only because of an earlier kill of the
// benchmark: a previous kill's recovery still running
// (max_concurrent_recoveries) and a broker killed again after its revival
// (cooldown). Neither changes when one broker is detected.
// max_failed_fraction keeps its default: a round kills at most half the
// brokers, and a starved load process must freeze failovers, not cause
// them.
func policyYAML(name string) string {
	p := "  max_concurrent_recoveries: 1000\n  cooldown: 0s\n"
	if name == "tuned" {
		p += "  failure_timeout: 2s\n  lease_ttl: 1s\n  drift_margin: 200ms\n"
	}
	return p
}

// limitsYAML raises the admin listener's connection bound above its
// default of 4,096 when the brokers' agents need more: each holds one
// connection to each coordinator. Empty below that (a walden before
// listener limits refuses the key).
func limitsYAML(brokers int) string {
	const defaultMaxConns, spare = 4096, 1000
	if brokers+spare <= defaultMaxConns {
		return ""
	}
	return fmt.Sprintf("limits:\n  admin: {max_conns: %d}\n", brokers+spare)
}

// errPortTaken marks a coordinator that could not bind a port chosen free
// a moment before: another process on the machine took it meanwhile.
var errPortTaken = errors.New("scale: a chosen port was taken before the coordinator bound it")

// startCluster starts 3 coordinators with the walden binary bin in a new
// directory under dir; it tries again with other ports, at most 5 times, when
// another process took one of them first.
func startCluster(ctx context.Context, bin, dir, policy string, slot time.Duration, brokers int) (*cluster, error) {
	for attempt := 1; ; attempt++ {
		sub, err := os.MkdirTemp(dir, "cluster-")
		if err != nil {
			return nil, err
		}
		c, err := startClusterIn(ctx, bin, sub, policy, slot, brokers)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == 5 {
			return c, err
		}
		fmt.Fprintf(os.Stderr, "%v; starting the coordinators again\n", err)
	}
}

// slotYAML is the renewals section of a renewal slot, none for a
// negative one (a binary that may not know the key).
func slotYAML(slot time.Duration) string {
	if slot < 0 {
		return ""
	}
	return fmt.Sprintf("renewals: {slot: %s}\n", slot)
}

// startClusterIn writes the configs of 3 coordinators under dir and starts
// them with the walden binary bin.
func startClusterIn(ctx context.Context, bin, dir, policy string, slot time.Duration, brokers int) (*cluster, error) {
	c := &cluster{dir: dir}
	for i := 1; i <= 3; i++ {
		m := &coordinator{id: fmt.Sprintf("c%d", i), dir: filepath.Join(dir, fmt.Sprintf("c%d", i))}
		var err error
		for _, a := range []*string{&m.admin, &m.raft, &m.metrics} {
			if *a, err = freeAddr("127.0.0.1"); err != nil {
				return nil, err
			}
		}
		if m.gossip, err = freeUDPTCP("127.0.0.1"); err != nil {
			return nil, err
		}
		c.coords = append(c.coords, m)
	}
	var peers strings.Builder
	var join []string
	for _, m := range c.coords {
		fmt.Fprintf(&peers, "  - {id: %s, raft: %q, admin: %q}\n", m.id, m.raft, m.admin)
		join = append(join, strconv.Quote(m.gossip))
	}
	for _, m := range c.coords {
		text := fmt.Sprintf(`cluster_name: scale
node_id: %s
data_dir: %q
insecure: true
listen:
  admin: %q
  raft: %q
  metrics: %q
initial_cluster:
%sgossip:
  listen: %q
  join: [%s]
policy:
%srecovery:
  action: exec
  exec: {command: /bin/true}
log: {level: warn, format: json}
%s%s`, m.id, m.dir, m.admin, m.raft, m.metrics, peers.String(), m.gossip, strings.Join(join, ", "), policyYAML(policy), limitsYAML(brokers), slotYAML(slot))
		cfg := filepath.Join(dir, m.id+".yaml")
		if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
			return nil, err
		}
		logf, err := os.Create(filepath.Join(dir, m.id+".log"))
		if err != nil {
			return nil, err
		}
		m.cmd = exec.Command(bin, "server", "--config", cfg)
		m.cmd.Stdout, m.cmd.Stderr = logf, logf
		m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if os.Getenv("WALDEN_SCALE_PPROF") != "" {
			// A walden built with -tags walden_pprof serves its profiles
			// there.
			if m.pprof, err = freeAddr("127.0.0.1"); err != nil {
				return nil, err
			}
			m.cmd.Env = append(os.Environ(), "WALDEN_PPROF_ADDR="+m.pprof)
			fmt.Fprintf(os.Stderr, "%s: pprof at http://%s/debug/pprof/\n", m.id, m.pprof)
		}
		if err := m.cmd.Start(); err != nil {
			logf.Close()
			c.stop()
			return nil, fmt.Errorf("scale: start %s: %w", m.id, err)
		}
		m.exited = make(chan struct{})
		go func() { _ = m.cmd.Wait(); logf.Close(); close(m.exited) }()
		if m.conn, err = grpc.NewClient("passthrough:///"+m.admin, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			c.stop()
			return nil, err
		}
	}
	if err := c.waitReady(ctx, time.Minute); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// waitReady waits for a leader and the seeded policy.
func (c *cluster) waitReady(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if l, err := c.leader(ctx); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := waldenv1.NewBrokersClient(l.conn).GetPolicy(cctx, &waldenv1.GetPolicyRequest{})
			cancel()
			if err == nil {
				return nil
			}
		}
		for _, m := range c.coords {
			select {
			case <-m.exited:
				logPath := filepath.Join(c.dir, m.id+".log")
				if b, _ := os.ReadFile(logPath); bytes.Contains(b, []byte("address already in use")) {
					return fmt.Errorf("%w (%s)", errPortTaken, strings.TrimSpace(string(b)))
				}
				return fmt.Errorf("scale: coordinator %s exited; see %s", m.id, logPath)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("scale: no leader with a seeded policy within %v", d)
}

// leader returns the coordinator that leads now.
func (c *cluster) leader(ctx context.Context) (*coordinator, error) {
	for _, m := range c.coords {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := waldenv1.NewClusterClient(m.conn).Status(cctx, &waldenv1.StatusRequest{})
		cancel()
		if err != nil || st.GetLeaderId() == "" {
			continue
		}
		for _, l := range c.coords {
			if l.id == st.GetLeaderId() {
				return l, nil
			}
		}
	}
	return nil, fmt.Errorf("scale: no leader")
}

func (c *cluster) status(ctx context.Context, m *coordinator) (*waldenv1.StatusResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return waldenv1.NewClusterClient(m.conn).Status(cctx, &waldenv1.StatusRequest{})
}

// serializable marks a read to be answered by the member asked, at once.
func serializable(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "walden-consistency", "s")
}

// brokers reads the registry from m's own state.
func (c *cluster) brokers(ctx context.Context, m *coordinator) ([]*waldenv1.Broker, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := waldenv1.NewBrokersClient(m.conn).ListBrokers(serializable(cctx), &waldenv1.ListBrokersRequest{}, grpc.MaxCallRecvMsgSize(256<<20))
	if err != nil {
		return nil, err
	}
	return r.GetBrokers(), nil
}

func (c *cluster) broker(ctx context.Context, m *coordinator, id string) (*waldenv1.Broker, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := waldenv1.NewBrokersClient(m.conn).GetBroker(serializable(cctx), &waldenv1.GetBrokerRequest{BrokerId: id})
	if err != nil {
		return nil, err
	}
	return r.GetBroker(), nil
}

// goroutines reads go_goroutines from m's metrics endpoint.
func (c *cluster) goroutines(ctx context.Context, m *coordinator) int {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, _ := scrapeGauge(cctx, "http://"+m.metrics+"/metrics", "go_goroutines")
	return int(v)
}

// gossipAgents reads how many agents m's gossip pool has alive.
func (c *cluster) gossipAgents(ctx context.Context, m *coordinator) int {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, _ := scrapeGauge(cctx, "http://"+m.metrics+"/metrics", `walden_gossip_members{role="agent",state="alive"}`)
	return int(v)
}

// stop ends the coordinators (SIGTERM, then SIGKILL after 10 s).
func (c *cluster) stop() {
	var wg sync.WaitGroup
	for _, m := range c.coords {
		if m.conn != nil {
			m.conn.Close()
		}
		if m.cmd == nil || m.cmd.Process == nil || m.exited == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = m.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-m.exited:
			case <-time.After(10 * time.Second):
				_ = m.cmd.Process.Kill()
				<-m.exited
			}
		}()
	}
	wg.Wait()
}

// loadProcess is one load process and its pipes.
type loadProcess struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	mu      sync.Mutex
	replies chan reply
	exited  chan struct{}
	brokers []simBroker
}

// startLoad starts a load process (this binary with -load) hosting
// brokers, at nice value nice (through nice(1), so that every thread of
// the process has it from its start), with GOMAXPROCS procs (0: Go's
// default).
func startLoad(self string, nice, procs int, logPath string, cfg loadConfig) (*loadProcess, error) {
	cmd := exec.Command(self, "-load")
	if nice > 0 {
		cmd = exec.Command("nice", "-n", strconv.Itoa(nice), self, "-load")
	}
	if procs > 0 {
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(procs))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	lp := &loadProcess{cmd: cmd, in: in, replies: make(chan reply, 1024), exited: make(chan struct{}), brokers: cfg.Brokers}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r reply
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				lp.replies <- r
			}
		}
		_ = cmd.Wait()
		logf.Close()
		close(lp.exited)
		close(lp.replies)
	}()
	if err := lp.send(cfg); err != nil {
		lp.stop()
		return nil, err
	}
	return lp, nil
}

func (lp *loadProcess) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	_, err = lp.in.Write(append(b, '\n'))
	return err
}

// stop closes the load process's stdin (it stops every agent and exits),
// and kills it after 30 s.
func (lp *loadProcess) stop() {
	_ = lp.in.Close()
	select {
	case <-lp.exited:
	case <-time.After(30 * time.Second):
		_ = lp.cmd.Process.Kill()
		<-lp.exited
	}
}
