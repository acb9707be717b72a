package detect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
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
	// Seen maps the raft index of a committed observation that is not
	// alive to when this leader first saw it. An observer's silence is the
	// silence it reported plus the time since then: never more than the
	// real silence.
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
	out := make([]*waldenv1.Observation, 0, len(b.GetObservations()))
	for _, o := range b.GetObservations() {
		if isCurrent(b, o, voters) {
			out = append(out, o)
		}
	}
	return out
}

// isCurrent says whether o is one of current(b, voters).
func isCurrent(b *waldenv1.Broker, o *waldenv1.Observation, voters []string) bool {
	return o.GetEpoch() == b.GetEpoch() && slices.Contains(voters, o.GetObserverId())
}

// attestedAmong counts the observations of obs that attest the lease
// expired: len(Attested(b, voters)) for obs = current(b, voters).
func attestedAmong(obs []*waldenv1.Observation) int {
	n := 0
	for _, o := range obs {
		if o.GetLeaseExpired() {
			n++
		}
	}
	return n
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
//
// It runs in three steps: the per-broker gates (1 to 3, and the manual
// requests) judge each broker on its own; the freeze (4) looks at how many
// brokers the gates found suspected; admission (4 to 6) lets the brokers
// that passed their gates through, in broker id order.
func Decide(in Input) Decision {
	d := Decision{Holds: map[string]string{}, HoldDetails: map[string]string{}}
	mem := carriedMemory(in)
	g := gateBrokers(in, mem.Seen)
	d.Declare = g.manual
	for _, h := range g.holds {
		d.hold(h)
	}
	fr := nextFreeze(in.Policy, freezeState{Frozen: in.Memory.Frozen, CalmSince: in.Memory.CalmSince}, g.counts, in.Now)
	mem.Frozen, mem.CalmSince = fr.state.Frozen, fr.state.CalmSince
	if fr.change != waldenv1.EventKind_EVENT_KIND_UNSPECIFIED {
		d.Events = append(d.Events, freezeEvent(fr.change, in.LeaderID, in.Policy, g.counts))
	}
	d.admitReady(in, &mem, g)
	for _, df := range d.Declare {
		df.Evidence.RunningRecoveries = uint32(in.RunningRecoveries)
		df.Evidence.BrokersTotal, df.Evidence.BrokersSuspected = uint32(g.counts.total), uint32(g.counts.suspected)
	}
	d.Memory = mem
	return d
}

// admitReady runs admission on the brokers that passed their gates, in
// broker id order, each seeing the recoveries admitted before it, and
// records in mem the cooldown events and dry-run decisions it made.
func (d *Decision) admitReady(in Input, mem *Memory, g gated) {
	running := in.RunningRecoveries
	for _, c := range g.ready {
		id, epoch := c.b.GetBrokerId(), c.b.GetEpoch()
		a := admit(in, c, admissionState{
			frozen:           mem.Frozen,
			running:          running,
			cooldownRecorded: mem.CooldownRecorded[id] == epoch,
			dryRunDone:       mem.DryRunDone[id] == epoch,
		}, g.counts)
		if a.hold != nil {
			d.hold(*a.hold)
		}
		if a.event != nil {
			d.Events = append(d.Events, a.event)
		}
		if a.cooldown {
			mem.CooldownRecorded[id] = epoch
		}
		if !a.admitted {
			continue
		}
		d.Declare = append(d.Declare, declaration(in, mem.Seen, c.b, c.obs, c.quorum, c.silentFor, c.timeout, c.evidence(), in.Policy.GetDryRun()))
		if in.Policy.GetDryRun() {
			mem.DryRunDone[id] = epoch
		} else {
			running++
		}
	}
}

// hold is why one broker was not declared failed: a Hold* reason and the
// sentence that says it.
type hold struct {
	broker, reason, detail string
}

func holdf(id, reason, format string, args ...any) *hold {
	return &hold{broker: id, reason: reason, detail: fmt.Sprintf(format, args...)}
}

func (d *Decision) hold(h hold) {
	d.Holds[h.broker] = h.reason
	d.HoldDetails[h.broker] = h.detail
}

// carriedMemory is the memory this call starts from: the cooldown and
// dry-run records of brokers still at the epoch they were made for, and
// when this leader first saw each current observation that is not alive
// (never before its election).
//
// Only those are remembered: an observer's silence is read for suspect and
// dead observations alone (quorumSilence, declaration), and an observation
// never changes state at its index (a new state is a new entry, at a new
// index), so the first sight of an alive one is never asked for. In a
// healthy fleet the map is empty, where remembering every observation was
// most of what a decision cost at a thousand brokers.
func carriedMemory(in Input) Memory {
	// Sized as the memory carried in: a leader decides every 150ms over
	// every broker, and growing these maps entry by entry was most of what
	// a decision cost at a thousand brokers.
	mem := Memory{
		Seen:             make(map[uint64]time.Time, len(in.Memory.Seen)),
		Frozen:           in.Memory.Frozen,
		CalmSince:        in.Memory.CalmSince,
		CooldownRecorded: make(map[string]uint64, len(in.Memory.CooldownRecorded)),
		DryRunDone:       make(map[string]uint64, len(in.Memory.DryRunDone)),
	}
	for _, b := range in.Brokers {
		id, epoch := b.GetBrokerId(), b.GetEpoch()
		if e, ok := in.Memory.CooldownRecorded[id]; ok && e == epoch {
			mem.CooldownRecorded[id] = e
		}
		if e, ok := in.Memory.DryRunDone[id]; ok && e == epoch {
			mem.DryRunDone[id] = e
		}
		for _, o := range b.GetObservations() {
			if o.GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE && isCurrent(b, o, in.Voters) {
				mem.Seen[o.GetIndex()] = firstSeen(in.Memory.Seen, o.GetIndex(), in.Now, in.LeaderSince)
			}
		}
	}
	return mem
}

// firstSeen is when this leader first saw the observation at index: as
// remembered, or now for a new one, and never before its election.
func firstSeen(seen map[uint64]time.Time, index uint64, now, leaderSince time.Time) time.Time {
	at, ok := seen[index]
	if !ok {
		at = now
	}
	if at.Before(leaderSince) {
		at = leaderSince
	}
	return at
}

// counts are the brokers the freeze looks at: those automatic detection
// applies to, and those of them a quorum suspects.
type counts struct {
	total, suspected int
}

// candidate is a broker that passed its per-broker gates: suspected by a
// quorum silent for its timeout, its lease attested expired by a majority.
type candidate struct {
	b         *waldenv1.Broker
	obs       []*waldenv1.Observation
	quorum    int
	voters    int
	attested  int
	silentFor time.Duration
	timeout   time.Duration
}

// evidence is the reason an automatic decision gives.
func (c candidate) evidence() *waldenv1.Evidence {
	return &waldenv1.Evidence{Reason: fmt.Sprintf("%d of %d coordinators have not heard it for %dms (timeout %dms); %d attest its lease expired",
		c.quorum, c.voters, c.silentFor.Milliseconds(), c.timeout.Milliseconds(), c.attested)}
}

// gated is what the per-broker gates concluded about every broker, in
// broker id order.
type gated struct {
	manual []*waldenv1.DeclareFailed
	ready  []candidate
	holds  []hold
	counts counts
}

// gateBrokers runs the per-broker gates on every broker, in broker id order.
func gateBrokers(in Input, seen map[uint64]time.Time) gated {
	var g gated
	byID := func(a, b *waldenv1.Broker) int { return strings.Compare(a.GetBrokerId(), b.GetBrokerId()) }
	brokers := in.Brokers
	if !slices.IsSortedFunc(brokers, byID) { // the registry hands them sorted
		brokers = slices.Clone(brokers)
		slices.SortFunc(brokers, byID)
	}
	for _, b := range brokers {
		v := gateBroker(in, seen, b)
		if v.eligible {
			g.counts.total++
		}
		if v.suspected {
			g.counts.suspected++
		}
		if v.hold != nil {
			g.holds = append(g.holds, *v.hold)
		}
		if v.manual != nil {
			g.manual = append(g.manual, v.manual)
		}
		if v.ready != nil {
			g.ready = append(g.ready, *v.ready)
		}
	}
	return g
}

// verdict is what the per-broker gates concluded about one broker: at most
// one of manual, ready and hold is set.
type verdict struct {
	// eligible: automatic detection applies to it (it counts in the freeze's
	// total); suspected: a quorum observes it suspect or dead.
	eligible, suspected bool
	// manual is the declaration of an operator's request whose lease gate
	// holds.
	manual *waldenv1.DeclareFailed
	// ready is a broker that passed every per-broker gate.
	ready *candidate
	hold  *hold
}

// gateBroker judges one broker on its own: an operator's request needs the
// lease attestations only; otherwise the broker must be eligible, suspected
// by a quorum, silent for its timeout and its lease attested expired by a
// majority.
func gateBroker(in Input, seen map[uint64]time.Time, b *waldenv1.Broker) verdict {
	if b.GetFenced() {
		return verdict{}
	}
	if b.GetFailoverRequested() == nil && eligible(b) && !suspectedBy(b, in.Voters) {
		// What the gates below conclude of a healthy broker, without
		// gathering its observations: most of a fleet, every 150 ms.
		return verdict{eligible: true}
	}
	id := b.GetBrokerId()
	quorum, majority := Quorum(in.Policy, len(in.Voters)), len(in.Voters)/2+1
	obs := current(b, in.Voters)
	attested := attestedAmong(obs)
	if fr := b.GetFailoverRequested(); fr != nil && fr.GetEpoch() == b.GetEpoch() {
		if attested < majority {
			return verdict{hold: holdf(id, HoldLease, "manual failover requested: %d of %d coordinators attest its lease expired, %d needed",
				attested, len(in.Voters), majority)}
		}
		return verdict{manual: declaration(in, seen, b, obs, quorum, 0, 0,
			&waldenv1.Evidence{Manual: true, Reason: withReason("manual failover", fr.GetReason()), RequestedBy: fr.GetActor()}, false)}
	}
	if !eligible(b) {
		return verdict{}
	}
	suspects := suspecting(obs)
	switch {
	case len(suspects) == 0:
		return verdict{eligible: true}
	case len(suspects) < quorum:
		return verdict{eligible: true, hold: holdf(id, HoldQuorum, "%d of %d coordinators observe it suspect or dead, %d needed",
			len(suspects), len(in.Voters), quorum)}
	}
	timeout := failureTimeout(in.Policy, b)
	silentFor := quorumSilence(suspects, quorum, seen, in.Now)
	switch {
	case silentFor < timeout:
		return verdict{eligible: true, suspected: true, hold: holdf(id, HoldTimeout, "%d coordinators have not heard it for %s, failure_timeout is %s",
			quorum, silentFor.Round(time.Millisecond), timeout)}
	case attested < majority:
		return verdict{eligible: true, suspected: true, hold: holdf(id, HoldLease, "%d of %d coordinators attest its lease expired, %d needed",
			attested, len(in.Voters), majority)}
	}
	return verdict{eligible: true, suspected: true, ready: &candidate{b: b, obs: obs, quorum: quorum, voters: len(in.Voters),
		attested: attested, silentFor: silentFor, timeout: timeout}}
}

// suspectedBy reports whether a voter's current observation of b says
// suspect or dead: whether suspecting(current(b, voters)) is not empty.
func suspectedBy(b *waldenv1.Broker, voters []string) bool {
	for _, o := range b.GetObservations() {
		if isSuspecting(o) && isCurrent(b, o, voters) {
			return true
		}
	}
	return false
}

// isSuspecting reports whether o says suspect or dead.
func isSuspecting(o *waldenv1.Observation) bool {
	s := o.GetObservationState()
	return s == waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT || s == waldenv1.ObservationState_OBSERVATION_STATE_DEAD
}

// suspecting returns the observations that say suspect or dead.
func suspecting(obs []*waldenv1.Observation) []*waldenv1.Observation {
	var out []*waldenv1.Observation
	for _, o := range obs {
		if isSuspecting(o) {
			out = append(out, o)
		}
	}
	return out
}

// failureTimeout is how long a quorum must not have heard b: failure_timeout,
// plus restart_grace when it left gracefully.
func failureTimeout(p *waldenv1.Policy, b *waldenv1.Broker) time.Duration {
	timeout := time.Duration(p.GetFailureTimeoutMs()) * time.Millisecond
	if leftGracefully(b) {
		timeout += time.Duration(p.GetRestartGraceMs()) * time.Millisecond
	}
	return timeout
}

// quorumSilence is the quorum-th longest silence of the suspects: that many
// observers have not heard the broker for at least this long. There are at
// least quorum suspects.
func quorumSilence(suspects []*waldenv1.Observation, quorum int, seen map[uint64]time.Time, now time.Time) time.Duration {
	silences := make([]time.Duration, len(suspects))
	for i, o := range suspects {
		silences[i] = silence(o, seen, now)
	}
	slices.Sort(silences)
	slices.Reverse(silences)
	return silences[quorum-1]
}

// freezeState is whether automatic failover is frozen, and since when the
// suspected count stayed at or below the resume threshold (zero while above
// it).
type freezeState struct {
	Frozen    bool
	CalmSince time.Time
}

// freezeStep is the freeze's next state and the event its change records
// (EVENT_KIND_FREEZE, EVENT_KIND_UNFREEZE, or unspecified for none).
type freezeStep struct {
	state  freezeState
	change waldenv1.EventKind
}

// nextFreeze decides the freeze from the counts of this call: it freezes
// while at least two and more than max_failed_fraction of the eligible
// brokers are suspected, and lifts once the count stayed at or below
// FreezeResumeFraction of that threshold (or under two) for FreezeHold.
func nextFreeze(p *waldenv1.Policy, prev freezeState, c counts, now time.Time) freezeStep {
	threshold := p.GetMaxFailedFraction() * float64(c.total)
	over := c.suspected >= 2 && float64(c.suspected) > threshold
	calm := float64(c.suspected) <= FreezeResumeFraction*threshold || c.suspected < 2
	next := prev
	switch {
	case over || !calm:
		next.CalmSince = time.Time{}
	case next.CalmSince.IsZero():
		next.CalmSince = now
	}
	switch {
	case !prev.Frozen && over:
		next.Frozen = true
		return freezeStep{state: next, change: waldenv1.EventKind_EVENT_KIND_FREEZE}
	case prev.Frozen && !next.CalmSince.IsZero() && now.Sub(next.CalmSince) >= FreezeHold(p):
		next.Frozen = false
		return freezeStep{state: next, change: waldenv1.EventKind_EVENT_KIND_UNFREEZE}
	}
	return freezeStep{state: next}
}

// freezeEvent is the event that records a freeze or its lifting: the
// counts and the policy's fraction as fields, with the message rendered
// from them (which a member of an older walden keeps as it is).
func freezeEvent(kind waldenv1.EventKind, leader string, p *waldenv1.Policy, c counts) *waldenv1.Event {
	d := &waldenv1.EventDetail{Suspected: uint32(c.suspected), Eligible: uint32(c.total), MaxFailedFraction: p.GetMaxFailedFraction()}
	if kind == waldenv1.EventKind_EVENT_KIND_UNFREEZE {
		d.ResumeFraction, d.DurationMs = FreezeResumeFraction, FreezeHold(p).Milliseconds()
	}
	return renderedEvent(&waldenv1.Event{EventKind: kind, Actor: leader, Detail: d})
}

// renderedEvent is e with its message rendered from its fields, as the
// state machine renders it when it applies the event.
func renderedEvent(e *waldenv1.Event) *waldenv1.Event {
	e.Message = fsm.EventMessage(e)
	return e
}

// admissionState is what admission knows of the decisions around one
// candidate: the freeze, the recoveries running (those already admitted in
// this call included), and whether a cooldown event or a dry-run decision
// was already recorded at the broker's epoch.
type admissionState struct {
	frozen           bool
	running          int
	cooldownRecorded bool
	dryRunDone       bool
}

// admission is whether a candidate is declared failed, or the hold that
// stops it; a cooldown hold also says so (cooldown), with the event to
// record the first time at an epoch.
type admission struct {
	admitted bool
	hold     *hold
	cooldown bool
	event    *waldenv1.Event
}

// admit lets a candidate through the gates that look beyond it: the freeze,
// the cooldown after a recovery not acknowledged, a dry-run decision
// already made at its epoch, and max_concurrent_recoveries.
func admit(in Input, c candidate, st admissionState, n counts) admission {
	p, b := in.Policy, c.b
	id, epoch := b.GetBrokerId(), b.GetEpoch()
	switch {
	case st.frozen:
		return admission{hold: holdf(id, HoldFrozen, "automatic failover is frozen: %d of %d brokers look failed", n.suspected, n.total)}
	case inCooldown(p, b, in.NowUnixMs):
		ago := time.Duration(in.NowUnixMs-b.GetRecoveredUnixMs()) * time.Millisecond
		cooldown := time.Duration(p.GetCooldownMs()) * time.Millisecond
		a := admission{cooldown: true, hold: holdf(id, HoldCooldown, "recovered %s ago, within cooldown %s: waits for `waldenctl ack %s`", ago, cooldown, id)}
		if !st.cooldownRecorded && !b.GetCooldownBlocked() {
			a.event = renderedEvent(&waldenv1.Event{
				EventKind: waldenv1.EventKind_EVENT_KIND_COOLDOWN, BrokerId: id, Actor: in.LeaderID,
				Detail: &waldenv1.EventDetail{Epoch: epoch, DurationMs: ago.Milliseconds(), CooldownMs: p.GetCooldownMs()},
			})
		}
		return a
	case p.GetDryRun() && st.dryRunDone:
		return admission{hold: holdf(id, HoldDryRunDone, "dry_run: the decision for epoch %d is recorded", epoch)}
	case !p.GetDryRun() && st.running >= int(p.GetMaxConcurrentRecoveries()):
		return admission{hold: holdf(id, HoldConcurrency, "%d recoveries run, max_concurrent_recoveries is %d", st.running, p.GetMaxConcurrentRecoveries())}
	}
	return admission{admitted: true}
}

// inCooldown reports whether b was recovered within the cooldown and no
// operator acknowledged it since.
func inCooldown(p *waldenv1.Policy, b *waldenv1.Broker, nowUnixMs int64) bool {
	return b.GetRecoveredUnixMs() > 0 && b.GetAckedUnixMs() < b.GetRecoveredUnixMs() &&
		nowUnixMs-b.GetRecoveredUnixMs() < p.GetCooldownMs()
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
