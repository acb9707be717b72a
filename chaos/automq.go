package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"walden/automq/devcontroller"
	"walden/chaos/netfault"
	"walden/internal/devcluster"
	"walden/loadgen"
	waldenv1 "walden/proto/walden/v1"
)

// The AutoMQ scenarios run the same topology with AutoMQ-mode brokers: the
// development AutoMQ controller in the namespace "amq", each broker started
// by its walden agent in watchdog mode inside the broker's namespace, and
// the coordinators recovering with recovery.action automq. There is no
// catalog to observe: the streams are watched at the controller's view, the
// ledger is read back from AutoMQ's objects in S3 (and, recorded, through
// the leaders), and the watchdog's kill is timed against the coordinators'
// first attestation.

// automqSeen is what the AutoMQ observers saw.
type automqSeen struct {
	mu sync.Mutex
	// reopened is, per stream, when it was first seen OPENED by a node
	// other than the one that led it at the fault.
	reopened map[uint64]time.Time
	// leader is each stream's node at the fault.
	leader map[uint64]int32
	// down is when the watched broker's agent first reported it down after
	// the fault, and why.
	down       time.Time
	downReason string
	// epoch is the watched broker's epoch at the fault; attest holds, per
	// coordinator, its first observation attesting that epoch's lease
	// expired: the raft index of the entry and when it was first seen.
	epoch  uint64
	attest map[string]attestation
}

// attestation is a coordinator's observation attesting a lease expired.
type attestation struct {
	index uint64
	seen  time.Time
}

// automqOptions lays out an AutoMQ cluster: AutoMQ-mode brokers that upload
// only when their WAL fills (so that a broker dies holding records S3
// lacks), and agent margins that leave the broker a lease under the fast
// policy (lease_ttl 1s).
func (h *Harness) automqOptions(o *devcluster.Options, policy string) {
	o.Broker = devcluster.BrokerAutomq
	o.UploadInterval = time.Hour
	if policy == "fast" {
		o.LeaseSafetyMargin, o.KillMargin = 200*time.Millisecond, 300*time.Millisecond
	}
}

// ExpectWatchdogKill says the scenario cuts broker's agent off from the
// coordinators while the broker runs: its watchdog must kill it before any
// coordinator attests its lease expired.
func (e *Env) ExpectWatchdogKill(broker string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.watchdog = broker
}

