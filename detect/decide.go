package detect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// reasonLeft is the prefix of an observation reason that says the broker's
// agent left the gossip pool gracefully (restart_grace applies).
const reasonLeft = "gossip: left"

// Input is everything Decide looks at. Times are readings of the leader's
// boot clock, except NowUnixMs, which is only compared with the wall-clock
// recovery times of the replicated state for the cooldown (minutes, so a
// clock skew of seconds is harmless).
type Input struct {
	// Now is the leader's current boot-clock time.
	Now time.Time
	// NowUnixMs is the leader's wall clock, for the cooldown only.
	NowUnixMs int64
	// LeaderSince is when this member became leader of the current term.
	LeaderSince time.Time
	// LeaderID and Term identify the deciding leader (evidence and logs);
	// every decision carries Term, and the state machine applies it only in
	// that term.
	LeaderID string
	Term     uint64
	// Policy is the cluster's effective policy.
	Policy *waldenv1.Policy
	// Voters are the voting members; only their observations count, a
	// majority of them is the default suspicion quorum and the number of
	// attestations a decision needs.
	Voters []string
	// LiveMembers are the members the leader sees active (itself included):
	// the candidates for a recovery job.
	LiveMembers []string
	// Brokers is the committed broker registry.
	Brokers []*waldenv1.Broker
	// RunningRecoveries is the number of pending or running recovery jobs.
	RunningRecoveries int
	// Memory is what Decide returned last time (the zero value for a new
	// leader).
	Memory Memory
}

// Memory is the decider's state between two calls of Decide. It lives only
// in the leader's memory: a new leader starts from the zero value, so every
// silence it judges is measured from no earlier than its election, and a
// leader change can only lengthen a wait, never shorten it.
type Memory struct {
	// Seen maps the raft index of a committed observation to when this
	// leader first saw it. An observer's silence is the silence it reported
	// plus the time since then: never more than the real silence.
	Seen map[uint64]time.Time
	// Frozen is set while automatic failover is frozen; CalmSince is when
	// the number of suspected brokers last fell to the resume threshold
	// (zero while above it).
	Frozen    bool
	CalmSince time.Time
	// CooldownRecorded holds the epoch for which a cooldown event was
	// recorded per broker.
	CooldownRecorded map[string]uint64
	// DryRunDone holds the epoch for which a dry-run decision was made per
	// broker.
	DryRunDone map[string]uint64
}

