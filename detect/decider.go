package detect

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"walden/fencing"
	waldenv1 "walden/proto/walden/v1"
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
}

// DeciderConfig configures a Decider.
type DeciderConfig struct {
	// NodeID is this member's id (evidence decided_by).
	NodeID string
	// Interval is the period of the decision loop. Default 150ms.
	Interval time.Duration
	// ProposeTimeout bounds one proposal. Default 2s.
	ProposeTimeout time.Duration
	// Now reads the monotonic clock; default time.Now (tests substitute).
	Now    func() time.Time
	Logger *slog.Logger
}

// Decider is the leader's decision loop: every Interval, while this member
// leads, it runs Decide over the committed state and the lease table and
// proposes the resulting entries. On every gain of leadership it starts a
// fresh Memory and resets the lease table, so that every clock starts at the
// election.
type Decider struct {
	cfg     DeciderConfig
	cluster Cluster
	state   DecisionState
	policy  func() *waldenv1.Policy
	leases  *LeaseTable
	propose ProposeFunc
	log     *slog.Logger

	mu       sync.Mutex
	term     uint64 // term of the current leadership, 0 when not leading
	mem      Memory
	declared int // DeclareFailed entries committed by this decider (tests)
}

// NewDecider returns a decider; Run starts it. policy returns the
// effective policy.
func NewDecider(cfg DeciderConfig, cluster Cluster, state DecisionState, policy func() *waldenv1.Policy, leases *LeaseTable, propose ProposeFunc) *Decider {
	if cfg.Interval <= 0 {
		cfg.Interval = 150 * time.Millisecond
	}
	if cfg.ProposeTimeout <= 0 {
		cfg.ProposeTimeout = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Decider{cfg: cfg, cluster: cluster, state: state, policy: policy, leases: leases, propose: propose,
		log: cfg.Logger.With("component", "decider", "node_id", cfg.NodeID)}
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

// Leading reports whether the decider currently acts as leader, and since
// when (the lease table's leadership start).
func (d *Decider) Leading() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.term != 0
}

// Tick runs one round: it notices leadership changes, decides, and proposes.
func (d *Decider) Tick(ctx context.Context) {
	leader, term := d.cluster.Leadership()
	now := d.cfg.Now()
	d.mu.Lock()
	if !leader {
		if d.term != 0 {
			d.log.Info("no longer leader: decisions stop", "term", term)
		}
		d.term, d.mem = 0, Memory{}
		d.mu.Unlock()
		return
	}
	if d.term != term {
		d.term, d.mem = term, Memory{}
		d.leases.Reset(now)
		d.log.Info("leader: every lease granted a full TTL and every suspicion clock started now", "term", term)
	}
	mem := d.mem
	d.mu.Unlock()

	p := d.policy()
	ttl := time.Duration(p.GetLeaseTtlMs()) * time.Millisecond
	brokers := d.state.Brokers()
	expiry := make(map[string]time.Time, len(brokers))
	for _, b := range brokers {
		expiry[b.GetBrokerId()] = d.leases.ExpiresAt(b.GetBrokerId(), b.GetEpoch(), ttl)
	}
	in := Input{
		Now:               now,
		NowUnixMs:         time.Now().UnixMilli(),
		LeaderSince:       d.leases.LeaderSince(),
		LeaderID:          d.cfg.NodeID,
		Term:              term,
		Policy:            p,
		Voters:            d.cluster.Voters(),
		LiveMembers:       d.cluster.LiveMembers(),
		Brokers:           brokers,
		LeaseExpiry:       expiry,
		RunningRecoveries: d.state.ActiveJobs(),
		Memory:            mem,
	}
	dec := Decide(in)
	d.mu.Lock()
	if d.term == term {
		d.mem = dec.Memory
	}
	d.mu.Unlock()

	for _, ev := range dec.Events {
		d.log.Warn("decider event", "kind", ev.GetKind(), "broker_id", ev.GetBrokerId(), "term", term, "message", ev.GetMessage())
		d.proposeOne(ctx, &waldenv1.Command{Op: &waldenv1.Command_RecordEvent{RecordEvent: &waldenv1.RecordEvent{Event: ev}}})
	}
	for _, df := range dec.Declare {
		ev := df.GetEvidence()
		d.log.Warn("broker declared failed", "broker_id", df.GetBrokerId(), "epoch", df.GetEpoch(), "term", term,
			"dry_run", df.GetDryRun(), "suspicion_quorum", ev.GetSuspicionQuorum(), "observers", len(ev.GetObservations()),
			"suspect_for_ms", ev.GetSuspectForMs(), "failure_timeout_ms", ev.GetFailureTimeoutMs(),
			"lease_expired_for_ms", ev.GetLeaseExpiredForMs(), "brokers_suspected", ev.GetBrokersSuspected(),
			"brokers_total", ev.GetBrokersTotal(), "running_recoveries", ev.GetRunningRecoveries(), "live_members", df.GetLiveMembers())
		if !df.GetDryRun() && !d.leases.BeginDeclare(df.GetBrokerId(), df.GetEpoch(), ttl, time.Duration(p.GetDriftMarginMs())*time.Millisecond, d.cfg.Now()) {
			d.log.Info("decision dropped: the lease was renewed meanwhile", "broker_id", df.GetBrokerId(), "epoch", df.GetEpoch(), "term", term)
			continue
		}
		res, err := d.proposeOne(ctx, &waldenv1.Command{Op: &waldenv1.Command_DeclareFailed{DeclareFailed: df}})
		if err != nil {
			// A refusal by the state machine means the entry did not apply;
			// any other failure may still commit, so renewals of the epoch
			// stay refused.
			if !df.GetDryRun() && fencing.Reason(err) != "" {
				d.leases.AbortDeclare(df.GetBrokerId(), df.GetEpoch())
			}
			continue
		}
		d.mu.Lock()
		d.declared++
		d.mu.Unlock()
		r := res.GetDeclareFailed()
		d.log.Info("decision committed", "broker_id", df.GetBrokerId(), "epoch", df.GetEpoch(), "new_epoch", r.GetNewEpoch(),
			"job_id", r.GetJobId(), "dry_run", r.GetDryRun(), "term", term, "index", res.GetIndex())
	}
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
