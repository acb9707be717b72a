package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"walden/authz"
	"walden/automq/devcontroller"
	"walden/automq/metaview"
)

// Kinds of broker a cluster runs (Options.Broker).
const (
	// BrokerWalden is walden's reference broker with its embedded agent.
	BrokerWalden = "walden"
	// BrokerAutomq is the reference broker in mode automq, an AutoMQ 1.x
	// broker, started by a walden agent in watchdog mode; the cluster adds
	// the development AutoMQ controller and the coordinators recover with
	// recovery.action automq.
	BrokerAutomq = "automq"
)

// AutomqClusterID is the AutoMQ cluster id of an automq cluster: its
// objects' keys start with _kafka_<id>/.
const AutomqClusterID = "dev"

// Automq is what a cluster of AutoMQ-mode brokers adds: the development
// AutoMQ controller, its voters and its metadata view.
type Automq struct {
	// Controller is the `walden automq dev-controller` child ("amq").
	Controller *Proc
	// Voters are the controller's listeners (the controller quorum).
	Voters []string
	// HTTP is the address of the controller's metadata view.
	HTTP string
}

// IsAutomq reports whether the cluster runs AutoMQ-mode brokers.
func (c *Cluster) IsAutomq() bool { return c.Opts.Broker == BrokerAutomq }

// MetadataURL is the base URL of the AutoMQ controller's metadata view
// ("" for a cluster of walden brokers).
func (c *Cluster) MetadataURL() string {
	if c.Automq == nil {
		return ""
	}
	return "http://" + c.Automq.HTTP
}

// View is a client of the AutoMQ controller's metadata view (through
// Options.Dial when set).
func (c *Cluster) View() *metaview.Client {
	return metaview.NewClient(c.MetadataURL(), c.HTTPClient(5*time.Second))
}

// NodeOf is the AutoMQ node id of broker p: its number (b1 is node 1).
func NodeOf(p *Proc) int32 {
	var n int32
	if _, err := fmt.Sscanf(p.Name, "b%d", &n); err != nil {
		return -1
	}
	return n
}

// BrokerOfNode names the broker of AutoMQ node n ("" when none).
func (c *Cluster) BrokerOfNode(n int32) string {
	for _, b := range c.Brokers {
		if NodeOf(b) == n {
			return b.Name
		}
	}
	return ""
}

// BrokerAddrs are the brokers' data API addresses.
func (c *Cluster) BrokerAddrs() []string {
	out := make([]string, len(c.Brokers))
	for i, b := range c.Brokers {
		out[i] = b.Listen
	}
	return out
}

// layoutAutomq picks the development controller's addresses.
func (c *Cluster) layoutAutomq(addrs func(proc string, roles ...any) error) error {
	a := &Automq{Voters: make([]string, 3)}
	if err := addrs("amq", "voter1", &a.Voters[0], "voter2", &a.Voters[1], "voter3", &a.Voters[2], "http", &a.HTTP); err != nil {
		return err
	}
	var streams []string
	for _, id := range c.allStreamsWithBacklog() {
		streams = append(streams, fmt.Sprint(id))
	}
	a.Controller = &Proc{Name: "amq", Log: filepath.Join(c.Opts.Dir, "amq.log"), bin: c.Opts.Bin, command: c.Opts.Command,
		args: []string{"automq", "dev-controller", "--cluster-id", AutomqClusterID, "--listen", strings.Join(a.Voters, ","),
			"--voters", "3", "--streams", strings.Join(streams, ","), "--http", a.HTTP, "-o", "json"}}
	c.Automq = a
	return nil
}

// automqRecovery is the coordinators' recovery section for AutoMQ's
// controller: the target automq, the controller's voters, the cluster's
// bucket (the coordinators' own s3 section).
func (c *Cluster) automqRecovery() []string {
	return append([]string{
		"action: automq",
		fmt.Sprintf("automq: {cluster_id: %q, controller: {voters: %s, request_timeout: 2s}}", AutomqClusterID, yamlList(c.Automq.Voters)),
	}, c.Opts.Recovery...)
}

// takeovers is what broker p takes over from each other broker: their
// streams dealt out round-robin over the other brokers, so that every
// stream of a dead broker has one new leader.
func (c *Cluster) takeovers(p *Proc) string {
	var out strings.Builder
	for _, o := range c.Brokers {
		if o == p {
			continue
		}
		var others []*Proc
		for _, b := range c.Brokers {
			if b != o {
				others = append(others, b)
			}
		}
		streams := slices.Clone(o.Streams)
		if o.BacklogStream != 0 {
			streams = append(streams, o.BacklogStream)
		}
		var mine []string
		for i, id := range streams {
			if others[i%len(others)] == p {
				mine = append(mine, fmt.Sprint(id))
			}
		}
		if len(mine) > 0 {
			fmt.Fprintf(&out, "    - {node_id: %d, addr: %q, streams: [%s]}\n", NodeOf(o), o.Listen, strings.Join(mine, ", "))
		}
	}
	if out.Len() == 0 {
		return ""
	}
	return "  takeover:\n" + out.String()
}

