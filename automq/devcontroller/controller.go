package devcontroller

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
)

// Sentinel errors of the controller.
var (
	// ErrInvalidConfig: a Config field is unusable; the message names it.
	ErrInvalidConfig = errors.New("invalid development controller config")
	// ErrNoSuchVoter: a voter number outside 1..N.
	ErrNoSuchVoter = errors.New("no such voter")
	// ErrStarted: Start was called twice.
	ErrStarted = errors.New("controller already started")
	// ErrClosed: the controller was closed.
	ErrClosed = errors.New("controller closed")
)

// Config configures a development controller.
type Config struct {
	// ClusterID names the objects' key namespace (_kafka_<ClusterID>), as
	// the AutoMQ cluster id does. Required.
	ClusterID string
	// Streams are created CLOSED at offset 0 when the controller starts.
	Streams []int64
	// Nodes are registered for AutomqGetNodes.
	Nodes []NodeRegistration
	// TLS, when set, makes every listener TLS (the SSL or SASL_SSL
	// controller listener).
	TLS *tls.Config
	// SASL, when set, requires SASL authentication on every connection.
	SASL *SASLConfig
	// Faults, when set, holds the faults a test arms while the controller
	// runs.
	Faults *Faults
	// Logger receives the controller's log; nil discards it.
	Logger *slog.Logger
	// Now is the controller's clock (time.Now when nil): prepared objects
	// expire by it.
	Now func() time.Time
	// WriteTimeout bounds the writing of one response (10 s when 0).
	WriteTimeout time.Duration
}

// Validate checks the config and names the first unusable field.
func (c *Config) Validate() error {
	if c.ClusterID == "" || strings.Contains(c.ClusterID, "/") {
		return fmt.Errorf("devcontroller: cluster_id %q: a cluster id without '/' is required (it names the objects' key namespace): %w", c.ClusterID, ErrInvalidConfig)
	}
	seen := make(map[int64]bool, len(c.Streams))
	for _, id := range c.Streams {
		if id < 0 {
			return fmt.Errorf("devcontroller: streams: stream id %d is negative: %w", id, ErrInvalidConfig)
		}
		if seen[id] {
			return fmt.Errorf("devcontroller: streams: stream id %d is listed twice: %w", id, ErrInvalidConfig)
		}
		seen[id] = true
	}
	nodes := make(map[int32]bool, len(c.Nodes))
	for _, n := range c.Nodes {
		if n.NodeID < 0 {
			return fmt.Errorf("devcontroller: nodes: node id %d is negative: %w", n.NodeID, ErrInvalidConfig)
		}
		if nodes[n.NodeID] {
			return fmt.Errorf("devcontroller: nodes: node %d is listed twice: %w", n.NodeID, ErrInvalidConfig)
		}
		nodes[n.NodeID] = true
		if n.State != "" && !n.State.Valid() {
			return fmt.Errorf("devcontroller: nodes: node %d: state %q is not ACTIVE, FENCED, CONTROLLED_SHUTDOWN or UNKNOWN: %w", n.NodeID, n.State, ErrInvalidConfig)
		}
	}
	if c.WriteTimeout < 0 {
		return fmt.Errorf("devcontroller: write_timeout must not be negative: %w", ErrInvalidConfig)
	}
	return nil
}

// Controller is a development AutoMQ controller quorum: N voters, each on
// its own listener, sharing one State. One voter is active and applies
// requests; the others answer NOT_CONTROLLER as a standby KRaft controller
// does, so that clients walk the voter list. The active voter can move.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	now  func() time.Time
	sasl *saslAuthenticator

	mu       sync.Mutex
	state    *State
	active   int // 1..len(voters)
	voters   []*voter
	conns    map[net.Conn]struct{}
	requests map[requestKey]int
	started  bool
	closed   bool
	done     chan struct{}
	wg       sync.WaitGroup
}

// voter is one listener of the quorum.
type voter struct {
	id int
	ln net.Listener
}

// requestKey counts the answers by API and code.
type requestKey struct {
	api  string
	code Code
}

// New returns a controller with the configured streams and nodes. It
// listens once Start is given its listeners.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	st, err := NewState(cfg.ClusterID, cfg.Streams)
	if err != nil {
		return nil, err
	}
	for _, n := range cfg.Nodes {
		if _, err := st.RegisterNode(n); err != nil {
			return nil, err
		}
	}
	auth, err := newSASLAuthenticator(cfg.SASL)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:      cfg,
		log:      cfg.Logger,
		now:      cfg.Now,
		sasl:     auth,
		state:    st,
		conns:    make(map[net.Conn]struct{}),
		requests: make(map[requestKey]int),
		done:     make(chan struct{}),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.cfg.WriteTimeout == 0 {
		c.cfg.WriteTimeout = 10 * time.Second
	}
	return c, nil
}

