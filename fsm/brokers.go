package fsm

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"walden/fencing"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// invalid returns a refusal of a malformed command naming the field.
func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, refusal.ErrInvalidArgument)...)
}

// unknownBroker returns the refusal for a broker id that is not registered.
func unknownBroker(op, id string) error {
	return fmt.Errorf("%s: broker %q: %w", op, id, refusal.ErrUnknownNode)
}

// applyRegisterBroker registers a broker (again): a new epoch, unfenced,
// observations reset. Refused while a recovery job of the broker is pending
// or running.
func (s *State) applyRegisterBroker(index uint64, cmd *waldenv1.Command, op *waldenv1.RegisterBroker) (*waldenv1.Result, error) {
	id := op.GetBrokerId()
	if id == "" {
		return nil, invalid("register broker: broker_id is empty")
	}
	if a := op.GetAutomq(); a != nil && (a.GetNodeId() < 0 || a.GetNodeEpoch() < 0) {
		return nil, invalid("register broker %q: automq node_id %d and node_epoch %d must not be negative", id, a.GetNodeId(), a.GetNodeEpoch())
	}
	if s.reconcilingLocked() {
		return nil, s.refuseReconciling(fmt.Sprintf("register broker %q", id))
	}
	if j := s.activeJobOf(id); j != nil {
		return nil, fmt.Errorf("register broker %q: job %s is %s: %w", id, j.GetJobId(), j.GetJobState().Name(), refusal.ErrRecoveryRunning)
	}
	b, ok := s.brokers[id]
	from := b.GetBrokerState()
	// Nothing the broker acknowledged before can be left only in its WAL
	// when it had no epoch, or its last one was failed over and recovered.
	prior := !ok
	if ok && b.GetFenced() {
		if j := s.jobs[b.GetLastJobId()]; j != nil && j.GetToken() == b.GetEpoch() && j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED {
			prior = true
		}
	}
	if !ok {
		b = &waldenv1.Broker{BrokerId: id, RecoveredWalOffset: -1}
		s.brokers[id] = b
	}
	epoch := s.issueEpoch()
	if cmd.GetChecks() >= ChecksNeverGranted {
		b.RegisteredIndex = index
		b.PriorRecovered = prior
	}
	b.Epoch = epoch
	b.Fenced = false
	b.LeftGracefully = false
	b.LeaseRemainingMs = -1
	b.AgentAddr = op.GetAgentAddr()
	b.BrokerAddr = op.GetBrokerAddr()
	b.Wal = clone(op.GetWal())
	b.GossipName = op.GetGossipName()
	// An entry of an older walden has no AutoMQ node: the registration
	// replaces the broker's, so a broker no longer AutoMQ's shows none.
	b.Automq = clone(op.GetAutomq())
	b.Observations = nil
	b.FailoverRequested = nil
	b.RegisteredUnixMs = s.now()
	s.deriveState(b)
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_REGISTER, BrokerId: id, Actor: actorOf(op.GetActor(), cmd),
		Detail: &waldenv1.EventDetail{Epoch: epoch, FromState: from, ToState: b.GetBrokerState()}})
	return &waldenv1.Result{Value: &waldenv1.Result_RegisterBroker{RegisterBroker: &waldenv1.RegisterBrokerResult{
		Epoch: epoch, RecoveredWalOffset: b.GetRecoveredWalOffset()}}}, nil
}

// issueEpoch returns the next fencing token.
func (s *State) issueEpoch() uint64 {
	e := s.nextEpoch
	s.nextEpoch++
	return e
}

