package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"walden/agent"
	"walden/config"
	"walden/internal/testutil"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
)

// The policy of the watchdog's cluster tests: a lease of 2s with a 300ms
// drift allowance, and a failure_timeout above lease_ttl + drift. The
// agent's margin is 300ms and the watchdog kills 500ms before the lease's
// end, so a majority of coordinators may attest no earlier than 1.1s after
// the kill.
const (
	wdTTL     = 2 * time.Second
	wdDrift   = 300 * time.Millisecond
	wdMargin  = 300 * time.Millisecond
	wdKill    = 500 * time.Millisecond
	wdTimeout = 3 * time.Second
)

func bootNow() int64 { return int64(lease.BootClock.Now()) }

// cutDialer dials the coordinators for the agent until Cut: then it closes
// every connection it made and refuses new ones — the agent cut off from
// every coordinator, while the coordinators still reach the agent.
type cutDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (d *cutDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("cut off from the coordinators")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cutDialer) Cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for _, c := range d.conns {
		c.Close()
	}
}

// grantLog records, per coordinator, when the agent sent the last renewal
// that coordinator granted (on a stream or in a call): the coordinator granted it no earlier, so it
// may attest no earlier than that plus lease_ttl plus drift (on the same
// boot clock: the coordinators run in this process).
type grantLog struct {
	mu   sync.Mutex
	sent map[string]int64
}

func (g *grantLog) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	sent := bootNow()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if r, ok := reply.(*waldenv1.RenewLeaseResponse); ok && err == nil && r.GetCoordinatorId() != "" {
		g.mu.Lock()
		g.sent[r.GetCoordinatorId()] = max(g.sent[r.GetCoordinatorId()], sent)
		g.mu.Unlock()
	}
	return err
}

// interceptStream records the grants of the renewal streams as intercept
// does those of the calls: each renewal's send time, by seq, and the grant
// that answers it.
func (g *grantLog) interceptStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != waldenv1.Agent_RenewLeases_FullMethodName {
		return cs, err
	}
	return &loggedStream{ClientStream: cs, g: g, sent: map[uint64]int64{}}, nil
}

type loggedStream struct {
	grpc.ClientStream
	g    *grantLog
	mu   sync.Mutex
	sent map[uint64]int64 // by seq
}

func (s *loggedStream) SendMsg(m any) error {
	if r, ok := m.(*waldenv1.RenewLeasesRequest); ok {
		s.mu.Lock()
		s.sent[r.GetSeq()] = bootNow()
		s.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func (s *loggedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*waldenv1.RenewLeasesResponse); ok && err == nil && r.GetGrant().GetCoordinatorId() != "" {
		s.mu.Lock()
		sent, ok := s.sent[r.GetSeq()]
		s.mu.Unlock()
		if ok {
			id := r.GetGrant().GetCoordinatorId()
			s.g.mu.Lock()
			s.g.sent[id] = max(s.g.sent[id], sent)
			s.g.mu.Unlock()
		}
	}
	return err
}

// majorityMayAttest is the earliest boot clock reading at which a majority
// of the coordinators may have attested that the lease ran out: no
// decision, hence no WAL read, comes before it.
func (g *grantLog) majorityMayAttest(t *testing.T) (majority, first int64) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.sent) != 3 {
		t.Fatalf("grants of %d coordinators recorded, want 3", len(g.sent))
	}
	var at []int64
	for _, s := range g.sent {
		at = append(at, s+int64(wdTTL+wdDrift))
	}
	slices.Sort(at)
	return at[1], at[0]
}

func helperCommand(t *testing.T, role string) []string {
	t.Helper()
	env, err := exec.LookPath("env")
	if err != nil {
		t.Skip("no env command")
	}
	return []string{env, "WALDEN_AGENT_TEST_ROLE=" + role, os.Args[0]}
}

// pidExit reports the boot clock reading at which pid exits (a pidfd: the
// test is not its parent).
func pidExit(t *testing.T, pid int) <-chan int64 {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	ch := make(chan int64, 1)
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
				break
			}
		}
		ch <- bootNow()
	}()
	return ch
}