// Start serves one voter on each listener (voter 1 on the first), voter 1
// active, and returns at once. The controller owns the listeners from now
// on: Close closes them.
func (c *Controller) Start(listeners ...net.Listener) error {
	if len(listeners) == 0 {
		return fmt.Errorf("devcontroller: start: no listener: %w", ErrInvalidConfig)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.started {
		return ErrStarted
	}
	c.started = true
	c.active = 1
	for i, ln := range listeners {
		if c.cfg.TLS != nil {
			ln = tls.NewListener(ln, c.cfg.TLS)
		}
		v := &voter{id: i + 1, ln: ln}
		c.voters = append(c.voters, v)
		c.wg.Add(1)
		go c.accept(v)
		c.log.Info("development AutoMQ controller voter listening", "voter", v.id, "addr", ln.Addr().String(),
			"tls", c.cfg.TLS != nil, "sasl", c.sasl != nil)
	}
	return nil
}

// Addrs returns the voters' addresses, voter 1 first: the
// controller.quorum.bootstrap.servers of this quorum.
func (c *Controller) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.voters))
	for i, v := range c.voters {
		out[i] = v.ln.Addr().String()
	}
	return out
}

// Active returns the active voter's number (1..N).
func (c *Controller) Active() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active
}

// SetActive makes voter id (1..N) the active controller: from its next
// request on, the others answer NOT_CONTROLLER. The state is shared, so
// nothing is lost.
func (c *Controller) SetActive(id int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id < 1 || id > len(c.voters) {
		return fmt.Errorf("there is no voter %d: the voters are 1 to %d: %w", id, len(c.voters), ErrNoSuchVoter)
	}
	if c.active != id {
		c.log.Info("active controller moves", "from", c.active, "to", id)
	}
	c.active = id
	return nil
}

// RegisterNode registers a node for AutomqGetNodes (see
// State.RegisterNode).
func (c *Controller) RegisterNode(r NodeRegistration) (Code, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.RegisterNode(r)
}

// SetNodeState changes a registered node's state as AutomqGetNodes
// reports it; false when the node is not registered.
func (c *Controller) SetNodeState(nodeID int32, state NodeState) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.SetNodeState(nodeID, state)
}

// View is the whole controller for inspection: its state, its voters and
// the answers it gave.
type View struct {
	Snapshot
	ActiveVoter int            `json:"active_voter"`
	Voters      []VoterView    `json:"voters"`
	Requests    []RequestCount `json:"requests"`
}

// VoterView is one voter.
type VoterView struct {
	Voter  int    `json:"voter"`
	Addr   string `json:"addr"`
	Active bool   `json:"active"`
}

// RequestCount counts the answers of one API with one code. OpenStreams and
// CloseStreams count each stream's answer.
type RequestCount struct {
	API   string `json:"api"`
	Code  string `json:"code"`
	Count int    `json:"count"`
}

// Snapshot returns a copy of the controller's state, after expiring the
// prepared objects whose deadline has passed.
func (c *Controller) Snapshot() View {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state.Expire(c.now())
	v := View{Snapshot: c.state.Snapshot(), ActiveVoter: c.active, Voters: []VoterView{}, Requests: []RequestCount{}}
	for _, vo := range c.voters {
		v.Voters = append(v.Voters, VoterView{Voter: vo.id, Addr: vo.ln.Addr().String(), Active: vo.id == c.active})
	}
	for k, n := range c.requests {
		v.Requests = append(v.Requests, RequestCount{API: k.api, Code: k.code.String(), Count: n})
	}
	slices.SortFunc(v.Requests, func(a, b RequestCount) int {
		return cmp.Or(strings.Compare(a.API, b.API), strings.Compare(a.Code, b.Code))
	})
	return v
}

// Close stops every voter: it closes the listeners and the connections and
// waits for their goroutines.
func (c *Controller) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	for _, v := range c.voters {
		_ = v.ln.Close()
	}
	for conn := range c.conns {
		_ = conn.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
	return nil
}

// accept serves one voter's listener until it is closed.
func (c *Controller) accept(v *voter) {
	defer c.wg.Done()
	for {
		conn, err := v.ln.Accept()
		if err != nil {
			select {
			case <-c.done:
			default:
				c.log.Error("voter stops accepting connections", "voter", v.id, "err", err)
			}
			return
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			_ = conn.Close()
			return
		}
		c.conns[conn] = struct{}{}
		c.wg.Add(1)
		c.mu.Unlock()
		go func() {
			defer c.wg.Done()
			defer func() {
				c.mu.Lock()
				delete(c.conns, conn)
				c.mu.Unlock()
				_ = conn.Close()
			}()
			c.serveConn(v, conn)
		}()
	}
}