// applyObserveBroker records one coordinator's observation of a broker at
// its current epoch. It replaces the observer's observation only when
// expected_index names it (0: none yet), so a late proposal never overwrites
// a newer one (an attestation must not reappear after its withdrawal). The
// same state proposed again keeps its since time.
func (s *State) applyObserveBroker(index uint64, cmd *waldenv1.Command, op *waldenv1.ObserveBroker) (*waldenv1.Result, error) {
	switch op.GetObservationState() {
	case waldenv1.ObservationState_OBSERVATION_STATE_ALIVE, waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT,
		waldenv1.ObservationState_OBSERVATION_STATE_DEAD:
	default:
		return nil, invalid("observe broker %q: state %q is not alive, suspect or dead", op.GetBrokerId(), op.GetObservationState().Name())
	}
	if !s.isMember(op.GetObserverId()) {
		return nil, invalid("observe broker %q: observer_id %q is not a member", op.GetBrokerId(), op.GetObserverId())
	}
	b, ok := s.brokers[op.GetBrokerId()]
	if !ok {
		return nil, unknownBroker("observe", op.GetBrokerId())
	}
	if err := fencing.Check(fencing.Token(b.GetEpoch()), b.GetFenced(), fencing.Token(op.GetEpoch())); err != nil {
		return nil, fmt.Errorf("observe broker %q at epoch %d: %w", b.GetBrokerId(), op.GetEpoch(), err)
	}
	var cur *waldenv1.Observation
	for _, o := range b.Observations {
		if o.GetObserverId() == op.GetObserverId() {
			cur = o
		}
	}
	if cur.GetIndex() != op.GetExpectedIndex() {
		return nil, fmt.Errorf("observe broker %q: %s's observation is at index %d, the proposal replaces index %d: %w",
			b.GetBrokerId(), op.GetObserverId(), cur.GetIndex(), op.GetExpectedIndex(), refusal.ErrStaleObservation)
	}
	if cur != nil && cur.GetObservationState() == op.GetObservationState() && cur.GetLeaseExpired() == op.GetLeaseExpired() {
		cur.Reason = op.GetReason()
		cur.Index = index
		cur.UnheardForMs = op.GetUnheardForMs()
		cur.NeverGranted = op.GetLeaseExpired() && op.GetNeverGranted()
		return brokerResult(b), nil
	}
	if cur != nil && cur.GetObservationState() == op.GetObservationState() {
		// Only the attestation changed.
		cur.LeaseExpired = op.GetLeaseExpired()
		cur.NeverGranted = op.GetLeaseExpired() && op.GetNeverGranted()
		cur.Reason = op.GetReason()
		cur.Index = index
		cur.UnheardForMs = op.GetUnheardForMs()
		s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_LEASE, BrokerId: b.GetBrokerId(), Actor: op.GetObserverId(),
			Detail: &waldenv1.EventDetail{Epoch: op.GetEpoch(), Member: op.GetObserverId(), LeaseExpired: op.GetLeaseExpired(),
				ObservationState: cur.GetObservationState(), FromObservationState: cur.GetObservationState(),
				FromState: b.GetBrokerState(), ToState: b.GetBrokerState(), Reason: op.GetReason()}})
		return brokerResult(b), nil
	}
	fromObs, from := cur.GetObservationState(), b.GetBrokerState()
	if cur == nil {
		cur = &waldenv1.Observation{ObserverId: op.GetObserverId()}
		b.Observations = append(b.Observations, cur)
		sort.Slice(b.Observations, func(i, j int) bool {
			return b.Observations[i].GetObserverId() < b.Observations[j].GetObserverId()
		})
	}
	cur.ObservationState = op.GetObservationState()
	cur.SinceUnixMs = s.now()
	cur.Reason = op.GetReason()
	cur.Index = index
	cur.Epoch = op.GetEpoch()
	cur.LeaseExpired = op.GetLeaseExpired()
	cur.NeverGranted = op.GetLeaseExpired() && op.GetNeverGranted()
	cur.UnheardForMs = op.GetUnheardForMs()
	s.deriveState(b)
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_OBSERVATION, BrokerId: b.GetBrokerId(), Actor: op.GetObserverId(),
		Detail: &waldenv1.EventDetail{Epoch: op.GetEpoch(), Member: op.GetObserverId(), ObservationState: op.GetObservationState(),
			FromObservationState: fromObs, LeaseExpired: op.GetLeaseExpired(), FromState: from, ToState: b.GetBrokerState(), Reason: op.GetReason()}})
	return brokerResult(b), nil
}

