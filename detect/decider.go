package detect

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"walden/lease"
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// Cluster is the decider's view of the raft group on this member.
type Cluster interface {
	// Leadership reports whether this member leads, and the term.
	Leadership() (leader bool, term uint64)
	// Voters are the voting members' ids.
	Voters() []string
	// LiveMembers are the members the leader's raft progress shows active,
	// itself included.
	LiveMembers() []string
}

// DecisionState is the committed state the decider reads (package fsm's
// State).
type DecisionState interface {
	BrokerSource
	// ActiveJobs is the number of pending or running recovery jobs.
	ActiveJobs() int
	// Policy is the cluster's effective policy and whether it is seeded.
	Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool)
}

// DeciderConfig configures a Decider.
type DeciderConfig struct {
	// NodeID is this member's id (evidence decided_by).
	NodeID string
	// Seed is the policy: section of this member's config file: proposed as
	// the cluster's policy when this member leads a cluster that has none.
	Seed *waldenv1.Policy
	// Interval is the period of the decision loop. Default 150ms.
	Interval time.Duration
	// ProposeTimeout bounds one proposal. Default 2s.
	ProposeTimeout time.Duration
	// Clock is the boot clock; default lease.BootClock (tests substitute).
	Clock  lease.Clock
	Logger *slog.Logger
	// Metrics receives the decisions, holds and freeze of every round while
	// this member leads (metrics.Decisions); nil records nothing.
	Metrics DecisionMetrics
}

// DecisionMetrics receives what the decision loop does.
type DecisionMetrics interface {
	// Decided counts a proposed decision: outcome failed_over, dry_run or
	// refused (by the state machine); reason automatic or manual.
	Decided(outcome, reason string)
	// SetHolds sets the number of brokers held by each hold reason (nil:
	// none, this member does not lead).
	SetHolds(held map[string]int)
	// SetFrozen says whether automatic failover is frozen.
	SetFrozen(frozen bool)
}

type noDecisionMetrics struct{}

func (noDecisionMetrics) Decided(string, string)  {}
func (noDecisionMetrics) SetHolds(map[string]int) {}
func (noDecisionMetrics) SetFrozen(bool)          {}

// Hold says why a suspected (or requested) broker was not declared failed
// at the leader's last decision round.
type Hold struct {
	Reason, Detail string
}

// Decider is the leader's decision loop: every Interval, while this member
// leads, it runs Decide over the committed state and proposes the resulting
// entries, each decision bound to its term. On every gain of leadership it
// starts a fresh Memory, so that every silence it judges starts no earlier
// than its election. A leader that finds the cluster without a policy seeds
// it from its config file first.
type Decider struct {
	cfg     DeciderConfig
	cluster Cluster
	state   DecisionState
	propose ProposeFunc
	log     *slog.Logger

	mu          sync.Mutex
	term        uint64 // term of the current leadership, 0 when not leading
	leaderSince time.Time
	mem         Memory
	holds       map[string]Hold
	declared    int // DeclareFailed entries committed by this decider (tests)
	seedAt      time.Duration
}

// NewDecider returns a decider; Run starts it.
func NewDecider(cfg DeciderConfig, cluster Cluster, state DecisionState, propose ProposeFunc) *Decider {
	if cfg.Interval <= 0 {
		cfg.Interval = 150 * time.Millisecond
	}
	if cfg.ProposeTimeout <= 0 {
		cfg.ProposeTimeout = 2 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = lease.BootClock
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noDecisionMetrics{}
	}
	return &Decider{cfg: cfg, cluster: cluster, state: state, propose: propose,
		log: cfg.Logger.With("component", "decider")}
}

// Run decides every Interval until ctx is done.
func (d *Decider) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		d.Tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Leading reports whether the decider currently acts as leader.
func (d *Decider) Leading() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.term != 0
}

// Holds returns, per broker, why the last round did not declare it failed
// (empty when this member does not lead).
func (d *Decider) Holds() map[string]Hold {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.holds)
}

func (d *Decider) now() time.Time { return time.Unix(0, int64(d.cfg.Clock.Now())) }

