package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof/ on http.DefaultServeMux (WALDEN_SCALE_PPROF)
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"walden/agent"
	"walden/gossip"
	"walden/httplimit"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// The load process: it hosts many lightweight simulated agents, each with
// what a coordinator sees of a real one — its own address (an IP of
// 127.0.0.0/8 of its own), a registration, the probe endpoint (GET /healthz
// through the agent's own HTTP limits), its lease renewed with every voter
// on connections of its own (every lease_ttl/3, attempts bounded by /6,
// retries after agent.RenewalBackoff (or agent.QuietRetry), as package agent does; with package
// agent's Renewer over a connection of frames or one gRPC stream per
// coordinator, or with one call each as agents before streamed renewals
// did), and, for the brokers asked to,
// a memberlist gossip member. What a real agent also does for its broker
// (the local lease endpoint's other routes, epoch hooks) is left out: no
// coordinator sees it.
//
// It reads commands as JSON lines on stdin and answers JSON lines on
// stdout; it exits when stdin closes.

// loadConfig is the first line a load process reads.
type loadConfig struct {
	ClusterName  string      `json:"cluster_name"`
	Coordinators []string    `json:"coordinators"` // admin addresses
	GossipJoin   []string    `json:"gossip_join"`
	Brokers      []simBroker `json:"brokers"`
	// RegisterRate bounds registrations per second at start.
	RegisterRate int `json:"register_rate"`
	// JoinRate bounds gossip joins per second at start.
	JoinRate int `json:"join_rate"`
	// Margin is the agents' lease_safety_margin.
	Margin time.Duration `json:"margin"`
	// Transport is how the agents renew: "frames" (one connection of
	// frames per coordinator, as package agent does by default),
	// "frames-direct" and "frames-epoll" (the same on the wire, renewed by
	// the load generator's own loops: directRenewer, renewLoop), "stream"
	// (one gRPC stream per coordinator, as package agent does with
	// renewals.transport: stream) or "unary" (one RenewLease call per
	// renewal, as agents before streamed renewals did).
	Transport string `json:"transport"`
}

type simBroker struct {
	ID     string `json:"id"`
	IP     string `json:"ip"`
	Gossip bool   `json:"gossip"`
}

// command is a line the controller sends.
type command struct {
	Op  string   `json:"op"` // register, kill, revive, stats
	IDs []string `json:"ids,omitempty"`
}

// reply is a line a load process writes.
type reply struct {
	Op string `json:"op"` // joined, killed, stats, error
	// killed: the broker, its epoch and when it stopped answering.
	ID       string     `json:"id,omitempty"`
	Epoch    uint64     `json:"epoch,omitempty"`
	AtUnixNs int64      `json:"at_unix_ns,omitempty"`
	Stats    *loadStats `json:"stats,omitempty"`
	Error    string     `json:"error,omitempty"`
}

// loadStats are a load process's counters since it started.
type loadStats struct {
	Agents, Registered, Valid int
	Registrations             uint64
	// Per coordinator admin address.
	Granted map[string]uint64
	// Refused counts refusals by reason (gRPC code or fencing reason), over
	// every coordinator.
	Refused map[string]uint64
	// Failed counts renewal attempts with no answer (timeout, connection).
	Failed uint64
	// LatencyUs is a histogram of granted renewals' round trips:
	// bucket i counts those under latencyBuckets[i] µs.
	Latency [len(latencyBuckets) + 1]uint64
	// Lapses counts the times a live agent's lease went from valid to not
	// valid.
	Lapses uint64
	// Probes counts the GET /healthz answered.
	Probes uint64
	// GossipMembers is the number of agents in the gossip pool.
	GossipMembers int
}

var latencyBuckets = [...]int64{1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000}

// loadProc is the state of a load process.
type loadProc struct {
	cfg loadConfig
	out *json.Encoder
	// outMu serializes writes to out.
	outMu sync.Mutex

	mu     sync.Mutex
	agents map[string]*simAgent

	// joins bounds the gossip joins in flight.
	joins chan struct{}

	registrations, failed, lapses, probes atomic.Uint64
	granted                               []atomic.Uint64 // by coordinator index
	// loop renews every agent's lease with transport frames-epoll (nil
	// with the others).
	loop      *renewLoop
	latency   [len(latencyBuckets) + 1]atomic.Uint64
	refusedMu sync.Mutex
	refused   map[string]uint64
}