// applyDeclareFailed applies a failover decision: new epoch, fenced, state
// failed, and a recovery job assigned to one live member. It applies only
// while the broker still has the decided epoch, so at most once per epoch;
// only in the raft term it was decided in (term, the term of the leader that
// appended the entry); and only when a majority of the voters attest that
// their lease grant for the epoch expired, so that no agent can still count
// a majority of live grants (docs/safety.md). A dry run needs neither: it
// changes nothing but the event log. An entry without a term comes from a
// walden that decided on a leader-held lease and is applied by its rules,
// but only in a cluster whose policy was never seeded: that walden never
// seeded one, and every decision of this one carries its term.
func (s *State) applyDeclareFailed(index, term uint64, cmd *waldenv1.Command, op *waldenv1.DeclareFailed) (*waldenv1.Result, error) {
	b, ok := s.brokers[op.GetBrokerId()]
	if !ok {
		return nil, unknownBroker("declare failed", op.GetBrokerId())
	}
	if b.GetFenced() || b.GetEpoch() != op.GetEpoch() {
		return nil, fmt.Errorf("declare broker %q failed at epoch %d: broker epoch %d, fenced %t: %w",
			b.GetBrokerId(), op.GetEpoch(), b.GetEpoch(), b.GetFenced(), refusal.ErrEpochExpired)
	}
	if b.GetMaintenance() && !op.GetEvidence().GetManual() {
		return nil, fmt.Errorf("declare broker %q failed: %w", b.GetBrokerId(), refusal.ErrMaintenance)
	}
	if op.GetTerm() == 0 && !op.GetDryRun() && s.derived.seeded {
		// Only a walden from before quorum leases decided without a term,
		// and none of them seeded a policy: in a seeded cluster such an
		// entry would skip the term check and the attestations.
		return nil, fmt.Errorf("declare broker %q failed at epoch %d without the term it was decided in: a decision "+
			"needs the leader's term and a majority of attestations (only history from before quorum leases has none): %w",
			b.GetBrokerId(), op.GetEpoch(), refusal.ErrInvalidArgument)
	}
	if op.GetTerm() != 0 && op.GetTerm() != term {
		return nil, fmt.Errorf("declare broker %q failed: decided in term %d, appended in term %d: %w",
			b.GetBrokerId(), op.GetTerm(), term, refusal.ErrDecidedInAnotherTerm)
	}
	if op.GetTerm() != 0 && !op.GetDryRun() {
		voters := s.votersLocked()
		attested := attestations(b, voters)
		if need := len(voters)/2 + 1; len(attested) < need {
			return nil, fmt.Errorf("declare broker %q failed at epoch %d: %d of %d voters attest its lease expired (%v), %d needed: %w",
				b.GetBrokerId(), op.GetEpoch(), len(attested), len(voters), attested, need, refusal.ErrLeaseNotExpired)
		}
	}
	actor := op.GetEvidence().GetRequestedBy() // the identity of a manual failover
	if actor == "" {
		actor = op.GetEvidence().GetDecidedBy()
	}
	if actor == "" {
		actor = cmd.GetProposerId()
	}
	ev := clone(op.GetEvidence())
	if op.GetDryRun() {
		s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_DRY_RUN, BrokerId: b.GetBrokerId(), Actor: actor, Evidence: ev,
			Detail: &waldenv1.EventDetail{Epoch: b.GetEpoch(), FromState: b.GetBrokerState(), ToState: b.GetBrokerState(), Reason: ev.GetReason()}})
		return &waldenv1.Result{Value: &waldenv1.Result_DeclareFailed{DeclareFailed: &waldenv1.DeclareFailedResult{DryRun: true}}}, nil
	}
	from := b.GetBrokerState()
	assignee := s.pickAssignee(op.GetLiveMembers(), "")
	token := s.issueEpoch()
	b.Epoch = token
	b.Fenced = true
	b.FailoverRequested = nil
	b.FailedUnixMs = s.now()
	b.Failovers++
	j := &waldenv1.Job{
		JobId:              fmt.Sprintf("job-%s-%d", b.GetBrokerId(), token),
		BrokerId:           b.GetBrokerId(),
		Token:              token,
		Attempt:            1,
		AssigneeId:         assignee,
		JobState:           waldenv1.JobState_JOB_STATE_PENDING,
		JobStep:            waldenv1.JobStep_JOB_STEP_FENCE,
		CreatedUnixMs:      s.now(),
		UpdatedUnixMs:      s.now(),
		RecoveredWalOffset: -1,
		LeaseWaitMs:        max(op.GetEvidence().GetLeaseWaitMs(), 0),
	}
	j.Wal = clone(b.GetWal())
	j.Automq = clone(b.GetAutomq())
	never := s.neverGranted(b, s.votersLocked(), op.GetEpoch())
	j.AcknowledgedNothing = cmd.GetChecks() >= ChecksNeverGranted && b.GetPriorRecovered() && len(never) >= len(s.votersLocked())/2+1
	s.jobs[j.GetJobId()] = j
	b.LastJobId = j.GetJobId()
	s.deriveState(b)
	d := &waldenv1.EventDetail{Epoch: op.GetEpoch(), NewEpoch: token, Member: assignee, FromState: from, ToState: b.GetBrokerState(),
		JobState: j.GetJobState(), Attempt: j.GetAttempt(), Reason: ev.GetReason()}
	if j.GetAcknowledgedNothing() {
		d.NeverGrantedBy = never
	}
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: b.GetBrokerId(), Actor: actor, Evidence: ev,
		JobId: j.GetJobId(), Detail: d})
	return &waldenv1.Result{Value: &waldenv1.Result_DeclareFailed{DeclareFailed: &waldenv1.DeclareFailedResult{
		NewEpoch: token, JobId: j.GetJobId()}}}, nil
}