// watchAutomq reads the controller's view every 100ms (the streams' state
// and leader) and, when a watchdog kill is expected, the broker's agent
// (GET /v1/broker).
func (e *Env) watchAutomq(ctx context.Context) {
	view := e.Cluster.View()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		e.mu.Lock()
		fault, watched := e.faultAt, e.watchdog
		e.mu.Unlock()
		if ss, err := view.Streams(ctx); err == nil {
			now := time.Now()
			e.amq.mu.Lock()
			if e.amq.reopened == nil {
				e.amq.reopened, e.amq.leader = map[uint64]time.Time{}, map[uint64]int32{}
			}
			for _, s := range ss {
				id := uint64(s.StreamID)
				if fault.IsZero() {
					if s.State == devcontroller.StreamOpened {
						e.amq.leader[id] = s.Owner
					}
					continue
				}
				if _, seen := e.amq.reopened[id]; !seen && s.State == devcontroller.StreamOpened && s.Owner != e.amq.leader[id] {
					e.amq.reopened[id] = now
				}
			}
			e.amq.mu.Unlock()
		}
		if watched != "" && !fault.IsZero() {
			e.watchAttestations(ctx, watched)
			if st, err := e.Cluster.AgentBroker(ctx, e.Cluster.Proc(watched)); err == nil && st.State == "down" {
				e.amq.mu.Lock()
				if e.amq.down.IsZero() {
					e.amq.down, e.amq.downReason = time.UnixMilli(st.SinceUnixMS), st.Reason
				}
				e.amq.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchAttestations notes the coordinators' attestations that broker's
// lease of the epoch it had at the fault expired.
func (e *Env) watchAttestations(ctx context.Context, broker string) {
	b, err := e.Cluster.GetBroker(ctx, broker)
	if err != nil {
		return
	}
	now := time.Now()
	e.amq.mu.Lock()
	defer e.amq.mu.Unlock()
	if e.amq.epoch == 0 {
		e.amq.epoch, e.amq.attest = b.GetEpoch(), map[string]attestation{}
	}
	for _, o := range b.GetObservations() {
		if _, seen := e.amq.attest[o.GetObserverId()]; !seen && o.GetLeaseExpired() && o.GetEpoch() == e.amq.epoch {
			e.amq.attest[o.GetObserverId()] = attestation{index: o.GetIndex(), seen: now}
		}
	}
}

// waitReopenedAutomq waits until every stream broker led is OPENED by
// another node at the controller.
func (e *Env) waitReopenedAutomq(ctx context.Context, broker string, timeout time.Duration) error {
	p := e.Cluster.Proc(broker)
	node := devcluster.NodeOf(p)
	view := e.Cluster.View()
	return devcluster.Poll(ctx, timeout, "the streams of "+broker+" opened by other nodes", func() error {
		ss, err := view.Streams(ctx)
		if err != nil {
			return err
		}
		for _, s := range ss {
			if slices.Contains(p.Streams, uint64(s.StreamID)) && (s.State != devcontroller.StreamOpened || s.Owner == node) {
				return fmt.Errorf("stream %d %s by node %d", s.StreamID, s.State, s.Owner)
			}
		}
		return nil
	})
}

// reopenAfterAutomq is the time from fault until every stream in streams
// was seen opened by another node (-1 when some never was).
func (e *Env) reopenAfterAutomq(streams []uint64, fault time.Time) int64 {
	e.amq.mu.Lock()
	defer e.amq.mu.Unlock()
	var worst time.Duration
	for _, s := range streams {
		t, ok := e.amq.reopened[s]
		if !ok {
			return -1
		}
		worst = max(worst, t.Sub(fault))
	}
	return worst.Milliseconds()
}

// verifyAutomq has the brokers upload their WALs, reads the ledger back
// from AutoMQ's objects in S3 through the controller's view (the result),
// and reads every stream again through its leader over the recording
// connections, so that the history ends with full reads.
func (e *Env) verifyAutomq(ctx context.Context, ledger string) (*loadgen.VerifyReport, error) {
	c := e.Cluster
	if err := c.UploadAutomqWALs(ctx, time.Minute); err != nil {
		return nil, err
	}
	v, err := c.Verify(ctx, ledger, time.Minute)
	if err != nil {
		return nil, err
	}
	bv, err := loadgen.Verify(ctx, loadgen.VerifyConfig{Brokers: c.BrokerAddrs(), Ledger: ledger, Wait: time.Minute, DialOptions: c.DialOptions()})
	switch {
	case err != nil:
		e.Note("the reads through the leaders failed: %v", err)
	case !bv.OK() || bv.Present != v.Present:
		e.Note("through the leaders: acked %d, present %d, lost %d, gaps %d, duplicates %d (from S3: present %d)", bv.Acked, bv.Present,
			bv.Lost, bv.Gaps, bv.Duplicates, v.Present)
	}
	return v, nil
}

// judgeAutomq times the watchdog's kill against the first attestation.
func (e *Env) judgeAutomq(ctx context.Context, res *Result, evs []*waldenv1.Event, fault time.Time) {
	e.mu.Lock()
	watched := e.watchdog
	e.mu.Unlock()
	if watched == "" || fault.IsZero() {
		return
	}
	w := &WatchdogTiming{KillMs: -1, FirstAttestMs: -1}
	res.Watchdog = w
	// Each attestation's time is that of the entry that made it (the
	// event log's entry of the same index), else when it was first seen.
	e.amq.mu.Lock()
	attests := maps.Clone(e.amq.attest)
	e.amq.mu.Unlock()
	at := map[uint64]int64{}
	for _, ev := range evs {
		at[ev.GetIndex()] = ev.GetUnixMs()
	}
	var first time.Time
	for _, a := range attests {
		t := a.seen
		if ms, ok := at[a.index]; ok {
			t = time.UnixMilli(ms)
		}
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	if !first.IsZero() {
		w.FirstAttestMs = first.Sub(fault).Milliseconds()
	}

	e.amq.mu.Lock()
	down, why := e.amq.down, e.amq.downReason
	e.amq.mu.Unlock()
	switch {
	case down.IsZero():
		e.Note("%s's agent never reported its broker down", watched)
	case !strings.Contains(why, "watchdog"):
		e.Note("%s's broker died otherwise than by its watchdog: %s", watched, why)
	default:
		w.KillMs = down.Sub(fault).Milliseconds()
		e.Note("%s's broker: %s at +%d ms; first attestation at +%d ms", watched, why, w.KillMs, w.FirstAttestMs)
	}
}

// automqKillBroker kills b1's broker process (its agent lives on), waits
// for its streams to open on other nodes and for its agent to start it
// again under a new registration.
func automqKillBroker(ctx context.Context, e *Env) error {
	b := e.Cluster.Proc(victim)
	e.ExpectFailover(victim, true)
	e.Fault()
	st, _ := e.Cluster.AgentBroker(ctx, b)
	e.Say("kill -9 %s's broker (pid %d); its agent lives on", victim, st.PID)
	if _, err := e.Cluster.KillBroker(ctx, b); err != nil {
		return err
	}
	if err := e.WaitReopened(ctx, victim, 2*time.Minute); err != nil {
		return err
	}
	return e.waitBrokerBack(ctx, b)
}

// automqBrokerCutFromCoordinators cuts b1's namespace (its agent and its
// broker) off from the coordinators, both directions; its clients, the
// other brokers, the controller and S3 still reach it. The broker goes on
// acknowledging (an AutoMQ broker asks no lease) until its agent's watchdog
// kills it, which must happen before any coordinator attests and so before
// the WAL is read.
func automqBrokerCutFromCoordinators(ctx context.Context, e *Env) error {
	b := e.Cluster.Proc(victim)
	links := netfault.Both(victim, e.Coordinators()...)
	e.ExpectFailover(victim, true)
	e.ExpectWatchdogKill(victim)
	e.Fault()
	e.Say("cutting %s (agent and broker) off from the coordinators; its clients, the other brokers, the AutoMQ controller and S3 still reach it", victim)
	if err := e.Firewall.Cut(ctx, links...); err != nil {
		return err
	}
	if err := e.WaitReopened(ctx, victim, 2*time.Minute); err != nil {
		return err
	}
	if err := e.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	e.Say("healing %s's links", victim)
	if err := e.Firewall.Heal(ctx, links...); err != nil {
		return err
	}
	return e.waitBrokerBack(ctx, b)
}

// waitBrokerBack waits until b is registered again and its agent started
// its broker again.
func (e *Env) waitBrokerBack(ctx context.Context, b *devcluster.Proc) error {
	if err := e.WaitRegistered(ctx, b.Name, 2*time.Minute); err != nil {
		return err
	}
	return devcluster.Poll(ctx, 2*time.Minute, b.Name+"'s broker started again by its agent", func() error {
		st, err := e.Cluster.AgentBroker(ctx, b)
		if err != nil {
			return err
		}
		if st.State != "up" || st.Starts < 2 {
			return fmt.Errorf("%s's agent: broker %s, started %d times", b.Name, st.State, st.Starts)
		}
		return nil
	})
}