// runLoad is the body of a load process.
func runLoad(in io.Reader, out io.Writer) error {
	log.SetOutput(io.Discard) // grpc and net/http log through the standard logger
	br := bufio.NewReader(in)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("load: read config: %w", err)
	}
	var cfg loadConfig
	if err := json.Unmarshal(line, &cfg); err != nil {
		return fmt.Errorf("load: config: %w", err)
	}
	p := &loadProc{cfg: cfg, out: json.NewEncoder(out), agents: map[string]*simAgent{}, joins: make(chan struct{}, 4),
		granted: make([]atomic.Uint64, len(cfg.Coordinators)), refused: map[string]uint64{}}
	if cfg.Transport == "frames-epoll" {
		if p.loop, err = newRenewLoop(p); err != nil {
			return err
		}
		go p.loop.run()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Start every agent's endpoint, make the gossip members join at the
	// join rate and say joined; register on "register", at the
	// registration rate. Joining first keeps the join storm (every member
	// hears of every new one from several others) off the lease renewals:
	// on a machine that hosts a thousand members, both at once starved the
	// renewals and churned the fleet before it ever held its leases.
	go func() {
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Second / time.Duration(max(cfg.JoinRate, 1)))
		defer tick.Stop()
		for _, b := range cfg.Brokers {
			a, err := p.start(ctx, b)
			if err != nil {
				p.send(reply{Op: "error", Error: err.Error()})
				continue
			}
			p.mu.Lock()
			p.agents[b.ID] = a
			p.mu.Unlock()
			if !b.Gossip {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() { defer wg.Done(); a.joinGossip(ctx) }()
		}
		wg.Wait()
		p.send(reply{Op: "joined"})
	}()
	registerAll := func() {
		p.mu.Lock()
		agents := make([]*simAgent, 0, len(cfg.Brokers))
		for _, b := range cfg.Brokers {
			if a := p.agents[b.ID]; a != nil {
				agents = append(agents, a)
			}
		}
		p.mu.Unlock()
		tick := time.NewTicker(time.Second / time.Duration(max(cfg.RegisterRate, 1)))
		defer tick.Stop()
		for _, a := range agents {
			a.run()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}

	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			p.stopAll()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		var c command
		if err := json.Unmarshal(line, &c); err != nil {
			p.send(reply{Op: "error", Error: err.Error()})
			continue
		}
		switch c.Op {
		case "register":
			go registerAll()
		case "kill":
			for _, id := range c.IDs {
				go p.kill(id)
			}
		case "revive":
			for _, id := range c.IDs {
				go p.revive(ctx, id)
			}
		case "stats":
			s := p.stats()
			p.send(reply{Op: "stats", Stats: &s})
		default:
			p.send(reply{Op: "error", Error: "unknown op " + c.Op})
		}
	}
}

func (p *loadProc) send(r reply) {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	_ = p.out.Encode(r)
}

func (p *loadProc) stats() loadStats {
	s := loadStats{Granted: map[string]uint64{}, Refused: map[string]uint64{}}
	p.mu.Lock()
	agents := make([]*simAgent, 0, len(p.agents))
	for _, a := range p.agents {
		agents = append(agents, a)
	}
	p.mu.Unlock()
	for _, a := range agents {
		s.Agents++
		ok, reg := a.valid()
		if ok {
			s.Valid++
		}
		if reg {
			s.Registered++
		}
		a.mu.Lock()
		if a.pool != nil {
			s.GossipMembers++
		}
		a.mu.Unlock()
	}
	s.Registrations = p.registrations.Load()
	for i, addr := range p.cfg.Coordinators {
		s.Granted[addr] = p.granted[i].Load()
	}
	p.refusedMu.Lock()
	for k, v := range p.refused {
		s.Refused[k] = v
	}
	p.refusedMu.Unlock()
	s.Failed, s.Lapses, s.Probes = p.failed.Load(), p.lapses.Load(), p.probes.Load()
	for i := range s.Latency {
		s.Latency[i] = p.latency[i].Load()
	}
	return s
}