// startWatchedAgent starts a real cluster and an agent that starts a
// stand-in broker (the test binary) under the watchdog, and waits for the
// broker to be up.
func startWatchedAgent(t *testing.T) (*testCluster, *agent.Agent, *cutDialer, *grantLog, agent.BrokerStatus, <-chan int64) {
	t.Helper()
	cl := startTestCluster(t, func(p *config.Policy) {
		p.LeaseTTL, p.DriftMargin, p.FailureTimeout = wdTTL, wdDrift, wdTimeout
		p.MaxFailedFraction = 1 // one broker of one may be failed over
	})
	cfg := config.DefaultAgentConfig()
	cfg.BrokerID, cfg.ClusterName = "b1", "demo"
	for _, m := range cl.members {
		cfg.Coordinators = append(cfg.Coordinators, m.admin)
	}
	cfg.Listen = "127.0.0.1:0"
	cfg.WAL = config.WALLocation{Path: "/var/lib/broker/b1.wal"}
	cfg.LeaseSafetyMargin = wdMargin
	cfg.Gossip.BindAddr = "127.0.0.1:0"
	cfg.Gossip.Join = cl.gossip
	cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	cfg.Gossip.GossipInterval = 50 * time.Millisecond
	cfg.Broker = config.AgentBroker{Command: helperCommand(t, "broker"), CheckInterval: 100 * time.Millisecond,
		HealthTimeout: 100 * time.Millisecond, FailureThreshold: 3, StartTimeout: 20 * time.Second, Restart: true, StopTimeout: 5 * time.Second}
	cfg.Watchdog = config.AgentWatchdog{Enabled: true, KillMargin: wdKill, KillTimeout: time.Second}
	node := int32(1)
	cfg.Automq.NodeID = &node
	// The grants are observed by gRPC interceptors: the renewals go over
	// the stream (its cut by the cut dialer too).
	cfg.Renewals.Transport = config.RenewalsStream

	cut := &cutDialer{}
	grants := &grantLog{sent: map[string]int64{}}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { null.Close() })
	logger := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("test", t.Name())
	}
	a, err := agent.New(cfg, agent.Options{Logger: logger, RegisterBackoffMax: 200 * time.Millisecond,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(cut.dial), grpc.WithChainUnaryInterceptor(grants.intercept), grpc.WithChainStreamInterceptor(grants.interceptStream)},
		Dial:        cut.dial, WatchdogCommand: helperCommand(t, "watchdog"), BrokerStdout: null, BrokerStderr: null})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(false) })
	var st agent.BrokerStatus
	testutil.Eventually(t, 30*time.Second, "the broker up under a valid lease", func() error {
		st = a.Broker()
		if st.State != agent.BrokerUp || !st.WatchdogArmed {
			return fmt.Errorf("broker %+v", st)
		}
		return nil
	})
	// Watch its exit at once: a lease that a loaded machine let lapse
	// from here on kills it before a caller could.
	dead := pidExit(t, st.PID)
	testutil.Eventually(t, 10*time.Second, "grants of every coordinator", func() error {
		grants.mu.Lock()
		defer grants.mu.Unlock()
		if len(grants.sent) != 3 {
			return fmt.Errorf("grants of %v", grants.sent)
		}
		return nil
	})
	// A loaded machine may be between raft leaders at this moment.
	testutil.Eventually(t, 20*time.Second, "the broker record with its AutoMQ node", func() error {
		b, err := cl.broker("b1")
		if err != nil || b.GetAutomq().GetNodeId() != 1 {
			return fmt.Errorf("the broker record %v, %v", b, err)
		}
		return nil
	})
	return cl, a, cut, grants, st, dead
}

// waitFailedOver waits until the cluster fenced the broker's epoch (its
// failover was decided).
func waitFailedOver(t *testing.T, cl *testCluster, epoch uint64) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "the broker failed over by the cluster", func() error {
		b, err := cl.broker("b1")
		if err != nil {
			return err
		}
		if b.GetFailovers() == 0 || b.GetEpoch() == epoch {
			return fmt.Errorf("broker %s at epoch %d, %d failovers", b.GetBrokerState().Name(), b.GetEpoch(), b.GetFailovers())
		}
		return nil
	})
}

// TestWatchdogBrokerKilledIsFailedOver (the broker dies beside a live
// agent): the agent stops renewing and answers its probes 503, and the
// cluster fails the dead broker over.
func TestWatchdogBrokerKilledIsFailedOver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-member cluster")
	}
	cl, a, _, _, st, _ := startWatchedAgent(t)
	epoch := a.Lease().Epoch
	if err := unix.Kill(st.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the broker down", func() error {
		if b := a.Broker(); b.State != agent.BrokerDown || !strings.Contains(b.Reason, "exited") {
			return fmt.Errorf("broker %+v", b)
		}
		return nil
	})
	waitFailedOver(t, cl, epoch)
}

// TestWatchdogCutOffKillsBeforeAttestation (the agent cut off from every
// coordinator, its broker still reachable): the watchdog SIGKILLs the
// broker's process group before the earliest instant a majority of the
// coordinators may attest that its lease ran out — measured on the boot
// clock against when each coordinator granted — and the cluster then fails
// it over. Stalled: the broker was SIGSTOPped first, and its agent is cut
// off: it is dead all the same before its WAL could be read.
func TestWatchdogCutOffKillsBeforeAttestation(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-member cluster")
	}
	for _, stalled := range []bool{false, true} {
		t.Run(fmt.Sprintf("stalled=%t", stalled), func(t *testing.T) {
			cl, a, cut, grants, st, dead := startWatchedAgent(t)
			epoch := a.Lease().Epoch
			if stalled {
				// ESRCH: a loaded machine let the lease lapse and the
				// watchdog killed the broker already, which the checks
				// below judge as any other kill.
				if err := unix.Kill(st.PID, unix.SIGSTOP); err != nil && !errors.Is(err, unix.ESRCH) {
					t.Fatal(err)
				}
			}
			cut.Cut()
			cutAt := bootNow()
			var at int64
			select {
			case at = <-dead:
			case <-time.After(testutil.Deadline(3 * wdTTL)):
				t.Fatal("the broker outlived its lease")
			}
			majority, first := grants.majorityMayAttest(t)
			t.Logf("broker dead %s after the cut, %s before a majority of the coordinators may attest (the first may attest %s after it)",
				time.Duration(at-cutAt), time.Duration(majority-at), time.Duration(first-at))
			if at >= majority {
				t.Fatalf("the broker died %s after a majority of the coordinators could attest its lease ran out", time.Duration(at-majority))
			}
			testutil.Eventually(t, 10*time.Second, "the broker down", func() error {
				if b := a.Broker(); b.State != agent.BrokerDown || !strings.Contains(b.Reason, "killed by the watchdog (lease)") {
					return fmt.Errorf("broker %+v", b)
				}
				return nil
			})
			waitFailedOver(t, cl, epoch)
		})
	}
}