// neverGranted returns the voters whose attestation for b's epoch says they
// never granted it a lease, counting only the voters added (their current
// incarnation) before the epoch was registered: a former incarnation under
// the same name, removed after the registration, may have granted it.
func (s *State) neverGranted(b *waldenv1.Broker, voters []string, epoch uint64) []string {
	incarnation := map[string]uint64{}
	for _, m := range s.members {
		incarnation[m.GetId()] = m.GetIncarnation()
	}
	var out []string
	for _, o := range b.GetObservations() {
		id := o.GetObserverId()
		if o.GetLeaseExpired() && o.GetNeverGranted() && o.GetEpoch() == epoch && slices.Contains(voters, id) &&
			incarnation[id] < b.GetRegisteredIndex() {
			out = append(out, id)
		}
	}
	return out
}

// attestations returns the voters whose observation of b attests that their
// lease grant for b's current epoch expired.
func attestations(b *waldenv1.Broker, voters []string) []string {
	var out []string
	for _, o := range b.GetObservations() {
		if o.GetLeaseExpired() && o.GetEpoch() == b.GetEpoch() && slices.Contains(voters, o.GetObserverId()) {
			out = append(out, o.GetObserverId())
		}
	}
	return out
}

// applyRequestFailover records an operator's request to fail a broker over
// at its current epoch. Every coordinator stops granting the epoch when it
// applies this, attests once its last grant expired, and the leader decides
// when a majority attests.
func (s *State) applyRequestFailover(index uint64, cmd *waldenv1.Command, op *waldenv1.RequestFailover) (*waldenv1.Result, error) {
	b, ok := s.brokers[op.GetBrokerId()]
	if !ok {
		return nil, unknownBroker("request failover", op.GetBrokerId())
	}
	if b.GetFenced() {
		return nil, fmt.Errorf("request failover of broker %q: it was already failed over (epoch %d fenced): %w",
			b.GetBrokerId(), b.GetEpoch(), refusal.ErrNodeFenced)
	}
	if b.GetEpoch() != op.GetEpoch() {
		return nil, fmt.Errorf("request failover of broker %q at epoch %d: its epoch is %d: %w",
			b.GetBrokerId(), op.GetEpoch(), b.GetEpoch(), refusal.ErrEpochExpired)
	}
	if b.GetFailoverRequested() == nil {
		b.FailoverRequested = &waldenv1.FailoverRequested{Epoch: op.GetEpoch(), Reason: op.GetReason(),
			Actor: actorOf(op.GetActor(), cmd), UnixMs: s.now(), Index: index}
		s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_FAILOVER_REQUESTED, BrokerId: b.GetBrokerId(),
			Actor: actorOf(op.GetActor(), cmd), Detail: &waldenv1.EventDetail{Epoch: op.GetEpoch(), FromState: b.GetBrokerState(),
				ToState: b.GetBrokerState(), Reason: op.GetReason()}})
	}
	return brokerResult(b), nil
}

// applyAckBroker clears a broker's cooldown block.
func (s *State) applyAckBroker(index uint64, cmd *waldenv1.Command, op *waldenv1.AckBroker) (*waldenv1.Result, error) {
	b, ok := s.brokers[op.GetBrokerId()]
	if !ok {
		return nil, unknownBroker("ack", op.GetBrokerId())
	}
	b.CooldownBlocked = false
	b.AckedUnixMs = s.now()
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_ACK, BrokerId: b.GetBrokerId(), Actor: actorOf(op.GetActor(), cmd),
		Detail: &waldenv1.EventDetail{Epoch: b.GetEpoch(), FromState: b.GetBrokerState(), ToState: b.GetBrokerState()}})
	return brokerResult(b), nil
}