func (p *loadProc) stopAll() {
	p.mu.Lock()
	agents := make([]*simAgent, 0, len(p.agents))
	for _, a := range p.agents {
		agents = append(agents, a)
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); a.stop() }()
	}
	wg.Wait()
}

func (p *loadProc) kill(id string) {
	p.mu.Lock()
	a := p.agents[id]
	p.mu.Unlock()
	if a == nil {
		p.send(reply{Op: "error", Error: "no agent " + id})
		return
	}
	epoch, at := a.stop()
	p.send(reply{Op: "killed", ID: id, Epoch: epoch, AtUnixNs: at.UnixNano()})
}

// revive starts a killed broker's agent again (it registers again and gets
// a new epoch once its recovery finished).
func (p *loadProc) revive(ctx context.Context, id string) {
	var b simBroker
	for _, x := range p.cfg.Brokers {
		if x.ID == id {
			b = x
		}
	}
	a, err := p.start(ctx, b)
	if err != nil {
		p.send(reply{Op: "error", Error: err.Error()})
		return
	}
	p.mu.Lock()
	p.agents[id] = a
	p.mu.Unlock()
	a.joinGossip(a.ctx)
	a.run()
}

// simAgent is one lightweight agent.
type simAgent struct {
	p     *loadProc
	b     simBroker
	addr  string
	srv   *http.Server
	conns []*grpc.ClientConn // by coordinator index
	// dial opens the agent's connections of frames from its own address.
	dial   func(ctx context.Context, addr string) (net.Conn, error)
	pool   *gossip.Pool
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	holder     *lease.Holder
	epoch      uint64
	registered bool
	wasValid   bool
	stopped    bool
}

// start binds the agent's endpoint on its IP and makes its connections;
// joinGossip and run make it a gossip member and register it.
func (p *loadProc) start(ctx context.Context, b simBroker) (*simAgent, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(b.IP, "0"))
	if err != nil {
		return nil, fmt.Errorf("load: agent %s: listen: %w", b.ID, err)
	}
	a := &simAgent{p: p, b: b, addr: ln.Addr().String(), holder: lease.NewHolder(p.cfg.Margin)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		p.probes.Add(1)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	lim := agent.DefaultHTTPLimits
	a.srv = httplimit.Server(mux, lim, log.New(io.Discard, "", 0))
	go func() { _ = a.srv.Serve(httplimit.Listener(ln, lim)) }()

	local := &net.TCPAddr{IP: net.ParseIP(b.IP)}
	dialer := &net.Dialer{LocalAddr: local, Timeout: 2 * time.Second}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		}),
		grpc.WithReadBufferSize(4 << 10), grpc.WithWriteBufferSize(4 << 10), grpc.WithSharedWriteBuffer(true)}
	a.dial = func(ctx context.Context, addr string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", addr) }
	if p.cfg.Transport != "unary" {
		// As package agent dials: a fixed window (no bandwidth probe), and
		// a connection that closes once idle, as the registration's does
		// when the renewals go over frames (a stream keeps its own open).
		opts = append(opts, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
			grpc.WithIdleTimeout(agent.DefaultCallIdleTimeout))
	}
	for _, c := range p.cfg.Coordinators {
		conn, err := grpc.NewClient("passthrough:///"+c, opts...)
		if err != nil {
			a.closeConns()
			_ = a.srv.Close()
			return nil, fmt.Errorf("load: agent %s: %w", b.ID, err)
		}
		a.conns = append(a.conns, conn)
	}
	a.ctx, a.cancel = context.WithCancel(ctx)
	return a, nil
}

// run registers and renews in the background.
func (a *simAgent) run() {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.loop(a.ctx)
	}()
}