// Decision is what Decide concluded.
type Decision struct {
	// Declare are the failover decisions to propose, one per broker.
	Declare []*waldenv1.DeclareFailed
	// Events are freeze / unfreeze / cooldown events to propose.
	Events []*waldenv1.Event
	// Holds explain, per suspected or requested broker, why it was not
	// declared failed (Hold* values); HoldDetails say it in a sentence.
	Holds       map[string]string
	HoldDetails map[string]string
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

// FreezeResumeFraction is the share of max_failed_fraction below which a
// frozen automatic failover may resume (with FreezeHold): resuming only well
// below the threshold keeps a count hovering around it from flipping the
// freeze on and off.
const FreezeResumeFraction = 0.5

// FreezeHold returns how long the suspected count must stay at or below the
// resume threshold before a freeze lifts: two failure timeouts, so that
// brokers starved by the same cause have time to be heard again.
func FreezeHold(p *waldenv1.Policy) time.Duration {
	return 2 * time.Duration(p.GetFailureTimeoutMs()) * time.Millisecond
}

// eligible reports whether automatic detection applies to b at all.
func eligible(b *waldenv1.Broker) bool {
	if b.GetFenced() || b.GetMaintenance() {
		return false
	}
	switch b.GetBrokerState() {
	case waldenv1.BrokerState_BROKER_STATE_FAILED, waldenv1.BrokerState_BROKER_STATE_RECOVERING, waldenv1.BrokerState_BROKER_STATE_RECOVERED, waldenv1.BrokerState_BROKER_STATE_MAINTENANCE:
		return false
	}
	return true
}

// current returns the voters' observations of b made at its current epoch.
func current(b *waldenv1.Broker, voters []string) []*waldenv1.Observation {
	var out []*waldenv1.Observation
	for _, o := range b.GetObservations() {
		if o.GetEpoch() == b.GetEpoch() && slices.Contains(voters, o.GetObserverId()) {
			out = append(out, o)
		}
	}
	return out
}

// Attested returns the voters that attest that their lease grant for b's
// current epoch expired.
func Attested(b *waldenv1.Broker, voters []string) []string {
	var out []string
	for _, o := range current(b, voters) {
		if o.GetLeaseExpired() {
			out = append(out, o.GetObserverId())
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

// silence returns how long the observer of o has not heard the broker, as
// far as this leader can tell: the silence it reported plus the time since
// this leader first saw the observation.
func silence(o *waldenv1.Observation, seen map[uint64]time.Time, now time.Time) time.Duration {
	return time.Duration(o.GetUnheardForMs())*time.Millisecond + now.Sub(seen[o.GetIndex()])
}

// Decide applies DESIGN.md step 3. A broker is declared failed only when all
// of these hold:
//
//  1. at least Quorum voters observe it suspect or dead at its epoch, and
//     have not heard from it for failure_timeout (plus restart_grace when it
//     left gracefully): the silence each reported, plus the time since this
//     leader saw the observation;
//  2. a majority of the voters attest that their lease grant for the epoch
//     expired (the state machine checks this again when it applies the
//     decision);
//  3. it is not in maintenance, fenced, or already failed or recovering;
//  4. automatic failover is not frozen: it freezes while at least two and
//     more than max_failed_fraction of the eligible brokers are suspected by
//     a quorum, and resumes only once that count stayed at or below half
//     the threshold for FreezeHold;
//  5. fewer than max_concurrent_recoveries recoveries run;
//  6. it was not recovered within cooldown without an operator ack since.
//
// A broker whose failover an operator requested at its epoch is declared
// failed (manual) as soon as 2 holds, whatever the other gates say. With
// dry_run an automatic decision is made once per epoch with DryRun set.
// Decide is pure: same input, same decision.
func Decide(in Input) Decision {
	p := in.Policy
	mem := Memory{
		Seen:             map[uint64]time.Time{},
		Frozen:           in.Memory.Frozen,
		CalmSince:        in.Memory.CalmSince,
		CooldownRecorded: map[string]uint64{},
		DryRunDone:       map[string]uint64{},
	}
	d := Decision{Holds: map[string]string{}, HoldDetails: map[string]string{}}
	hold := func(id, reason, format string, args ...any) {
		d.Holds[id] = reason
		d.HoldDetails[id] = fmt.Sprintf(format, args...)
	}
	quorum := Quorum(p, len(in.Voters))
	majority := len(in.Voters)/2 + 1

	type candidate struct {
		b         *waldenv1.Broker
		obs       []*waldenv1.Observation
		silentFor time.Duration
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
		obs := current(b, in.Voters)
		for _, o := range obs {
			at, ok := in.Memory.Seen[o.GetIndex()]
			if !ok {
				at = in.Now
			}
			if at.Before(in.LeaderSince) {
				at = in.LeaderSince
			}
			mem.Seen[o.GetIndex()] = at
		}
		if b.GetFenced() {
			continue
		}
		attested := Attested(b, in.Voters)
		if fr := b.GetFailoverRequested(); fr != nil && fr.GetEpoch() == epoch {
			if len(attested) < majority {
				hold(id, HoldLease, "manual failover requested: %d of %d coordinators attest its lease expired, %d needed",
					len(attested), len(in.Voters), majority)
				continue
			}
			d.Declare = append(d.Declare, declaration(in, mem.Seen, b, obs, quorum, 0, 0,
				&waldenv1.Evidence{Manual: true, Reason: withReason("manual failover", fr.GetReason()), RequestedBy: fr.GetActor()}, false))
			continue
		}
		if !eligible(b) {
			continue
		}
		total++
		var suspects []*waldenv1.Observation
		for _, o := range obs {
			if s := o.GetObservationState(); s == waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT || s == waldenv1.ObservationState_OBSERVATION_STATE_DEAD {
				suspects = append(suspects, o)
			}
		}
		if len(suspects) == 0 {
			continue
		}
		if len(suspects) < quorum {
			hold(id, HoldQuorum, "%d of %d coordinators observe it suspect or dead, %d needed", len(suspects), len(in.Voters), quorum)
			continue
		}
		suspected++
		timeout := time.Duration(p.GetFailureTimeoutMs()) * time.Millisecond
		if leftGracefully(b) {
			timeout += time.Duration(p.GetRestartGraceMs()) * time.Millisecond
		}
		// The quorum-th longest silence: that many observers have not heard
		// the broker for at least this long.
		silences := make([]time.Duration, len(suspects))
		for i, o := range suspects {
			silences[i] = silence(o, mem.Seen, in.Now)
		}
		slices.Sort(silences)
		slices.Reverse(silences)
		silentFor := silences[quorum-1]
		if silentFor < timeout {
			hold(id, HoldTimeout, "%d coordinators have not heard it for %s, failure_timeout is %s", quorum, silentFor.Round(time.Millisecond), timeout)
			continue
		}
		if len(attested) < majority {
			hold(id, HoldLease, "%d of %d coordinators attest its lease expired, %d needed", len(attested), len(in.Voters), majority)
			continue
		}
		ready = append(ready, candidate{b: b, obs: obs, silentFor: silentFor, timeout: timeout})
	}

	threshold := p.GetMaxFailedFraction() * float64(total)
	over := suspected >= 2 && float64(suspected) > threshold
	calm := float64(suspected) <= FreezeResumeFraction*threshold || suspected < 2
	switch {
	case over:
		mem.CalmSince = time.Time{}
	case calm && mem.CalmSince.IsZero():
		mem.CalmSince = in.Now
	case !calm:
		mem.CalmSince = time.Time{}
	}
	frozen := mem.Frozen
	if !frozen && over {
		frozen = true
		d.Events = append(d.Events, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_FREEZE, Actor: in.LeaderID, Message: fmt.Sprintf(
			"automatic failover frozen: %d of %d brokers suspected by a quorum, more than max_failed_fraction %g (a partition of the coordinators is more likely than a mass death)",
			suspected, total, p.GetMaxFailedFraction())})
	} else if frozen && !mem.CalmSince.IsZero() && in.Now.Sub(mem.CalmSince) >= FreezeHold(p) {
		frozen = false
		d.Events = append(d.Events, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_UNFREEZE, Actor: in.LeaderID, Message: fmt.Sprintf(
			"automatic failover resumed: %d of %d brokers suspected, at most %g%% of max_failed_fraction for %s",
			suspected, total, FreezeResumeFraction*100, FreezeHold(p))})
	}
	mem.Frozen = frozen

	running := in.RunningRecoveries
	for _, c := range ready {
		b := c.b
		id, epoch := b.GetBrokerId(), b.GetEpoch()
		if frozen {
			hold(id, HoldFrozen, "automatic failover is frozen: %d of %d brokers look failed", suspected, total)
			continue
		}
		if b.GetRecoveredUnixMs() > 0 && b.GetAckedUnixMs() < b.GetRecoveredUnixMs() &&
			in.NowUnixMs-b.GetRecoveredUnixMs() < p.GetCooldownMs() {
			ago := time.Duration(in.NowUnixMs-b.GetRecoveredUnixMs()) * time.Millisecond
			hold(id, HoldCooldown, "recovered %s ago, within cooldown %s: waits for `waldenctl ack %s`", ago, time.Duration(p.GetCooldownMs())*time.Millisecond, id)
			if mem.CooldownRecorded[id] != epoch && !b.GetCooldownBlocked() {
				d.Events = append(d.Events, &waldenv1.Event{
					EventKind: waldenv1.EventKind_EVENT_KIND_COOLDOWN, BrokerId: id, Actor: in.LeaderID,
					Message: fmt.Sprintf("broker %s looks failed again %s after its recovery, within cooldown %s: automatic failover waits for `waldenctl ack %s`",
						id, ago, time.Duration(p.GetCooldownMs())*time.Millisecond, id),
				})
			}
			mem.CooldownRecorded[id] = epoch
			continue
		}
		if p.GetDryRun() && mem.DryRunDone[id] == epoch {
			hold(id, HoldDryRunDone, "dry_run: the decision for epoch %d is recorded", epoch)
			continue
		}
		if !p.GetDryRun() && running >= int(p.GetMaxConcurrentRecoveries()) {
			hold(id, HoldConcurrency, "%d recoveries run, max_concurrent_recoveries is %d", running, p.GetMaxConcurrentRecoveries())
			continue
		}
		ev := &waldenv1.Evidence{Reason: fmt.Sprintf("%d of %d coordinators have not heard it for %dms (timeout %dms); %d attest its lease expired",
			quorum, len(in.Voters), c.silentFor.Milliseconds(), c.timeout.Milliseconds(), len(Attested(b, in.Voters)))}
		d.Declare = append(d.Declare, declaration(in, mem.Seen, b, c.obs, quorum, c.silentFor, c.timeout, ev, p.GetDryRun()))
		if p.GetDryRun() {
			mem.DryRunDone[id] = epoch
		} else {
			running++
		}
	}
	for _, df := range d.Declare {
		df.Evidence.RunningRecoveries = uint32(in.RunningRecoveries)
		df.Evidence.BrokersTotal, df.Evidence.BrokersSuspected = uint32(total), uint32(suspected)
	}
	d.Memory = mem
	return d
}

// declaration builds the DeclareFailed entry of b with its evidence: every
// voter's observation at the epoch, with the silence this leader judged.
func declaration(in Input, seen map[uint64]time.Time, b *waldenv1.Broker, obs []*waldenv1.Observation, quorum int,
	silentFor, timeout time.Duration, ev *waldenv1.Evidence, dryRun bool) *waldenv1.DeclareFailed {
	ev.Observations = make([]*waldenv1.Observation, len(obs))
	for i, o := range obs {
		c := proto.Clone(o).(*waldenv1.Observation)
		if o.GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
			c.UnheardForMs = silence(o, seen, in.Now).Milliseconds()
		}
		ev.Observations[i] = c
	}
	ev.SuspicionQuorum = uint32(quorum)
	ev.FailureTimeoutMs = timeout.Milliseconds()
	ev.SuspectForMs = silentFor.Milliseconds()
	ev.DecidedBy = in.LeaderID
	ev.Term = in.Term
	return &waldenv1.DeclareFailed{
		BrokerId:    b.GetBrokerId(),
		Epoch:       b.GetEpoch(),
		Evidence:    ev,
		DryRun:      dryRun,
		LiveMembers: slices.Clone(in.LiveMembers),
		Term:        in.Term,
	}
}

func withReason(msg, reason string) string {
	if reason == "" {
		return msg
	}
	return msg + ": " + reason
}
