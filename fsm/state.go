package fsm

import (
	"errors"
	"fmt"
	"sync"

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

// roleLearner marks a learner in Member.role; voters keep "" (the node fills
// in leader or follower).
const roleLearner = "learner"

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
	// noopCount counts the applied Noop commands.
	noopCount uint64
}

// New returns the empty state of the cluster clusterName.
func New(clusterName string) *State {
	return &State{clusterName: clusterName, members: map[uint64]*waldenv1.Member{}}
}

// Apply applies the command of the normal entry at index. Each operation is
// applied by a function of its own; an error is the proposer's result.
func (s *State) Apply(index uint64, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.advance(index); err != nil {
		return nil, err
	}
	s.lastAppliedUnixMs = max(s.lastAppliedUnixMs, cmd.GetProposedUnixMs())

	var (
		res *waldenv1.Result
		err error
	)
	switch op := cmd.GetOp().(type) {
	case *waldenv1.Command_Noop:
		res, err = s.applyNoop(op.Noop)
	default:
		err = fmt.Errorf("fsm: apply index %d, request %d: %w", index, cmd.GetRequestId(), ErrUnknownCommand)
	}
	if err != nil {
		return nil, err
	}
	res.Index = index
	return res, nil
}

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