// joinGossip makes the agent a member of the gossip pool, as the agent
// package does, if it is one of the gossip members. At most a few join at
// once: a join exchanges the whole pool's state with a member.
func (a *simAgent) joinGossip(ctx context.Context) {
	if !a.b.Gossip {
		return
	}
	select {
	case a.p.joins <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-a.p.joins }()
	g := gossip.DefaultConfig()
	g.ClusterName, g.NodeName = a.p.cfg.ClusterName, "agent/"+a.b.ID
	g.Join = a.p.cfg.GossipJoin
	g.Meta = gossip.Meta{Role: gossip.RoleAgent, ID: a.b.ID, AgentAddr: a.addr}
	g.Logger = slog.New(slog.DiscardHandler)
	// Hundreds of members share this process's CPU, where a real agent has
	// its host's: at walden's defaults the load processes spent their time
	// in garbage (a fresh LZW table per packet sent, a 64 KiB buffer per
	// packet received), their starved members missed probes, were
	// suspected and declared dead by the hundred, and the pool never
	// settled. The simulated agents therefore send uncompressed (the
	// coordinators read both) and probe, gossip and sync at a fifth of the
	// pace, with a longer timeout and suspicion. The coordinators keep
	// walden's defaults: they hold the same thousand-member pool, probe
	// it and are probed by it as before (a coordinator is probed about
	// once per second in all by the agents at the default pace, 0.2 times
	// at this one).
	//
	// Their sockets are bound here and handed to the pool (Config.Listener)
	// rather than bound by memberlist's own transport, which reads every
	// packet into a fresh 64 KiB buffer: at 500 members that was three
	// fifths of all the bytes this process allocated, and memberlist's
	// handoff queues kept a whole buffer alive for every gossip message
	// they held. The Listener's transport reads into one buffer and hands
	// over a copy of each packet's own size.
	l, err := gossip.Listen(net.JoinHostPort(a.b.IP, "0"))
	if err != nil {
		a.p.send(reply{Op: "error", Error: fmt.Sprintf("agent %s: gossip: %v", a.b.ID, err)})
		return
	}
	g.Listener = l
	g.Compression = false
	g.ProbeInterval, g.ProbeTimeout = 5*time.Second, 3*time.Second
	g.SuspicionMult = 8
	g.GossipInterval, g.RetransmitMult = time.Second, 2
	g.PushPullInterval = 2 * time.Minute
	pool, err := gossip.Start(g)
	if err != nil {
		a.p.send(reply{Op: "error", Error: fmt.Sprintf("agent %s: gossip: %v", a.b.ID, err)})
		return
	}
	go func() {
		for range pool.Events() {
		}
	}()
	a.mu.Lock()
	stopped := a.stopped || ctx.Err() != nil
	if !stopped {
		a.pool = pool
	}
	a.mu.Unlock()
	if stopped {
		_ = pool.Shutdown()
	}
}

func (a *simAgent) closeConns() {
	for _, c := range a.conns {
		_ = c.Close()
	}
}

// stop makes the agent disappear as a killed process would: its endpoint,
// its connections and its gossip member go at once, without leaving. It
// returns the epoch it held and when it stopped answering.
func (a *simAgent) stop() (uint64, time.Time) {
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return a.epoch, time.Time{}
	}
	a.stopped = true
	epoch := a.epoch
	a.mu.Unlock()
	at := time.Now()
	_ = a.srv.Close()
	a.cancel()
	a.closeConns()
	a.wg.Wait()
	a.mu.Lock()
	pool := a.pool
	a.mu.Unlock()
	if pool != nil {
		_ = pool.Shutdown()
	}
	return epoch, at
}

// valid reports whether the lease is valid now, and whether the agent is
// registered.
func (a *simAgent) valid() (bool, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped || !a.registered {
		return false, a.registered
	}
	ok, _ := a.holder.Valid(lease.BootClock.Now())
	return ok, true
}

// noteValidity counts a live agent's lease going from valid to not valid.
// It returns the boot clock's reading it checked at.
func (a *simAgent) noteValidity() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := lease.BootClock.Now()
	a.noteValidityLocked(now)
	return now
}

// noteValidityLocked is noteValidity at the boot clock's reading now, with
// a.mu held.
func (a *simAgent) noteValidityLocked(now time.Duration) {
	if a.stopped || !a.registered {
		return
	}
	ok, _ := a.holder.Valid(now)
	if a.wasValid && !ok {
		a.p.lapses.Add(1)
	}
	a.wasValid = ok
}

