package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"walden/internal/testutil"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// renewalStream is a test client of Agent.RenewLeases: one renewal sent,
// its answer read.
type renewalStream struct {
	t      *testing.T
	stream waldenv1.Agent_RenewLeasesClient
	seq    uint64
}

func openRenewalStream(t *testing.T, conn *grpc.ClientConn) *renewalStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := waldenv1.NewAgentClient(conn).RenewLeases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &renewalStream{t: t, stream: s}
}

func (r *renewalStream) renew(broker string, epoch uint64) *waldenv1.RenewLeasesResponse {
	r.t.Helper()
	r.seq++
	if err := r.stream.Send(&waldenv1.RenewLeasesRequest{BrokerId: broker, Epoch: epoch, Seq: r.seq}); err != nil {
		r.t.Fatalf("send: %v", err)
	}
	resp, err := r.stream.Recv()
	if err != nil {
		r.t.Fatalf("receive: %v", err)
	}
	if resp.GetSeq() != r.seq {
		r.t.Fatalf("answer seq %d, want %d", resp.GetSeq(), r.seq)
	}
	return resp
}

// TestRenewalStreamAnswers: over one stream, a coordinator grants as
// RenewLease does (the voters once per configuration), and refuses as it
// does, each refusal an answer on the stream that stays open: a malformed
// renewal (InvalidArgument naming the field), an unknown broker (after a
// read index round), an epoch replaced by a registration.
func TestRenewalStreamAnswers(t *testing.T) {
	cfg := singleMember(t)
	cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = tFailureTimeout, tLeaseTTL, tDriftMargin
	s, conn := startServing(t, cfg)
	ctx := context.Background()
	ag := waldenv1.NewAgentClient(conn)
	reg, err := ag.Register(ctx, &waldenv1.RegisterRequest{ClusterName: "solo", BrokerId: "b1", AgentAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	st := openRenewalStream(t, conn)
	var first *waldenv1.RenewLeasesResponse
	testutil.Eventually(t, 10*time.Second, "a grant after the quiet period", func() error {
		first = st.renew("b1", reg.GetEpoch())
		if first.GetGrant() == nil {
			return fmt.Errorf("refused: %v", first.GetRefusal())
		}
		return nil
	})
	g := first.GetGrant()
	if g.GetEpoch() != reg.GetEpoch() || g.GetCoordinatorId() != "c1" || g.GetLeaseTtlMs() != tLeaseTTL.Milliseconds() ||
		len(g.GetVoters()) != 1 || g.GetVoters()[0].GetId() != "c1" || g.GetLeaderId() != "c1" {
		t.Fatalf("first grant on the stream: %v", g)
	}
	next := st.renew("b1", reg.GetEpoch()).GetGrant()
	if next == nil || len(next.GetVoters()) != 0 || next.GetConfIndex() != g.GetConfIndex() {
		t.Fatalf("second grant on the stream: %v, want the same configuration without the voters", next)
	}
	if rem, ok := s.detector.d.grantor.Remaining(lease.Key{Broker: "b1", Epoch: reg.GetEpoch()}); !ok || rem <= 0 || rem > tLeaseTTL {
		t.Fatalf("the coordinator's grant has %v left (%v)", rem, ok)
	}

	refusals := []struct {
		broker string
		epoch  uint64
		code   codes.Code
		reason refusal.Reason
		field  string
	}{
		{"b1", 0, codes.InvalidArgument, "", "epoch"},
		{"", 1, codes.InvalidArgument, "", "broker_id"},
		{"b9", 1, codes.NotFound, refusal.UnknownNode, ""},
	}
	for _, want := range refusals {
		f := st.renew(want.broker, want.epoch).GetRefusal()
		if f == nil || codes.Code(f.GetCode()) != want.code || refusal.Reason(f.GetReason()) != want.reason {
			t.Fatalf("renewal of %q at %d: refusal %v, want %v %q", want.broker, want.epoch, f, want.code, want.reason)
		}
		if want.field != "" && !strings.HasPrefix(f.GetMessage(), want.field+": ") {
			t.Errorf("renewal of %q at %d: refusal %v does not name the field %s", want.broker, want.epoch, f, want.field)
		}
	}
	// A registration replaces the epoch: the old one is refused, the new
	// one granted, on the same stream.
	reg2, err := ag.Register(ctx, &waldenv1.RegisterRequest{ClusterName: "solo", BrokerId: "b1", AgentAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if f := st.renew("b1", reg.GetEpoch()).GetRefusal(); refusal.Reason(f.GetReason()) != refusal.EpochExpired {
		t.Fatalf("renewal of the replaced epoch: %v", f)
	}
	if g := st.renew("b1", reg2.GetEpoch()).GetGrant(); g == nil || g.GetEpoch() != reg2.GetEpoch() {
		t.Fatalf("renewal of the new epoch: %v", g)
	}
	if n := s.detector.agent.streams.Load(); n != 1 {
		t.Fatalf("%d renewal streams open, want 1", n)
	}
}

// TestRenewalSlots: every grant, streamed or not, asks the agent to renew
// at one of the member's renewal slots (renewals.slot), a third of the
// lease after the grant or less by under a slot; grants made at different
// moments ask for moments a whole number of slots apart.
func TestRenewalSlots(t *testing.T) {
	const slot = 50 * time.Millisecond
	cfg := singleMember(t)
	cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = tFailureTimeout, tLeaseTTL, tDriftMargin
	cfg.Renewals.Slot = slot
	_, conn := startServing(t, cfg)
	ag := waldenv1.NewAgentClient(conn)
	reg, err := ag.Register(context.Background(), &waldenv1.RegisterRequest{ClusterName: "solo", BrokerId: "b1", AgentAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	st := openRenewalStream(t, conn)
	period := tLeaseTTL / 3 // 200ms: four slots of 50ms
	// requested is when a grant asked for the next renewal, on this
	// process's clock: between send + renew_in and receipt + renew_in.
	type requested struct{ earliest, latest time.Duration }
	base := time.Now()
	renew := func(streamed bool) (requested, error) {
		sent := time.Since(base)
		var g *waldenv1.RenewLeaseResponse
		if streamed {
			if g = st.renew("b1", reg.GetEpoch()).GetGrant(); g == nil {
				return requested{}, fmt.Errorf("streamed renewal refused")
			}
		} else {
			var err error
			if g, err = ag.RenewLease(context.Background(), &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: reg.GetEpoch()}); err != nil {
				return requested{}, err
			}
		}
		got := time.Since(base)
		in := time.Duration(g.GetRenewInUs()) * time.Microsecond
		if in <= period-slot || in > period {
			t.Fatalf("grant asks for the next renewal %v after it, want in (%v, %v]", in, period-slot, period)
		}
		return requested{sent + in, got + in}, nil
	}
	testutil.Eventually(t, 10*time.Second, "a grant after the quiet period", func() error { _, err := renew(true); return err })
	aligned := 0
	for i := 0; aligned < 5; i++ {
		if i == 200 {
			t.Fatalf("only %d of 200 pairs of grants answered fast enough to check the slots", aligned)
		}
		a, err := renew(i%2 == 0)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%7) * 9 * time.Millisecond)
		b, err := renew(i%3 == 0)
		if err != nil {
			t.Fatal(err)
		}
		// The moments asked for lie a whole number of slots apart: some
		// multiple of slot falls between the least and the most they can
		// be apart. A machine too slow to tell is tried again.
		lo, hi := b.earliest-a.latest, b.latest-a.earliest
		if hi-lo > slot/2 {
			continue
		}
		if k := (hi / slot) * slot; k < lo {
			t.Fatalf("grants ask for renewals %v–%v apart, not a whole number of %v slots", lo, hi, slot)
		}
		aligned++
	}
}

// TestRenewalStreamsBatch: renewals of many streams sent at once are all
// answered, each with its own seq, with at most one boot-clock reading
// each (shared by those granted together).
func TestRenewalStreamsBatch(t *testing.T) {
	cfg := singleMember(t)
	// The brokers have no agent: between their registration and the
	// rounds, which a loaded machine can make longer than the detection
	// tests' failure_timeout, nothing but the test renews them, and a
	// failover would refuse the rounds' renewals.
	cfg.Policy.FailureTimeout, cfg.Policy.LeaseTTL, cfg.Policy.DriftMargin = time.Minute, tLeaseTTL, tDriftMargin
	s, conn := startServing(t, cfg)
	const n = 40
	epochs := make([]uint64, n)
	for i := range n {
		reg, err := waldenv1.NewAgentClient(conn).Register(context.Background(), &waldenv1.RegisterRequest{ClusterName: "solo", BrokerId: fmt.Sprintf("b%d", i), AgentAddr: "127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		epochs[i] = reg.GetEpoch()
	}
	streams := make([]*renewalStream, n)
	for i := range streams {
		streams[i] = openRenewalStream(t, conn)
	}
	testutil.Eventually(t, 10*time.Second, "a grant after the quiet period", func() error {
		if g := streams[0].renew("b0", epochs[0]); g.GetGrant() == nil {
			return fmt.Errorf("refused: %v", g.GetRefusal())
		}
		return nil
	})
	// At most one boot-clock reading per renewal; renewals granted at
	// about the same time share one.
	readings0 := s.detector.agent.readings.Taken()
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i, st := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st.seq++
				if err := st.stream.Send(&waldenv1.RenewLeasesRequest{BrokerId: fmt.Sprintf("b%d", i), Epoch: epochs[i], Seq: st.seq}); err != nil {
					errs <- err
					return
				}
				resp, err := st.stream.Recv()
				switch {
				case err != nil:
					errs <- err
				case resp.GetSeq() != st.seq || resp.GetGrant().GetEpoch() != epochs[i]:
					errs <- fmt.Errorf("stream %d round %d: answer %v", i, round, resp)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	readings := s.detector.agent.readings.Taken() - readings0
	t.Logf("%d renewals granted with %d boot-clock readings", 3*n, readings)
	if readings < 1 || readings > 3*n {
		t.Fatalf("%d boot-clock readings for %d renewals", readings, 3*n)
	}
}

// TestMixedAgentsDuringAnUpgrade: in one cluster, an agent of the walden
// before streamed renewals (one RenewLease call per renewal, as it renewed
// then) and an agent of this one (one stream per coordinator) both hold
// their leases and are observed alive by every coordinator; a kill of the
// new one is still detected.
func TestMixedAgentsDuringAnUpgrade(t *testing.T) {
	c := newDetCluster(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	old := startUnaryAgent(ctx, t, c, "b-old")
	a := c.startAgent("b-new", nil)
	c.waitAllAlive("b-old", "b-new")
	c.waitFor("the old agent's lease valid", 10*time.Second, old.valid)
	for _, s := range c.servers {
		c.waitFor("one renewal stream on "+s.cfg.NodeID, 10*time.Second, func() bool { return s.detector.agent.streams.Load() == 1 })
	}
	// Both keep their leases for a few lease periods.
	c.hold("both agents hold their leases", 3*tLeaseTTL, func() bool { return old.valid() && a.Lease().Valid })

	// The new agent dies: it is failed over as before.
	epoch := a.Lease().Epoch
	_ = a.Stop(false)
	c.waitFor("b-new failed over", 20*time.Second, func() bool {
		b := c.broker("b-new")
		return b.GetEpoch() > epoch && b.GetFenced()
	})
	if b := c.broker("b-old"); b.GetFenced() {
		t.Fatal("the old agent's broker was failed over")
	}
	if !old.valid() {
		t.Fatal("the old agent's lease lapsed")
	}
}

// unaryAgent renews as the agents before streamed renewals did: a
// RenewLease call to every coordinator every lease_ttl/3.
type unaryAgent struct {
	mu     sync.Mutex
	holder *lease.Holder
}

func (u *unaryAgent) valid() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	ok, _ := u.holder.Valid(lease.BootClock.Now())
	return ok
}

func startUnaryAgent(ctx context.Context, t *testing.T, c *detCluster, id string) *unaryAgent {
	t.Helper()
	// Its probe endpoint answers, as an agent's does.
	probed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(probed.Close)
	reg, err := waldenv1.NewAgentClient(c.conns[c.pick("leader")]).Register(ctx, &waldenv1.RegisterRequest{
		ClusterName: "det", BrokerId: id, AgentAddr: probed.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	u := &unaryAgent{holder: lease.NewHolder(c.agentMargin)}
	u.holder.SetEpoch(reg.GetEpoch())
	var wg sync.WaitGroup
	for _, conn := range c.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := waldenv1.NewAgentClient(conn)
			for ctx.Err() == nil {
				sent := lease.BootClock.Now()
				cctx, cancel := context.WithTimeout(ctx, tLeaseTTL/6)
				resp, err := cl.RenewLease(cctx, &waldenv1.RenewLeaseRequest{BrokerId: id, Epoch: reg.GetEpoch()})
				cancel()
				wait := tLeaseTTL / 12
				if err == nil {
					v := lease.Voters{Index: resp.GetConfIndex()}
					for _, m := range resp.GetVoters() {
						v.IDs = append(v.IDs, m.GetId())
					}
					u.mu.Lock()
					u.holder.Granted(lease.Grant{Coordinator: resp.GetCoordinatorId(), Epoch: reg.GetEpoch(), Sent: sent,
						TTL: time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond}, v)
					u.mu.Unlock()
					wait = tLeaseTTL/3 - (lease.BootClock.Now() - sent)
				}
				select {
				case <-ctx.Done():
				case <-time.After(max(wait, time.Millisecond)):
				}
			}
		}()
	}
	t.Cleanup(wg.Wait)
	return u
}

// fewBrokers is a registry of n brokers (only Brokers is read).
type fewBrokers struct {
	brokerState
	n int
}

func (f fewBrokers) Brokers() []*waldenv1.Broker { return make([]*waldenv1.Broker, f.n) }

// The coordinator warns when the registered brokers come within a tenth
// of limits.admin.max_conns, and not below.
func TestWarnAgentConnections(t *testing.T) {
	for _, tc := range []struct {
		brokers int
		warn    bool
	}{{89, false}, {90, true}, {120, true}} {
		var buf syncBuffer
		d := &serviceDeps{state: fewBrokers{n: tc.brokers}, adminMaxConns: 100, logger: slog.New(slog.NewTextHandler(&buf, nil))}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		d.warnAgentConnections(ctx, 10*time.Millisecond)
		cancel()
		out := buf.String()
		if got := strings.Contains(out, "limits.admin.max_conns=100"); got != tc.warn {
			t.Fatalf("%d brokers, max_conns 100: warned %v: %q", tc.brokers, got, out)
		}
		if tc.warn && strings.Count(out, "level=WARN") != 1 {
			t.Fatalf("warned more than once in a check interval's run: %q", out)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
