package fsm

import (
	"errors"
	"fmt"
	"sync"

	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
)

// Errors returned by the state machine. An error from Apply is a result for
// the proposer; the entry still counts as applied.
var (
	// ErrStaleIndex is returned when an entry's index is not beyond the
	// applied index: raft hands each entry once, in order, so this is a
	// broken invariant of the caller. The state is left unchanged.
	ErrStaleIndex = errors.New("fsm: entry index not beyond the applied index")
	// ErrUnknownCommand is returned by Apply for a command without an
	// operation, or with one this version does not know. The applied index
	// still advances, identically on every member.
	ErrUnknownCommand = errors.New("fsm: unknown command")
	// ErrUnknownMember is returned by ApplyConfChange for a removal or
	// promotion of a raft id that is not a member.
	ErrUnknownMember = errors.New("fsm: unknown member")
	// ErrNoMemberContext is returned by ApplyConfChange when a node is added
	// without a ConfChangeContext naming the member.
	ErrNoMemberContext = errors.New("fsm: conf change adds a member without its context")
	// ErrSnapshotVersion is returned by Restore for a snapshot of a version
	// this walden does not read.
	ErrSnapshotVersion = errors.New("fsm: unsupported snapshot version")
	// ErrForeignSnapshot is returned by Restore for a snapshot of another
	// cluster.
	ErrForeignSnapshot = errors.New("fsm: snapshot of another cluster")
	// ErrInvalidSnapshot is returned by Restore when the snapshot does not
	// decode or its content is inconsistent.
	ErrInvalidSnapshot = errors.New("fsm: invalid snapshot")
)

// State is the replicated state of a walden cluster. It implements
// raftnode.StateMachine. Apply and ApplyConfChange are called from the
// node's apply path only, in log order; the read methods may be called from
// any goroutine.
type State struct {
	mu sync.RWMutex

	clusterName string
	// applied is the index of the last entry applied.
	applied uint64
	// lastAppliedUnixMs is the largest proposed_unix_ms of the commands
	// applied so far: the state machine's notion of "now", which never runs
	// backwards even when proposers' clocks disagree.
	lastAppliedUnixMs int64
	// members by raft id.
	members map[uint64]*waldenv1.Member
	// confIndex is the index of the last membership change applied.
	confIndex uint64
	// leaseHorizonMs is the longest lease_ttl + drift_margin the effective
	// policy ever had (LeaseHorizon).
	leaseHorizonMs int64
	// noopCount counts the applied Noop commands.
	noopCount uint64

	// nextEpoch is the next fencing token to issue (starts at 1).
	nextEpoch uint64
	// brokers by id.
	brokers map[string]*waldenv1.Broker
	// overrides are the runtime policy overrides.
	overrides *waldenv1.PolicyOverrides
	// events is the bounded event log, oldest first.
	events []*waldenv1.Event
	// streams by id.
	streams map[uint64]*waldenv1.Stream
	// objects by id; streamObjects lists each stream's object ids in commit
	// (= offset) order, derived from objects.
	objects       map[string]*waldenv1.Object
	streamObjects map[uint64][]string
	// producers are the streams' producer tables (idempotent producers'
	// last batches), by stream id.
	producers map[uint64]*producer.Table
	// jobs by id.
	jobs map[string]*waldenv1.Job
	// restore is the reconciliation of a cluster restored from a backup
	// (nil when not restored; restore.go).
	restore *waldenv1.RestoreState

	// changed is closed at the next apply that changes anything.
	changed chan struct{}
	// watch is the log of recent changes that Watch streams (watch.go).
	watch changeLog
	// derived are views recomputed at every change (renewal.go).
	derived derived
	// brokersView is the registry copy shared until an entry changes a
	// broker (brokersview.go).
	brokersView brokersView
}

// New returns the empty state of the cluster clusterName.
func New(clusterName string) *State {
	s := &State{clusterName: clusterName}
	s.reset()
	return s
}