// loop registers, renews with every coordinator until the epoch is
// refused, and registers again.
func (a *simAgent) loop(ctx context.Context) {
	for ctx.Err() == nil {
		epoch, ttl, ok := a.register(ctx)
		if !ok {
			return
		}
		a.renew(ctx, epoch, ttl)
	}
}

func (a *simAgent) register(ctx context.Context) (uint64, time.Duration, bool) {
	req := &waldenv1.RegisterRequest{
		ClusterName: a.p.cfg.ClusterName, BrokerId: a.b.ID, AgentAddr: a.addr,
		Wal: &waldenv1.WalLocation{VolumeId: "vol-" + a.b.ID, Path: "/nonexistent/" + a.b.ID + ".wal"},
	}
	if a.b.Gossip {
		req.GossipName = "agent/" + a.b.ID
	}
	first := rand.IntN(len(a.conns))
	for i := first; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := waldenv1.NewAgentClient(a.conns[i%len(a.conns)]).Register(cctx, req)
		cancel()
		if ctx.Err() != nil {
			return 0, 0, false
		}
		if err == nil && resp.GetLeaseTtlMs() > 0 {
			a.p.registrations.Add(1)
			a.mu.Lock()
			a.epoch, a.registered, a.wasValid = resp.GetEpoch(), true, false
			a.holder.SetEpoch(resp.GetEpoch())
			a.holder.Revoke()
			a.mu.Unlock()
			return resp.GetEpoch(), time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond, true
		}
		select {
		case <-ctx.Done():
			return 0, 0, false
		case <-time.After(agent.Backoff(i-first+1, 50*time.Millisecond, 2*time.Second)):
		}
	}
}

// renew renews with every coordinator in parallel until one refuses the
// epoch for good.
func (a *simAgent) renew(ctx context.Context, epoch uint64, ttl time.Duration) {
	if a.p.loop != nil {
		a.p.loop.renew(ctx, a, epoch, ttl)
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range a.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if a.renewWith(ctx, i, epoch, ttl) {
				cancel()
			}
		}()
	}
	wg.Wait()
}

// renewWith renews with coordinator i as package agent does (over a
// connection of frames or a gRPC stream with agent.Renewer, or with one
// call each as agents before them did); it reports whether the epoch was
// refused for good.
func (a *simAgent) renewWith(ctx context.Context, i int, epoch uint64, ttl time.Duration) bool {
	req := &waldenv1.RenewLeaseRequest{BrokerId: a.b.ID, Epoch: epoch}
	cl := waldenv1.NewAgentClient(a.conns[i])
	renew := func(ctx context.Context, perTry time.Duration) (*waldenv1.RenewLeaseResponse, error) {
		cctx, cancel := context.WithTimeout(ctx, perTry)
		defer cancel()
		return cl.RenewLease(cctx, req)
	}
	switch t := a.p.cfg.Transport; t {
	case "frames-direct":
		d := &directRenewer{addr: a.p.cfg.Coordinators[i], dial: a.dial}
		defer d.Close()
		renew = func(ctx context.Context, perTry time.Duration) (*waldenv1.RenewLeaseResponse, error) {
			return d.Renew(ctx, req, perTry)
		}
	case "stream", "frames":
		// Frames pinned, without fallback: a coordinator that does not
		// serve them fails the renewals (Unimplemented), they are not
		// measured over the stream. The stream falls back to calls, as
		// package agent's does.
		r := agent.NewRenewer(agent.RenewerOptions{Conn: func() (*grpc.ClientConn, error) { return a.conns[i], nil },
			Addr: a.p.cfg.Coordinators[i], Dial: a.dial, Transport: t})
		defer r.Close()
		renew = func(ctx context.Context, perTry time.Duration) (*waldenv1.RenewLeaseResponse, error) {
			return r.Renew(ctx, req, perTry)
		}
	}
	// Start at a random point of the period: agents that start together
	// do not renew in lock-step.
	select {
	case <-ctx.Done():
		return false
	case <-time.After(rand.N(ttl / 3)):
	}
	failures := 0
	for {
		perTry := max(ttl/6, 50*time.Millisecond)
		sent := lease.BootClock.Now()
		start := time.Now()
		resp, err := renew(ctx, perTry)
		if ctx.Err() != nil {
			return false
		}
		var wait time.Duration
		var renewIn time.Duration // after a grant: the renewal slot the coordinator asked for (renew_in_us)
		switch reason := string(rpcerr.Reason(err)); {
		case err == nil:
			a.p.granted[i].Add(1)
			a.p.latency[bucket(time.Since(start))].Add(1)
			if g := time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond; g > 0 {
				ttl = g
			}
			v := lease.Voters{Index: resp.GetConfIndex()}
			for _, m := range resp.GetVoters() {
				v.IDs = append(v.IDs, m.GetId())
				v.Incarnations = append(v.Incarnations, m.GetIncarnation())
			}
			a.mu.Lock()
			a.holder.Granted(lease.Grant{Coordinator: resp.GetCoordinatorId(), Epoch: epoch, Sent: sent, TTL: ttl}, v)
			a.mu.Unlock()
			failures = 0
			renewIn = time.Duration(resp.GetRenewInUs()) * time.Microsecond
		case refusedForGood(reason):
			a.p.refuse(reason)
			a.mu.Lock()
			a.holder.Revoke()
			a.wasValid = false
			a.mu.Unlock()
			return true
		default:
			failures++
			wait = a.p.failure(err, failures, ttl)
		}
		// One reading of the boot clock, taken for the validity check,
		// times the next renewal too: a reading is a system call, and the
		// load side makes thousands a second.
		now := a.noteValidity()
		if err == nil {
			wait = lease.NextRenewal(ttl, now-sent, renewIn)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(max(wait, time.Millisecond)):
		}
	}
}