// applySetMaintenance turns a broker's maintenance on or off.
func (s *State) applySetMaintenance(index uint64, cmd *waldenv1.Command, op *waldenv1.SetMaintenance) (*waldenv1.Result, error) {
	b, ok := s.brokers[op.GetBrokerId()]
	if !ok {
		return nil, unknownBroker("set maintenance", op.GetBrokerId())
	}
	if ttl := op.GetTtlMs(); cmd.GetChecks() >= ChecksBounded && (ttl < 0 || ttl > MaxMaintenanceTTLMs) {
		return nil, invalid("set maintenance %q: ttl_ms: %d ms is not between 0 (no ttl) and %s", op.GetBrokerId(), ttl, msText(MaxMaintenanceTTLMs))
	}
	from := b.GetBrokerState()
	if !s.setMaintenance(b, op) {
		return brokerResult(b), nil // set again since: nothing to do
	}
	s.deriveState(b)
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_MAINTENANCE, BrokerId: b.GetBrokerId(), Actor: actorOf(op.GetActor(), cmd),
		Detail: &waldenv1.EventDetail{Epoch: b.GetEpoch(), Maintenance: op.GetOn(), DurationMs: b.GetMaintenanceTtlMs(), Reason: op.GetReason(),
			FromState: from, ToState: b.GetBrokerState()}})
	return brokerResult(b), nil
}

// applyRemoveBroker removes a broker from the registry. Refused while a
// recovery job of it is pending or running (the job reads its WAL and
// commits as it) and while it owns an opened stream (nobody could open
// that stream again: its acknowledged records would be stranded). Its
// streams, objects and past jobs stay; registering the id again starts
// with a new epoch.
func (s *State) applyRemoveBroker(index uint64, cmd *waldenv1.Command, op *waldenv1.RemoveBroker) (*waldenv1.Result, error) {
	id := op.GetBrokerId()
	b, ok := s.brokers[id]
	if !ok {
		return nil, unknownBroker("remove broker", id)
	}
	if s.reconcilingLocked() {
		return nil, s.refuseReconciling(fmt.Sprintf("remove broker %q", id))
	}
	if j := s.activeJobOf(id); j != nil {
		return nil, fmt.Errorf("remove broker %q: job %s is %s: %w", id, j.GetJobId(), j.GetJobState().Name(), refusal.ErrRecoveryRunning)
	}
	var open []string
	for _, sid := range sortedKeys(s.streams) {
		if st := s.streams[sid]; st.GetOwnerBrokerId() == id && st.GetState() == StreamOpened {
			open = append(open, fmt.Sprint(sid))
		}
	}
	if len(open) > 0 {
		return nil, refusal.WithMetadata(fmt.Errorf("remove broker %q: it owns opened streams %s (fail it over, or stop it gracefully, first): %w",
			id, strings.Join(open, ", "), refusal.ErrStreamNotClosed), map[string]string{"streams": strings.Join(open, ",")})
	}
	delete(s.brokers, id)
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_REMOVE, BrokerId: id, Actor: actorOf(op.GetActor(), cmd),
		Detail: &waldenv1.EventDetail{Epoch: b.GetEpoch(), FromState: b.GetBrokerState()}})
	return brokerResult(b), nil
}

func actorOf(actor string, cmd *waldenv1.Command) string {
	if actor != "" {
		return actor
	}
	return cmd.GetProposerId()
}

// deriveState sets b's state from its flags, its last job and its
// observations: maintenance first; a fenced broker follows its recovery job
// (failed while pending, recovering while running or retried, recovered
// once it succeeded, failed when it failed or was cancelled); otherwise
// suspect when any coordinator observes it suspect or dead, else alive.
func (s *State) deriveState(b *waldenv1.Broker) {
	switch {
	case b.GetMaintenance():
		b.BrokerState = waldenv1.BrokerState_BROKER_STATE_MAINTENANCE
	case b.GetFenced():
		b.BrokerState = waldenv1.BrokerState_BROKER_STATE_FAILED
		if j := s.jobs[b.GetLastJobId()]; j != nil {
			switch j.GetJobState() {
			case waldenv1.JobState_JOB_STATE_RUNNING:
				b.BrokerState = waldenv1.BrokerState_BROKER_STATE_RECOVERING
			case waldenv1.JobState_JOB_STATE_PENDING:
				if j.GetAttempt() > 1 {
					b.BrokerState = waldenv1.BrokerState_BROKER_STATE_RECOVERING
				}
			case waldenv1.JobState_JOB_STATE_SUCCEEDED:
				b.BrokerState = waldenv1.BrokerState_BROKER_STATE_RECOVERED
			}
		}
	default:
		b.BrokerState = waldenv1.BrokerState_BROKER_STATE_ALIVE
		for _, o := range b.GetObservations() {
			if o.GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE {
				b.BrokerState = waldenv1.BrokerState_BROKER_STATE_SUSPECT
			}
		}
	}
}

