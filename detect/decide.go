package detect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// Broker and observation states as spelled in the replicated state.
const (
	StateAlive       = "alive"
	StateSuspect     = "suspect"
	StateDead        = "dead"
	StateFailed      = "failed"
	StateRecovering  = "recovering"
	StateRecovered   = "recovered"
	StateMaintenance = "maintenance"
)

// Event kinds the decider records.
const (
	EventFreeze   = "freeze"
	EventUnfreeze = "unfreeze"
	EventCooldown = "cooldown"
)

// reasonLeft is the prefix of an observation reason that says the broker's
// agent left the gossip pool gracefully (restart_grace applies).
const reasonLeft = "gossip: left"

// Input is everything Decide looks at. Times are readings of the leader's
// monotonic clock (time.Now in the leader process), except NowUnixMs, which
// is only compared with the wall-clock recovery times of the replicated
// state for the cooldown (minutes, so a clock skew of seconds is harmless).
type Input struct {
	// Now is the leader's current monotonic time.
	Now time.Time
	// NowUnixMs is the leader's wall clock, for the cooldown only.
	NowUnixMs int64
	// LeaderSince is when this member became leader of the current term.
	LeaderSince time.Time
	// LeaderID and Term identify the deciding leader (evidence and logs).
	LeaderID string
	Term     uint64
	// Policy is the effective policy.
	Policy *waldenv1.Policy
	// Voters are the voting members; a majority of them is the default
	// suspicion quorum and only their observations count.
	Voters []string
	// LiveMembers are the members the leader sees active (itself included):
	// the candidates for a recovery job.
	LiveMembers []string
	// Brokers is the committed broker registry.
	Brokers []*waldenv1.Broker
	// LeaseExpiry maps a broker id to the moment its lease (at its current
	// epoch) expires on the leader's clock. A broker missing from the map
	// is treated as renewed at LeaderSince.
	LeaseExpiry map[string]time.Time
	// RunningRecoveries is the number of pending or running recovery jobs.
	RunningRecoveries int
	// Memory is what Decide returned last time (the zero value for a new
	// leader).
	Memory Memory
}

// Memory is the decider's state between two calls of Decide. It lives only
// in the leader's memory: a new leader starts from the zero value, so every
// clock starts again at its election and a timeout is never shortened by a
// leader change.
type Memory struct {
	// QuorumSince is when the leader saw a suspicion quorum form for a
	// broker at an epoch.
	QuorumSince map[string]Since
	// Frozen is set while automatic failover is frozen.
	Frozen bool
	// CooldownRecorded holds the epoch for which a cooldown event was
	// recorded per broker.
	CooldownRecorded map[string]uint64
	// DryRunDone holds the epoch for which a dry-run decision was made per
	// broker.
	DryRunDone map[string]uint64
}

// Since is the start of a continuous suspicion of one broker epoch.
type Since struct {
	Epoch uint64
	At    time.Time
}

// Decision is what Decide concluded.
type Decision struct {
	// Declare are the failover decisions to propose, one per broker.
	Declare []*waldenv1.DeclareFailed
	// Events are freeze / unfreeze / cooldown events to propose.
	Events []*waldenv1.Event
	// Holds explain, per suspected broker, why it was not declared failed
	// (for logs and tests): "quorum", "timeout", "lease", "frozen",
	// "max_concurrent_recoveries", "cooldown", "dry_run_done".
	Holds map[string]string
	// Memory is the memory for the next call.
	Memory Memory
}

// Hold reasons.
const (
	HoldQuorum      = "quorum"
	HoldTimeout     = "timeout"
	HoldLease       = "lease"
	HoldFrozen      = "frozen"
	HoldConcurrency = "max_concurrent_recoveries"
	HoldCooldown    = "cooldown"
	HoldDryRunDone  = "dry_run_done"
)

// Quorum is the number of coordinators that must observe a broker suspect
// or dead: the policy's suspicion_quorum, or a majority of voters when it
// is 0.
func Quorum(p *waldenv1.Policy, voters int) int {
	if q := int(p.GetSuspicionQuorum()); q > 0 {
		return q
	}
	return voters/2 + 1
}