// refusedForGood reports whether a refusal's reason ends the epoch: the
// agent registers again.
func refusedForGood(reason string) bool {
	switch refusal.Reason(reason) {
	case refusal.NodeFenced, refusal.EpochExpired, refusal.UnknownNode:
		return true
	}
	return false
}

// failure counts a renewal attempt that got no grant, err, as a refusal
// (by reason or gRPC code) or a failure (no answer, a connection's), and
// returns how long to wait before the next: after the failures-th in a row,
// as package agent waits.
func (p *loadProc) failure(err error, failures int, ttl time.Duration) time.Duration {
	reason := string(rpcerr.Reason(err))
	if reason == "" {
		if s, ok := status.FromError(err); ok && s.Code() != codes.DeadlineExceeded && s.Code() != codes.Unavailable {
			reason = s.Code().String()
		} else if ok && s.Code() == codes.Unavailable && s.Message() != "" && !isTransport(s.Message()) {
			reason = "Unavailable"
		}
	}
	if reason != "" {
		p.refuse(reason)
	} else {
		p.failed.Add(1)
	}
	if q, ok := agent.QuietRetry(err, ttl); ok {
		return q
	}
	return agent.RenewalBackoff(failures, ttl)
}

// isTransport tells a connection failure from a coordinator's Unavailable
// answer (which refuses the renewal).
func isTransport(msg string) bool {
	for _, p := range []string{"connection error", "transport", "error reading", "connection refused", "EOF"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func (p *loadProc) refuse(reason string) {
	p.refusedMu.Lock()
	p.refused[reason]++
	p.refusedMu.Unlock()
}

func bucket(d time.Duration) int {
	us := d.Microseconds()
	for i, b := range latencyBuckets {
		if us < b {
			return i
		}
	}
	return len(latencyBuckets)
}

// loadMain runs a load process on stdin/stdout.
func loadMain() {
	// WALDEN_SCALE_PROFILE names a file that receives the load process's
	// CPU profile (to tell the load generator's own costs apart).
	if path := os.Getenv("WALDEN_SCALE_PROFILE"); path != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", path, os.Getpid()))
		if err == nil {
			_ = pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	// WALDEN_SCALE_PPROF makes it serve Go's profiles too, on an address
	// it writes to its log (load-N.log in the run's directory).
	if os.Getenv("WALDEN_SCALE_PPROF") != "" {
		if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
			fmt.Fprintf(os.Stderr, "pprof at http://%s/debug/pprof/\n", ln.Addr())
			go func() { _ = http.Serve(ln, nil) }() // net/http/pprof's routes

		}
	}
	if err := runLoad(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