// writeAutomqBroker writes broker p's two configs: the AutoMQ-mode broker's
// (p.BrokerConfig) and its agent's (p.Config: watchdog on, the broker as
// its child, the AutoMQ node id), and makes the agent the process p runs.
func (c *Cluster) writeAutomqBroker(p *Proc, gossipJoin []string) error {
	o := c.Opts
	p.Config = filepath.Join(o.Dir, p.Name+"-agent.yaml")
	p.BrokerConfig = filepath.Join(o.Dir, p.Name+".yaml")
	p.Log = filepath.Join(o.Dir, p.Name+".log")
	p.args = []string{"agent", "--config", p.Config}
	id := authz.Identity{Name: p.Name, Role: authz.RoleBroker, BrokerID: p.Name}
	tlsText, err := c.tlsYAML(id)
	if err != nil {
		return err
	}
	streams := make([]string, 0, len(p.Streams)+1)
	for _, s := range p.Streams {
		streams = append(streams, fmt.Sprint(s))
	}
	if p.BacklogStream != 0 {
		streams = append(streams, fmt.Sprint(p.BacklogStream))
	}
	upload := fmt.Sprintf("upload_interval: %s\n", o.UploadInterval)
	if o.UploadBytes > 0 {
		upload += fmt.Sprintf("upload_bytes: %d\n", o.UploadBytes)
	}
	walPath := filepath.Join(o.Dir, p.Name+".wal")
	broker := fmt.Sprintf(`broker_id: %s
mode: automq
listen: %q
wal: {path: %q, capacity: %d}
%sstreams: [%s]
%sautomq:
  node_id: %d
  cluster_id: %q
  controller: {voters: %s, request_timeout: 2s}
  metadata_url: %q
  takeover_after: %s
  open_max_backoff: 200ms
%s%slog: {level: %s, format: json}
`, p.Name, p.Listen, walPath, o.WALCapacity, c.s3YAML(), strings.Join(streams, ", "), upload, NodeOf(p), AutomqClusterID,
		yamlList(c.Automq.Voters), c.MetadataURL(), o.TakeoverAfter, c.takeovers(p), tlsText, o.LogLevel)
	if err := os.WriteFile(p.BrokerConfig, []byte(broker), 0o644); err != nil {
		return err
	}
	agent := fmt.Sprintf(`broker_id: %s
cluster_name: %s
coordinators: %s
gossip: {listen: %q, join: %s}
listen: %q
broker_addr: %q
wal: {path: %q}
lease_safety_margin: %s
broker:
  command: [%q, "broker", "--config", %q]
  kafka_addr: %q
watchdog: {enabled: true, kill_margin: %s}
automq: {node_id: %d}
%slog: {level: %s, format: json}
`, p.Name, o.ClusterName, yamlList(c.AdminAddrs()), p.Gossip, yamlList(gossipJoin), p.AgentListen, p.Listen, walPath,
		o.LeaseSafetyMargin, o.Bin, p.BrokerConfig, p.Listen, o.KillMargin, NodeOf(p), tlsText, o.LogLevel)
	return os.WriteFile(p.Config, []byte(agent), 0o644)
}

// startAutomq starts the development controller and waits for its view.
func (c *Cluster) startAutomq(ctx context.Context, timeout time.Duration) error {
	p := c.Automq.Controller
	if err := p.Start(); err != nil {
		return err
	}
	return waitHTTP(ctx, c.HTTPClient(time.Second), c.MetadataURL()+"/healthz", p, timeout)
}

// waitAutomqStreams polls the controller's view until every configured
// stream is OPENED (by any node).
func (c *Cluster) waitAutomqStreams(ctx context.Context, timeout time.Duration) error {
	want := c.allStreamsWithBacklog()
	view := c.View()
	return Poll(ctx, timeout, "every stream opened at the AutoMQ controller", func() error {
		ss, err := view.Streams(ctx)
		if err != nil {
			return err
		}
		open := map[uint64]bool{}
		for _, s := range ss {
			if s.State == devcontroller.StreamOpened {
				open[uint64(s.StreamID)] = true
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

// AgentBroker is what an agent says of the broker it watches (GET
// /v1/broker).
type AgentBroker struct {
	State  string `json:"state"`
	PID    int    `json:"pid"`
	Reason string `json:"reason"`
	Starts int    `json:"starts"`
	// SinceUnixMS is when the broker entered State.
	SinceUnixMS int64 `json:"since_unix_ms"`
}

// AgentBroker asks broker p's agent about the broker process it watches.
func (c *Cluster) AgentBroker(ctx context.Context, p *Proc) (AgentBroker, error) {
	var out AgentBroker
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.AgentListen+"/v1/broker", nil)
	if err != nil {
		return out, err
	}
	resp, err := c.HTTPClient(2 * time.Second).Do(req)
	if err != nil {
		return out, fmt.Errorf("agent of %s: %w", p.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("agent of %s: GET /v1/broker: %s", p.Name, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("agent of %s: GET /v1/broker: %w", p.Name, err)
	}
	return out, nil
}

// KillBroker sends SIGKILL to the broker process that p's agent watches
// (the agent itself lives on) and waits until the agent sees it dead. It
// returns the pid it killed.
func (c *Cluster) KillBroker(ctx context.Context, p *Proc) (int, error) {
	st, err := c.AgentBroker(ctx, p)
	if err != nil {
		return 0, err
	}
	if st.PID <= 0 || st.State != "up" && st.State != "starting" {
		return 0, fmt.Errorf("kill the broker of %s: its agent reports it %s (pid %d)", p.Name, st.State, st.PID)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill the broker of %s (pid %d): %w", p.Name, st.PID, err)
	}
	err = Poll(ctx, 10*time.Second, "the agent of "+p.Name+" seeing its broker dead", func() error {
		now, err := c.AgentBroker(ctx, p)
		if err != nil {
			return err
		}
		if now.PID == st.PID && (now.State == "up" || now.State == "starting") {
			return errors.New("still up")
		}
		return nil
	})
	return st.PID, err
}