// eligible reports whether automatic detection applies to b at all.
func eligible(b *waldenv1.Broker) bool {
	if b.GetFenced() || b.GetMaintenance() {
		return false
	}
	switch b.GetState() {
	case StateFailed, StateRecovering, StateRecovered, StateMaintenance:
		return false
	}
	return true
}

// suspecting returns the observations of voters that say suspect or dead.
func suspecting(b *waldenv1.Broker, voters []string) []*waldenv1.Observation {
	var out []*waldenv1.Observation
	for _, o := range b.GetObservations() {
		if (o.GetState() == StateSuspect || o.GetState() == StateDead) && slices.Contains(voters, o.GetObserverId()) {
			out = append(out, o)
		}
	}
	return out
}

func leftGracefully(b *waldenv1.Broker) bool {
	if b.GetLeftGracefully() {
		return true
	}
	for _, o := range b.GetObservations() {
		if strings.HasPrefix(o.GetReason(), reasonLeft) {
			return true
		}
	}
	return false
}

// Decide applies DESIGN.md step 3. A broker is declared failed only when all
// of these hold:
//
//  1. at least Quorum voters observe it suspect or dead (committed);
//  2. the leader has seen that quorum continuously for failure_timeout
//     (plus restart_grace when the broker left gracefully), measured from
//     when the leader first saw the quorum, never from before its election;
//  3. its lease expired at least drift_margin ago on the leader's clock;
//  4. it is not in maintenance, fenced, or already failed or recovering;
//  5. automatic failover is not frozen: it freezes while at least two and
//     more than max_failed_fraction of the eligible brokers are suspected by
//     a quorum (a partition of the coordinators, not a mass death);
//  6. fewer than max_concurrent_recoveries recoveries run;
//  7. it was not recovered within cooldown without an operator ack since.
//
// With dry_run the decision is made once per epoch with DeclareFailed.DryRun
// set. Decide is pure: same input, same decision.
func Decide(in Input) Decision {
	p := in.Policy
	mem := Memory{
		QuorumSince:      map[string]Since{},
		Frozen:           in.Memory.Frozen,
		CooldownRecorded: map[string]uint64{},
		DryRunDone:       map[string]uint64{},
	}
	d := Decision{Holds: map[string]string{}}
	quorum := Quorum(p, len(in.Voters))

	type candidate struct {
		b         *waldenv1.Broker
		obs       []*waldenv1.Observation
		suspectMs int64
		leaseMs   int64
		timeout   time.Duration
	}
	var (
		total, suspected int
		ready            []candidate
	)
	brokers := slices.Clone(in.Brokers)
	slices.SortFunc(brokers, func(a, b *waldenv1.Broker) int { return strings.Compare(a.GetBrokerId(), b.GetBrokerId()) })
	for _, b := range brokers {
		id, epoch := b.GetBrokerId(), b.GetEpoch()
		if e, ok := in.Memory.CooldownRecorded[id]; ok && e == epoch {
			mem.CooldownRecorded[id] = e
		}
		if e, ok := in.Memory.DryRunDone[id]; ok && e == epoch {
			mem.DryRunDone[id] = e
		}
		if !eligible(b) {
			continue
		}
		total++
		obs := suspecting(b, in.Voters)
		if len(obs) == 0 {
			continue
		}
		if len(obs) < quorum {
			d.Holds[id] = HoldQuorum
			continue
		}
		suspected++
		since, ok := in.Memory.QuorumSince[id]
		if !ok || since.Epoch != epoch {
			since = Since{Epoch: epoch, At: in.Now}
		}
		if since.At.Before(in.LeaderSince) {
			since.At = in.LeaderSince
		}
		mem.QuorumSince[id] = since
		timeout := time.Duration(p.GetFailureTimeoutMs()) * time.Millisecond
		if leftGracefully(b) {
			timeout += time.Duration(p.GetRestartGraceMs()) * time.Millisecond
		}
		suspectFor := in.Now.Sub(since.At)
		if suspectFor < timeout {
			d.Holds[id] = HoldTimeout
			continue
		}
		expiry, ok := in.LeaseExpiry[id]
		if !ok {
			expiry = in.LeaderSince.Add(time.Duration(p.GetLeaseTtlMs()) * time.Millisecond)
		}
		expiredFor := in.Now.Sub(expiry)
		if expiredFor < time.Duration(p.GetDriftMarginMs())*time.Millisecond {
			d.Holds[id] = HoldLease
			continue
		}
		ready = append(ready, candidate{b: b, obs: obs, suspectMs: suspectFor.Milliseconds(), leaseMs: expiredFor.Milliseconds(), timeout: timeout})
	}

	frozen := suspected >= 2 && float64(suspected) > p.GetMaxFailedFraction()*float64(total)
	if frozen != mem.Frozen {
		kind, msg := EventUnfreeze, fmt.Sprintf("automatic failover resumed: %d of %d brokers suspected", suspected, total)
		if frozen {
			kind, msg = EventFreeze, fmt.Sprintf("automatic failover frozen: %d of %d brokers suspected by a quorum, more than max_failed_fraction %g (a partition of the coordinators is more likely than a mass death)", suspected, total, p.GetMaxFailedFraction())
		}
		d.Events = append(d.Events, &waldenv1.Event{Kind: kind, Message: msg, Actor: in.LeaderID})
		mem.Frozen = frozen
	}

	running := in.RunningRecoveries
	for _, c := range ready {
		b := c.b
		id, epoch := b.GetBrokerId(), b.GetEpoch()
		if frozen {
			d.Holds[id] = HoldFrozen
			continue
		}
		if b.GetRecoveredUnixMs() > 0 && b.GetAckedUnixMs() < b.GetRecoveredUnixMs() &&
			in.NowUnixMs-b.GetRecoveredUnixMs() < p.GetCooldownMs() {
			d.Holds[id] = HoldCooldown
			if mem.CooldownRecorded[id] != epoch && !b.GetCooldownBlocked() {
				d.Events = append(d.Events, &waldenv1.Event{
					Kind: EventCooldown, BrokerId: id, Actor: in.LeaderID,
					Message: fmt.Sprintf("broker %s looks failed again %s after its recovery, within cooldown %s: automatic failover waits for `waldenctl ack %s`",
						id, time.Duration(in.NowUnixMs-b.GetRecoveredUnixMs())*time.Millisecond, time.Duration(p.GetCooldownMs())*time.Millisecond, id),
				})
			}
			mem.CooldownRecorded[id] = epoch
			continue
		}
		if p.GetDryRun() && mem.DryRunDone[id] == epoch {
			d.Holds[id] = HoldDryRunDone
			continue
		}
		if !p.GetDryRun() && running >= int(p.GetMaxConcurrentRecoveries()) {
			d.Holds[id] = HoldConcurrency
			continue
		}
		ev := &waldenv1.Evidence{
			Observations:      cloneObs(c.obs),
			SuspicionQuorum:   uint32(quorum),
			FailureTimeoutMs:  c.timeout.Milliseconds(),
			SuspectForMs:      c.suspectMs,
			LeaseExpiredForMs: c.leaseMs,
			BrokersTotal:      uint32(total),
			BrokersSuspected:  uint32(suspected),
			RunningRecoveries: uint32(running),
			Reason:            fmt.Sprintf("%d of %d coordinators observe it suspect or dead for %dms (timeout %dms); lease expired %dms ago", len(c.obs), len(in.Voters), c.suspectMs, c.timeout.Milliseconds(), c.leaseMs),
			DecidedBy:         in.LeaderID,
		}
		d.Declare = append(d.Declare, &waldenv1.DeclareFailed{
			BrokerId:    id,
			Epoch:       epoch,
			Evidence:    ev,
			DryRun:      p.GetDryRun(),
			LiveMembers: slices.Clone(in.LiveMembers),
		})
		if p.GetDryRun() {
			mem.DryRunDone[id] = epoch
		} else {
			running++
		}
	}
	d.Memory = mem
	return d
}

func cloneObs(in []*waldenv1.Observation) []*waldenv1.Observation {
	out := make([]*waldenv1.Observation, len(in))
	for i, o := range in {
		out[i] = proto.Clone(o).(*waldenv1.Observation)
	}
	return out
}