// Tick runs one round: it notices leadership changes, seeds the policy if
// the cluster has none, decides, and proposes.
func (d *Decider) Tick(ctx context.Context) {
	leader, term := d.cluster.Leadership()
	now := d.now()
	d.mu.Lock()
	if !leader {
		if d.term != 0 {
			d.log.Info("no longer leader: decisions stop", "term", d.term)
		}
		d.term, d.mem, d.holds = 0, Memory{}, nil
		d.mu.Unlock()
		d.cfg.Metrics.SetHolds(nil)
		d.cfg.Metrics.SetFrozen(false)
		return
	}
	if d.term != term {
		d.term, d.mem, d.leaderSince, d.seedAt = term, Memory{}, now, 0
		d.log.Info("leader: every silence is judged from now on", "term", term)
	}
	mem, since := d.mem, d.leaderSince
	d.mu.Unlock()

	p, _, seeded := d.state.Policy()
	if !seeded {
		d.seed(ctx, term)
		return
	}
	dec := Decide(Input{
		Now:               now,
		NowUnixMs:         time.Now().UnixMilli(),
		LeaderSince:       since,
		LeaderID:          d.cfg.NodeID,
		Term:              term,
		Policy:            p,
		Voters:            d.cluster.Voters(),
		LiveMembers:       d.cluster.LiveMembers(),
		Brokers:           d.state.Brokers(),
		RunningRecoveries: d.state.ActiveJobs(),
		Memory:            mem,
	})
	holds := make(map[string]Hold, len(dec.Holds))
	held := map[string]int{}
	for id, r := range dec.Holds {
		holds[id] = Hold{Reason: r, Detail: dec.HoldDetails[id]}
		held[r]++
	}
	d.cfg.Metrics.SetHolds(held)
	d.cfg.Metrics.SetFrozen(dec.Memory.Frozen)
	d.mu.Lock()
	if d.term == term {
		d.mem, d.holds = dec.Memory, holds
	}
	d.mu.Unlock()

	for _, ev := range dec.Events {
		d.log.Warn("decider event", "kind", ev.GetEventKind().Name(), "broker_id", ev.GetBrokerId(), "term", term, "message", ev.GetMessage())
		d.proposeOne(ctx, &waldenv1.Command{Op: &waldenv1.Command_RecordEvent{RecordEvent: &waldenv1.RecordEvent{Event: ev}}})
	}
	for _, df := range dec.Declare {
		ev := df.GetEvidence()
		d.log.Warn("broker declared failed", "broker_id", df.GetBrokerId(), "epoch", df.GetEpoch(), "term", term,
			"dry_run", df.GetDryRun(), "manual", ev.GetManual(), "suspicion_quorum", ev.GetSuspicionQuorum(),
			"silent_for_ms", ev.GetSuspectForMs(), "failure_timeout_ms", ev.GetFailureTimeoutMs(),
			"attested_by", Attested(&waldenv1.Broker{Epoch: df.GetEpoch(), Observations: ev.GetObservations()}, d.cluster.Voters()),
			"brokers_suspected", ev.GetBrokersSuspected(), "brokers_total", ev.GetBrokersTotal(),
			"running_recoveries", ev.GetRunningRecoveries(), "live_members", df.GetLiveMembers(), "reason", ev.GetReason())
		res, err := d.proposeOne(ctx, &waldenv1.Command{Op: &waldenv1.Command_DeclareFailed{DeclareFailed: df}})
		reason := "automatic"
		if ev.GetManual() {
			reason = "manual"
		}
		if err != nil {
			if refusal.Of(err) != "" {
				d.cfg.Metrics.Decided("refused", reason)
			}
			continue
		}
		if df.GetDryRun() {
			d.cfg.Metrics.Decided("dry_run", reason)
		} else {
			d.cfg.Metrics.Decided("failed_over", reason)
		}
		d.mu.Lock()
		d.declared++
		d.mu.Unlock()
		r := res.GetDeclareFailed()
		d.log.Info("decision committed", "broker_id", df.GetBrokerId(), "epoch", df.GetEpoch(), "new_epoch", r.GetNewEpoch(),
			"job_id", r.GetJobId(), "dry_run", r.GetDryRun(), "term", term, "index", res.GetIndex())
	}
}

// seed proposes this member's config policy as the cluster's (at most once
// a second while it leads a cluster without one).
func (d *Decider) seed(ctx context.Context, term uint64) {
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	if d.seedAt != 0 && now-d.seedAt < time.Second {
		d.mu.Unlock()
		return
	}
	d.seedAt = now
	d.mu.Unlock()
	seed := d.cfg.Seed
	if seed == nil {
		seed = policy.Defaults()
	}
	d.log.Info("the cluster has no policy yet: seeding it from this member's config file", "term", term)
	d.proposeOne(ctx, &waldenv1.Command{Op: &waldenv1.Command_SeedPolicy{SeedPolicy: &waldenv1.SeedPolicy{Policy: seed, SeededBy: d.cfg.NodeID}}})
}

func (d *Decider) proposeOne(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	pctx, cancel := context.WithTimeout(ctx, d.cfg.ProposeTimeout)
	defer cancel()
	res, err := d.propose(pctx, cmd)
	if err != nil {
		d.log.Warn("proposal refused or failed", "err", err)
	}
	return res, err
}