func brokerResult(b *waldenv1.Broker) *waldenv1.Result {
	return &waldenv1.Result{Value: &waldenv1.Result_Broker{Broker: proto.Clone(b).(*waldenv1.Broker)}}
}

// Broker returns a copy of the broker id.
func (s *State) Broker(id string) (*waldenv1.Broker, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, ok := s.brokers[id]
	if !ok {
		return nil, false
	}
	return proto.Clone(b).(*waldenv1.Broker), true
}

// Brokers returns copies of every broker, sorted by id.
func (s *State) Brokers() []*waldenv1.Broker {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sortedBrokers()
}

func (s *State) sortedBrokers() []*waldenv1.Broker {
	out := make([]*waldenv1.Broker, 0, len(s.brokers))
	for _, id := range sortedKeys(s.brokers) {
		out = append(out, proto.Clone(s.brokers[id]).(*waldenv1.Broker))
	}
	return out
}

// NextEpoch is the next fencing token the state machine will issue.
func (s *State) NextEpoch() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.nextEpoch
}

// CheckBroker applies the catalog's epoch rule to a request of broker
// brokerID at epoch, optionally in failover mode (fo non-nil with a job id):
//   - without fo: unknown broker → UNKNOWN_NODE; fenced → NODE_FENCED;
//     epoch not current → EPOCH_EXPIRED;
//   - with fo: the job must exist for the broker (JOB_NOT_FOUND), be pending
//     or running (JOB_NOT_RUNNING), at fo.attempt (STALE_ATTEMPT), and
//     fo.token must equal the job's token and the broker's current epoch,
//     with the broker fenced (EPOCH_EXPIRED).
func (s *State) CheckBroker(brokerID string, epoch uint64, fo *waldenv1.FailoverContext) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, err := s.checkBroker(brokerID, epoch, fo)
	return err
}

// checkBroker is CheckBroker under the lock; it returns the broker and, in
// failover mode, the job.
func (s *State) checkBroker(brokerID string, epoch uint64, fo *waldenv1.FailoverContext) (*waldenv1.Job, error) {
	b, ok := s.brokers[brokerID]
	if !ok {
		return nil, unknownBroker("check", brokerID)
	}
	if fo.GetJobId() == "" {
		if err := fencing.Check(fencing.Token(b.GetEpoch()), b.GetFenced(), fencing.Token(epoch)); err != nil {
			return nil, fmt.Errorf("broker %q: %w", brokerID, err)
		}
		return nil, nil
	}
	j, ok := s.jobs[fo.GetJobId()]
	if !ok || j.GetBrokerId() != brokerID {
		return nil, fmt.Errorf("broker %q: job %q: %w", brokerID, fo.GetJobId(), refusal.ErrUnknownJob)
	}
	if !jobActive(j) {
		return nil, fmt.Errorf("broker %q: job %s is %s: %w", brokerID, j.GetJobId(), j.GetJobState().Name(), refusal.ErrJobNotRunning)
	}
	if fo.GetAttempt() != j.GetAttempt() {
		return nil, fmt.Errorf("broker %q: job %s attempt %d, current attempt %d: %w",
			brokerID, j.GetJobId(), fo.GetAttempt(), j.GetAttempt(), refusal.ErrStaleAttempt)
	}
	if fo.GetToken() != j.GetToken() || j.GetToken() != b.GetEpoch() || !b.GetFenced() {
		return nil, fmt.Errorf("broker %q: job %s token %d, job token %d, broker epoch %d, fenced %t: %w",
			brokerID, j.GetJobId(), fo.GetToken(), j.GetToken(), b.GetEpoch(), b.GetFenced(), refusal.ErrEpochExpired)
	}
	return j, nil
}

// sortedKeys returns the keys of m in order.
func sortedKeys[K string | uint64, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// clone returns a deep copy of m (nil for nil).
func clone[T proto.Message](m T) T {
	c := proto.Clone(m)
	if c == nil {
		var zero T
		return zero
	}
	return c.(T)
}