// reset empties every domain of the state (not the cluster name).
func (s *State) reset() {
	s.brokersView.invalidate()
	s.applied = 0
	s.lastAppliedUnixMs = 0
	s.members = map[uint64]*waldenv1.Member{}
	s.confIndex = 0
	s.leaseHorizonMs = 0
	s.noopCount = 0
	s.nextEpoch = 1
	s.brokers = map[string]*waldenv1.Broker{}
	s.overrides = &waldenv1.PolicyOverrides{}
	s.events = nil
	s.streams = map[uint64]*waldenv1.Stream{}
	s.objects = map[string]*waldenv1.Object{}
	s.streamObjects = map[uint64][]string{}
	s.producers = map[uint64]*producer.Table{}
	s.jobs = map[string]*waldenv1.Job{}
	s.restore = nil
	s.deriveLocked()
}

// Changed returns a channel that is closed at the next apply (or restore)
// that changes anything; call it again for the one after.
func (s *State) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// notifyLocked recomputes the derived views and wakes the waiters of
// Changed; every apply, membership change and restore that changes
// anything calls it.
func (s *State) notifyLocked() {
	s.deriveLocked()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// Apply applies the command of the normal entry at index. Each operation is
// applied by a function of its own; an error is the proposer's result.
//
// A refused command (an error wrapping a fencing sentinel, e.g.
// refusal.ErrNodeFenced or refusal.ErrInvalidArgument) changes nothing but
// the applied index and the state machine's time: every apply function
// validates fully before it mutates.
func (s *State) Apply(index, term uint64, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.advance(index); err != nil {
		return nil, err
	}
	s.lastAppliedUnixMs = max(s.lastAppliedUnixMs, cmd.GetProposedUnixMs())
	cmd, err := upgradeCommand(cmd)
	if err != nil {
		return nil, err
	}

	before := s.beforeApply(cmd)
	res, err := s.dispatch(index, term, cmd)
	if err != nil {
		return nil, err
	}
	s.afterApply(index, before, res)
	s.viewApplied(before)
	s.notifyLocked()
	res.Index = index
	return res, nil
}

// dispatch applies cmd by the apply function of its operation: the
// brokers and policy, the reconciliation of a restored cluster, the
// catalog's streams and objects, or the recovery jobs.
func (s *State) dispatch(index, term uint64, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	for _, apply := range []func(index, term uint64, cmd *waldenv1.Command) (*waldenv1.Result, bool, error){
		s.applyBrokerOp, s.applyReconcileOp, s.applyCatalogOp, s.applyJobOp,
	} {
		if res, ok, err := apply(index, term, cmd); ok {
			return res, err
		}
	}
	return nil, fmt.Errorf("fsm: apply index %d, request %d: %w", index, cmd.GetRequestId(), ErrUnknownCommand)
}

// applyBrokerOp applies the operations on brokers, their observations and
// failovers, the policy and the event log (ok false: cmd is none of them).
func (s *State) applyBrokerOp(index, term uint64, cmd *waldenv1.Command) (res *waldenv1.Result, ok bool, err error) {
	switch op := cmd.GetOp().(type) {
	case *waldenv1.Command_Noop:
		res, err = s.applyNoop(op.Noop)
	case *waldenv1.Command_RegisterBroker:
		res, err = s.applyRegisterBroker(index, cmd, op.RegisterBroker)
	case *waldenv1.Command_ObserveBroker:
		res, err = s.applyObserveBroker(index, cmd, op.ObserveBroker)
	case *waldenv1.Command_DeclareFailed:
		res, err = s.applyDeclareFailed(index, term, cmd, op.DeclareFailed)
	case *waldenv1.Command_SetPolicy:
		res, err = s.applySetPolicy(index, cmd, op.SetPolicy)
	case *waldenv1.Command_AckBroker:
		res, err = s.applyAckBroker(index, cmd, op.AckBroker)
	case *waldenv1.Command_SetMaintenance:
		res, err = s.applySetMaintenance(index, cmd, op.SetMaintenance)
	case *waldenv1.Command_RecordEvent:
		res, err = s.applyRecordEvent(index, cmd, op.RecordEvent)
	case *waldenv1.Command_RemoveBroker:
		res, err = s.applyRemoveBroker(index, cmd, op.RemoveBroker)
	case *waldenv1.Command_RequestFailover:
		res, err = s.applyRequestFailover(index, cmd, op.RequestFailover)
	case *waldenv1.Command_SeedPolicy:
		res, err = s.applySeedPolicy(index, cmd, op.SeedPolicy)
	default:
		return nil, false, nil
	}
	return res, true, err
}

// applyReconcileOp applies the operations that found a cluster anew and
// reconcile it with the world (ok false: cmd is none of them).
func (s *State) applyReconcileOp(index, term uint64, cmd *waldenv1.Command) (res *waldenv1.Result, ok bool, err error) {
	switch op := cmd.GetOp().(type) {
	case *waldenv1.Command_ForceNewCluster:
		res, err = s.applyForceNewCluster(index, cmd, op.ForceNewCluster)
	case *waldenv1.Command_ReconcileScan:
		res, err = s.applyReconcileScan(index, term, cmd, op.ReconcileScan)
	case *waldenv1.Command_ReconcileObjects:
		res, err = s.applyReconcileObjects(index, term, op.ReconcileObjects)
	case *waldenv1.Command_ReconcilePlan:
		res, err = s.applyReconcilePlan(index, term, cmd, op.ReconcilePlan)
	case *waldenv1.Command_ReconcileProgress:
		res, err = s.applyReconcileProgress(term, op.ReconcileProgress)
	default:
		return nil, false, nil
	}
	return res, true, err
}

// applyCatalogOp applies the operations on the catalog's streams and
// objects (ok false: cmd is none of them).
func (s *State) applyCatalogOp(index, _ uint64, cmd *waldenv1.Command) (res *waldenv1.Result, ok bool, err error) {
	switch op := cmd.GetOp().(type) {
	case *waldenv1.Command_OpenStream:
		res, err = s.applyOpenStream(index, op.OpenStream)
	case *waldenv1.Command_CommitObject:
		res, err = s.applyCommitObject(index, cmd.GetChecks(), op.CommitObject)
	case *waldenv1.Command_CloseStream:
		res, err = s.applyCloseStream(index, op.CloseStream)
	default:
		return nil, false, nil
	}
	return res, true, err
}

// applyJobOp applies the operations on recovery jobs (ok false: cmd is none
// of them).
func (s *State) applyJobOp(index, term uint64, cmd *waldenv1.Command) (res *waldenv1.Result, ok bool, err error) {
	switch op := cmd.GetOp().(type) {
	case *waldenv1.Command_RenewJobLease:
		res, err = s.applyRenewJobLease(index, cmd, op.RenewJobLease)
	case *waldenv1.Command_ReassignJob:
		res, err = s.applyReassignJob(index, term, cmd, op.ReassignJob)
	case *waldenv1.Command_CheckpointJob:
		res, err = s.applyCheckpointJob(index, op.CheckpointJob)
	case *waldenv1.Command_FinishJob:
		res, err = s.applyFinishJob(index, cmd, op.FinishJob)
	case *waldenv1.Command_CancelJob:
		res, err = s.applyCancelJob(index, cmd, op.CancelJob)
	case *waldenv1.Command_RetryJob:
		res, err = s.applyRetryJob(index, cmd, op.RetryJob)
	case *waldenv1.Command_BlockJob:
		res, err = s.applyBlockJob(index, cmd, op.BlockJob)
	case *waldenv1.Command_ResolveJob:
		res, err = s.applyResolveJob(index, cmd, op.ResolveJob)
	default:
		return nil, false, nil
	}
	return res, true, err
}

// now is the state machine's time: the largest proposer time applied so far.
func (s *State) now() int64 { return s.lastAppliedUnixMs }

// advance moves the applied index to index, refusing an index that is not
// beyond it.
func (s *State) advance(index uint64) error {
	if index <= s.applied {
		return fmt.Errorf("fsm: apply index %d, applied index is %d: %w", index, s.applied, ErrStaleIndex)
	}
	s.applied = index
	return nil
}

// AppliedIndex is the index of the last entry applied.
func (s *State) AppliedIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.applied
}

// LastAppliedUnixMs is the largest proposer time (Unix milliseconds) carried
// by the commands applied so far; 0 before the first.
func (s *State) LastAppliedUnixMs() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lastAppliedUnixMs
}

// ClusterName is the name of the cluster this state belongs to.
func (s *State) ClusterName() string { return s.clusterName }
