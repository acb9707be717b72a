package raftnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

var (
	// ErrNoLeader is returned when this member knows no leader (election in
	// progress, or cut off from the majority). Retry later or ask another
	// member.
	ErrNoLeader = errors.New("raftnode: no leader")
	// ErrNotLeader is returned by operations that only the leader performs
	// (TransferLeadership) when called on another member.
	ErrNotLeader = errors.New("raftnode: not the leader")
	// ErrStopped is returned once the node has stopped (Stop, removal from
	// the cluster, or a fatal storage error).
	ErrStopped = errors.New("raftnode: node stopped")
	// ErrUnknownMember is returned for a member id that is not in the
	// current configuration.
	ErrUnknownMember = errors.New("raftnode: unknown member")
	// ErrMemberExists is returned when adding a member that is already in the
	// configuration.
	ErrMemberExists = errors.New("raftnode: member already exists")
	// ErrInvalidMember is returned for a member description that cannot be
	// used (empty id or raft address).
	ErrInvalidMember = errors.New("raftnode: invalid member")
	// ErrNotVoter is returned when leadership is to move to a member that
	// cannot lead (a learner).
	ErrNotVoter = errors.New("raftnode: member is not a voter")
	// ErrLastVoter is returned when removing the only voter, which would leave
	// the cluster unable to decide anything.
	ErrLastVoter = errors.New("raftnode: cannot remove the last voter")
	// ErrProposalDropped is returned when raft refused a proposal (for
	// example while leadership is being transferred); retrying may succeed.
	ErrProposalDropped = errors.New("raftnode: proposal dropped")
	// ErrInvalidConfig is wrapped by Config.Validate errors.
	ErrInvalidConfig = errors.New("raftnode: invalid config")
	// ErrCorruptEntry stops a member that is about to apply a committed
	// entry whose command (or membership change) does not decode: applying
	// anything else than what its peers apply would diverge the state.
	ErrCorruptEntry = errors.New("raftnode: committed entry does not decode")
	// ErrLogWentBackwards stops a member whose leader says it had
	// acknowledged entries beyond the end of its log: its data directory is
	// an older copy, or was wiped while the member id stayed in the cluster.
	// Such a member may have voted and acknowledged what it no longer has;
	// the way back is `waldenctl member remove` and `member add` with an
	// empty data directory.
	ErrLogWentBackwards = errors.New("raftnode: this member's raft log went backwards")
)

// Config configures a Node. Zero durations and counts take the defaults of
// DefaultConfig.
type Config struct {
	// ClusterName names the cluster; it is recorded in storage and checked
	// on every transport frame.
	ClusterName string
	// NodeID is this member's id, e.g. "c1".
	NodeID string
	// InitialCluster lists the founding members. It is used only when the
	// storage is empty: a member listed in it bootstraps the cluster with
	// these members; a member not listed joins an existing cluster (it must
	// have been added with AddMember first) and learns the membership from
	// the leader.
	InitialCluster []*waldenv1.MemberContext
	// TickInterval is the raft logical clock period (default 100ms).
	TickInterval time.Duration
	// ElectionTicks is the election timeout in ticks (default 10).
	ElectionTicks int
	// HeartbeatTicks is the heartbeat interval in ticks (default 1).
	HeartbeatTicks int
	// SnapshotCount: snapshot the state machine and compact the log every
	// SnapshotCount applied entries (default 10000).
	SnapshotCount uint64
	// SnapshotCatchUpEntries entries are kept behind a snapshot so that a
	// slightly slow follower catches up from the log, not a snapshot
	// (default 5000).
	SnapshotCatchUpEntries uint64
	// MaxSizePerMsg limits the bytes of entries in one append message
	// (default 1 MiB).
	MaxSizePerMsg uint64
	// MaxInflightMsgs limits the append messages in flight per follower
	// (default 256).
	MaxInflightMsgs int
	// DataDir is the member's data directory, named in the messages of the
	// faults that stop the member (default: the storage's Path, when it has
	// one).
	DataDir string
	// Logger receives the node's and raft's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer exports the walden_raft_* metrics; nil: not registered.
	Registerer prometheus.Registerer
}

// DefaultConfig returns a Config with every default set; callers fill in
// ClusterName, NodeID and InitialCluster.
func DefaultConfig() Config {
	return Config{
		TickInterval:           100 * time.Millisecond,
		ElectionTicks:          10,
		HeartbeatTicks:         1,
		SnapshotCount:          10000,
		SnapshotCatchUpEntries: 5000,
		MaxSizePerMsg:          1 << 20,
		MaxInflightMsgs:        256,
	}
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.TickInterval == 0 {
		c.TickInterval = d.TickInterval
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = d.ElectionTicks
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = d.HeartbeatTicks
	}
	if c.SnapshotCount == 0 {
		c.SnapshotCount = d.SnapshotCount
	}
	if c.SnapshotCatchUpEntries == 0 {
		c.SnapshotCatchUpEntries = d.SnapshotCatchUpEntries
	}
	if c.MaxSizePerMsg == 0 {
		c.MaxSizePerMsg = d.MaxSizePerMsg
	}
	if c.MaxInflightMsgs == 0 {
		c.MaxInflightMsgs = d.MaxInflightMsgs
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first unusable setting, naming it. Zero values are
// valid (they take defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.ClusterName == "":
		return fmt.Errorf("%w: cluster_name is empty", ErrInvalidConfig)
	case c.NodeID == "":
		return fmt.Errorf("%w: node_id is empty", ErrInvalidConfig)
	case c.TickInterval < time.Millisecond:
		return fmt.Errorf("%w: tick_interval %s is below 1ms", ErrInvalidConfig, c.TickInterval)
	case c.HeartbeatTicks < 1:
		return fmt.Errorf("%w: heartbeat_ticks %d must be at least 1", ErrInvalidConfig, c.HeartbeatTicks)
	case c.ElectionTicks <= c.HeartbeatTicks:
		return fmt.Errorf("%w: election_ticks %d must exceed heartbeat_ticks %d", ErrInvalidConfig, c.ElectionTicks, c.HeartbeatTicks)
	case c.MaxInflightMsgs < 1:
		return fmt.Errorf("%w: max_inflight_msgs %d must be at least 1", ErrInvalidConfig, c.MaxInflightMsgs)
	}
	seen := make(map[string]bool)
	for i, m := range c.InitialCluster {
		switch {
		case m == nil || m.GetId() == "":
			return fmt.Errorf("%w: initial_cluster[%d].id is empty", ErrInvalidConfig, i)
		case m.GetRaftAddr() == "":
			return fmt.Errorf("%w: initial_cluster[%d].raft (member %q) is empty", ErrInvalidConfig, i, m.GetId())
		case seen[m.GetId()]:
			return fmt.Errorf("%w: initial_cluster[%d].id %q is listed twice", ErrInvalidConfig, i, m.GetId())
		}
		seen[m.GetId()] = true
	}
	return nil
}

// Status is a member's view of the cluster.
type Status struct {
	ClusterName  string
	NodeID       string
	LeaderID     string // empty while no leader is known
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	// RaftState is "leader", "follower", "candidate", "pre-candidate" or
	// "learner".
	RaftState string
	// Members is the current configuration, sorted by id, with role
	// ("leader", "follower", "learner"), reachable (as seen by this member)
	// and match_index (only when this member leads).
	Members []*waldenv1.Member
}

// Node is one running member of the raft group. One goroutine owns the
// raft.Node: it ticks the clock and handles every Ready (persist, send,
// apply, advance). Other goroutines talk to it only through raft's channels,
// the wait registries and atomics.
type Node struct {
	cfg     Config
	id      uint64
	logger  *slog.Logger
	sm      StateMachine
	st      Storage
	tr      Transport
	raft    raft.Node
	metrics *nodeMetrics

	reqIDs    *requestIDs
	wait      *waitRegistry // proposers and conf-change proposers by request id
	applyWait *indexWaiter  // readers waiting for an applied index

	leader      atomic.Uint64
	raftState   atomic.Uint64
	term        atomic.Uint64
	commit      atomic.Uint64
	applied     atomic.Uint64
	readyCommit uint64 // commit index in storage at start (for Ready)

	// Owned by the run goroutine.
	snapshotIndex uint64
	// snapshotsApplied counts snapshots received from a leader and applied.
	snapshotsApplied atomic.Uint64

	mu        sync.RWMutex
	confState *raftpb.ConfState
	members   map[uint64]*waldenv1.Member // by raft id, from sm.Members()
	names     map[uint64]string           // every member id ever seen, by raft id
	promoting map[uint64]bool             // learners with a promotion in flight

	readMu sync.Mutex
	reads  map[string]chan uint64 // ReadIndex request ctx -> read index

	confMu sync.Mutex // one membership change at a time from this member

	// Proposals made on the leader are queued and stepped into raft in
	// batches by runProposals (see propose).
	propMu     sync.Mutex
	propQueue  []queuedProposal
	propSignal chan struct{} // capacity 1: the queue is not empty
	// transferring is set while TransferLeadership runs: raft drops
	// proposals during a transfer, so they take the path that reports it.
	transferring atomic.Int32
	// removed is set once this member applied its own removal; it stops
	// shortly after.
	removed atomic.Bool

	stopOnce sync.Once
	stopc    chan struct{}
	donec    chan struct{}
	// fatal is the error that stopped the member (nil after Stop or a
	// removal); set once, before donec is closed.
	fatalOnce sync.Once
	fatal     atomic.Pointer[error]
}

// NewNode starts (empty storage) or restarts (storage with state) the member
// described by cfg, and starts its goroutines and tr.Start(node).
//
// On restart the state machine is restored from st.Snapshot() and raft
// replays the committed entries after it. The node does not own st: close it
// after Stop (or after Done is closed).
func NewNode(cfg Config, sm StateMachine, st Storage, tr Transport) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if sm == nil || st == nil || tr == nil {
		return nil, errors.New("raftnode: new node: state machine, storage and transport are required")
	}
	metrics, err := newNodeMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			metrics.unregister(cfg.Registerer) // NewNode may be retried
		}
	}()
	n := &Node{
		cfg:        cfg,
		id:         RaftID(cfg.NodeID),
		logger:     cfg.Logger.With("node_id", cfg.NodeID),
		sm:         sm,
		st:         st,
		tr:         tr,
		metrics:    metrics,
		reqIDs:     newRequestIDs(cfg.NodeID, time.Now()),
		wait:       newWaitRegistry(),
		members:    make(map[uint64]*waldenv1.Member),
		names:      map[uint64]string{RaftID(cfg.NodeID): cfg.NodeID},
		promoting:  make(map[uint64]bool),
		reads:      make(map[string]chan uint64),
		propSignal: make(chan struct{}, 1),
		stopc:      make(chan struct{}),
		donec:      make(chan struct{}),
	}
	for _, m := range cfg.InitialCluster {
		n.names[RaftID(m.GetId())] = m.GetId()
	}

	empty, err := storageIsEmpty(st)
	if err != nil {
		return nil, err
	}
	hs, cs, err := st.InitialState()
	if err != nil {
		return nil, fmt.Errorf("raftnode: read initial state: %w", err)
	}
	snap, err := st.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("raftnode: read snapshot: %w", err)
	}

	// Restore the state machine from the latest snapshot; raft replays the
	// committed entries after it.
	snapIndex := snap.GetMetadata().GetIndex()
	if !raft.IsEmptySnap(snap) && snapIndex > sm.AppliedIndex() {
		if err := sm.Restore(snap.GetData()); err != nil {
			return nil, fmt.Errorf("raftnode: restore snapshot at index %d: %w", snapIndex, err)
		}
	}
	n.snapshotIndex = snapIndex
	// The state machine may lag the snapshot index by entries it never sees
	// (the empty entries of new leaders).
	applied := max(sm.AppliedIndex(), snapIndex)
	n.applied.Store(applied)
	n.applyWait = newIndexWaiter(applied)
	n.metrics.appliedIndex.Set(float64(applied))
	n.confState = proto.Clone(raftpb.EnsureConfState(cs)).(*raftpb.ConfState)
	n.term.Store(hs.GetTerm())
	n.commit.Store(hs.GetCommit())
	n.readyCommit = hs.GetCommit()
	n.refreshMembers()

	rc := &raft.Config{
		ID:                n.id,
		ElectionTick:      cfg.ElectionTicks,
		HeartbeatTick:     cfg.HeartbeatTicks,
		Storage:           st,
		Applied:           snapIndex,
		MaxSizePerMsg:     cfg.MaxSizePerMsg,
		MaxInflightMsgs:   cfg.MaxInflightMsgs,
		CheckQuorum:       true,
		PreVote:           true,
		StepDownOnRemoval: true,
		Logger:            &raftLogger{l: n.logger.With("component", "raft")},
	}
	// raft.StartNode and RestartNode panic on a bad config; check it first
	// so that NewNode returns the error instead.
	probe := *rc
	if _, err := raft.NewRawNode(&probe); err != nil {
		return nil, fmt.Errorf("raftnode: raft config: %w", err)
	}

	var peers []raft.Peer
	if empty {
		for _, m := range cfg.InitialCluster {
			if m.GetId() == cfg.NodeID {
				peers, err = bootstrapPeers(cfg.InitialCluster)
				if err != nil {
					return nil, err
				}
				n.readyCommit = uint64(len(peers))
				break
			}
		}
	}
	// Peers known before anything is applied: the founding members (for a
	// new or joining member) and the members of the restored snapshot.
	for _, m := range cfg.InitialCluster {
		if id := RaftID(m.GetId()); id != n.id && empty {
			tr.AddPeer(id, m.GetRaftAddr())
		}
	}
	for id, m := range n.members {
		if id != n.id {
			tr.AddPeer(id, m.GetRaftAddr())
		}
	}

	switch {
	case len(peers) > 0:
		n.logger.Info("raftnode: bootstrapping new cluster", "cluster", cfg.ClusterName, "members", len(peers))
		n.raft = raft.StartNode(rc, peers)
	case empty:
		n.logger.Info("raftnode: joining existing cluster with empty storage", "cluster", cfg.ClusterName)
		n.raft = raft.RestartNode(rc)
	default:
		n.logger.Info("raftnode: restarting from storage", "cluster", cfg.ClusterName,
			"term", hs.GetTerm(), "commit", hs.GetCommit(), "snapshot_index", snapIndex)
		n.raft = raft.RestartNode(rc)
	}
	if err := tr.Start(n); err != nil {
		n.raft.Stop()
		_ = tr.Close()
		return nil, fmt.Errorf("raftnode: start transport: %w", err)
	}
	go n.run()
	go n.runProposals()
	started = true
	return n, nil
}

// bootstrapPeers turns the founding members into raft peers whose context is
// a ConfChangeContext naming the member, so every member learns the
// addresses from the log.
func bootstrapPeers(members []*waldenv1.MemberContext) ([]raft.Peer, error) {
	peers := make([]raft.Peer, 0, len(members))
	for _, m := range members {
		ctx, err := proto.Marshal(&waldenv1.ConfChangeContext{Member: m})
		if err != nil {
			return nil, fmt.Errorf("raftnode: marshal bootstrap member %q: %w", m.GetId(), err)
		}
		peers = append(peers, raft.Peer{ID: RaftID(m.GetId()), Context: ctx})
	}
	return peers, nil
}

// storageIsEmpty reports whether st holds no raft state (a new member).
func storageIsEmpty(st Storage) (bool, error) {
	if e, ok := st.(interface{ IsEmpty() bool }); ok {
		return e.IsEmpty(), nil
	}
	hs, _, err := st.InitialState()
	if err != nil {
		return false, fmt.Errorf("raftnode: read initial state: %w", err)
	}
	last, err := st.LastIndex()
	if err != nil {
		return false, fmt.Errorf("raftnode: read last index: %w", err)
	}
	return raft.IsEmptyHardState(hs) && last == 0, nil
}

// run is the goroutine that owns the raft.Node.
func (n *Node) run() {
	defer n.shutdown()
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	// removedc fires a while after this member applied its own removal.
	var removedc <-chan time.Time
	for {
		select {
		case <-ticker.C:
			n.raft.Tick()
			n.maybePromoteLearners()
		case rd := <-n.raft.Ready():
			removed, err := n.handleReady(rd)
			if err != nil {
				n.fail(err)
				return
			}
			if (removed || removedc != nil) && n.inConfig() {
				// Added again after its removal (a replacement under the
				// same name replays both from the leader's log): it stays.
				if removedc != nil {
					n.logger.Info("raftnode: this member was added again after its removal; it keeps running")
				}
				removed, removedc = false, nil
				n.removed.Store(false)
			}
			if removed && removedc == nil {
				// Linger before stopping, as etcd does: a removed leader
				// must still deliver the commit index of its removal (and
				// vote and append for the survivors while they have not
				// applied it), else the survivors keep a configuration
				// that needs this member; with two voters, forever.
				n.removed.Store(true)
				wait := 2 * n.electionTimeout()
				n.logger.Warn("raftnode: this member was removed from the cluster, stopping", "in", wait)
				removedc = time.After(wait)
			}
		case <-removedc:
			return
		case <-n.stopc:
			return
		}
	}
}

// handleReady handles one Ready. It reports whether this member applied its
// own removal. An error is fatal: the member stops.
func (n *Node) handleReady(rd raft.Ready) (removed bool, err error) {
	// 1. Volatile state: leader and role, for callers and metrics.
	if rd.SoftState != nil {
		n.updateSoftState(rd.SoftState)
	}

	// 2. A leader sends before its own write, so that it writes in parallel
	//    with its followers (raft thesis §10.2.1, as etcd does): its appends,
	//    heartbeats and snapshots promise nothing about its own disk. Raft
	//    counts the leader's copy of an entry towards commit only after
	//    Advance, and its term and vote were persisted before it campaigned.
	leading := raft.StateType(n.raftState.Load()) == raft.StateLeader
	if leading && len(rd.Messages) > 0 {
		n.tr.Send(rd.Messages)
	}

	// 3. A leader applies the committed entries before it writes the new
	//    ones of this Ready, so that their proposers are answered without
	//    waiting for that write (raft allows applying a committed entry
	//    before it is on the local disk; committed means on a quorum's
	//    disks). A follower writes first: its acknowledgements wait for its
	//    disk, not for its state machine. With a snapshot to restore, the
	//    usual order holds.
	applyFirst := leading && raft.IsEmptySnap(rd.Snapshot)
	if applyFirst {
		if removed, err = n.applyEntries(rd.CommittedEntries); err != nil {
			return false, err
		}
	}

	// 4. Persist the snapshot, the entries and the HardState in one durable
	//    write. A Ready that moves only the commit index needs no fsync
	//    (raft.MustSync): the storage defers it to its next write. Raft
	//    counts the leader's own copy of an entry towards commit only after
	//    Advance below, so an entry is committed (and its proposer answered)
	//    only once it is on a quorum's disks, and on the leader's own disk
	//    when the leader's copy is part of that quorum.
	if err := n.st.Save(rd.HardState, rd.Entries, rd.Snapshot); err != nil {
		return false, fmt.Errorf("raftnode: persist ready: %w", err)
	}
	if rd.HardState != nil {
		n.term.Store(rd.HardState.GetTerm())
		n.commit.Store(rd.HardState.GetCommit())
		n.metrics.term.Set(float64(rd.HardState.GetTerm()))
		n.metrics.commitIndex.Set(float64(rd.HardState.GetCommit()))
	}

	// 5. Any other member sends only now: its votes and append responses
	//    promise what was just persisted.
	if !leading && len(rd.Messages) > 0 {
		n.tr.Send(rd.Messages)
	}

	// 6. Hand read indexes to the linearizable reads that asked for them.
	for _, rs := range rd.ReadStates {
		n.deliverReadState(rs)
	}

	// 7. Apply a snapshot received from the leader.
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := n.applySnapshot(rd.Snapshot); err != nil {
			return false, err
		}
	}

	// 8. Apply the committed entries in log order (unless done in 3).
	if !applyFirst {
		if removed, err = n.applyEntries(rd.CommittedEntries); err != nil {
			return false, err
		}
	}

	// 9. Snapshot the state machine and compact the log every
	//    SnapshotCount applied entries, once the applied entries are stored.
	if err := n.maybeSnapshot(); err != nil {
		return false, err
	}

	// 10. Tell raft this Ready is done.
	n.raft.Advance()
	return removed, nil
}

func (n *Node) updateSoftState(ss *raft.SoftState) {
	n.raftState.Store(uint64(ss.RaftState))
	old := n.leader.Swap(ss.Lead)
	if old == ss.Lead {
		return
	}
	if ss.Lead == raft.None {
		n.metrics.hasLeader.Set(0)
		n.logger.Info("raftnode: lost leader", "old_leader", n.nameOf(old), "term", n.term.Load())
		return
	}
	n.metrics.hasLeader.Set(1)
	n.metrics.leaderChanges.Inc()
	n.logger.Info("raftnode: leader changed", "leader", n.nameOf(ss.Lead), "old_leader", n.nameOf(old),
		"state", raftStateName(ss.RaftState, false))
}

func (n *Node) applySnapshot(snap *raftpb.Snapshot) error {
	index := snap.GetMetadata().GetIndex()
	if index <= n.applied.Load() {
		return nil
	}
	if err := n.sm.Restore(snap.GetData()); err != nil {
		return fmt.Errorf("raftnode: restore snapshot at index %d: %w", index, err)
	}
	n.mu.Lock()
	n.confState = proto.Clone(raftpb.EnsureConfState(snap.GetMetadata().GetConfState())).(*raftpb.ConfState)
	n.mu.Unlock()
	n.refreshMembers()
	// Follow the membership of the snapshot in the transport.
	n.mu.RLock()
	for id, m := range n.members {
		if id != n.id {
			n.tr.AddPeer(id, m.GetRaftAddr())
		}
	}
	n.mu.RUnlock()
	n.snapshotIndex = index
	n.setApplied(index)
	n.snapshotsApplied.Add(1)
	n.logger.Info("raftnode: applied snapshot from leader", "index", index, "term", snap.GetMetadata().GetTerm())
	return nil
}

// applyEntries applies committed entries; it reports whether one of them
// removed this member.
func (n *Node) applyEntries(ents []*raftpb.Entry) (removed bool, err error) {
	if len(ents) > 0 && ents[0].GetIndex() > n.applied.Load()+1 {
		// Entries between the applied index and these are missing: the
		// state machine would silently diverge.
		return false, fmt.Errorf("raftnode: committed entries start at index %d, applied index is %d",
			ents[0].GetIndex(), n.applied.Load())
	}
	for _, e := range ents {
		index := e.GetIndex()
		// Entries at or below the applied index are already in the state
		// machine (restart); raft still needs their configuration changes.
		replay := index <= n.applied.Load()
		switch e.GetType() {
		case raftpb.EntryNormal:
			if !replay {
				if err := n.applyNormal(e); err != nil {
					return false, err
				}
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			r, err := n.applyConfChange(e, !replay)
			if err != nil {
				return false, err
			}
			removed = removed || r
		}
		if !replay {
			n.setApplied(index)
		}
	}
	return removed, nil
}

// applyNormal applies one normal entry. An entry that does not decode is
// a fault of this member's storage (or of the log it was sent): skipping it
// would leave this member's state different from its peers' for good, so
// the member stops instead.
func (n *Node) applyNormal(e *raftpb.Entry) error {
	if len(e.GetData()) == 0 {
		return nil // the empty entry a new leader appends to commit its term
	}
	cmd := new(waldenv1.Command)
	if err := proto.Unmarshal(e.GetData(), cmd); err != nil {
		return n.corruptEntry(e, "command", err)
	}
	result, err := n.sm.Apply(e.GetIndex(), e.GetTerm(), cmd)
	if cmd.GetProposerId() == n.cfg.NodeID {
		n.wait.Trigger(cmd.GetRequestId(), applied{result: result, err: err})
	}
	return nil
}

// corruptEntry is the fault of a committed entry whose what does not
// decode.
func (n *Node) corruptEntry(e *raftpb.Entry, what string, err error) error {
	return fmt.Errorf("%w: the %s of raft entry %d (term %d) in data dir %s does not decode (%v); "+
		"the member stops rather than apply something else than its peers. Replace its data dir: "+
		"`waldenctl member remove %s`, empty the directory, `waldenctl member add %s` and start it with initial_cluster_state: existing",
		ErrCorruptEntry, what, e.GetIndex(), e.GetTerm(), n.dataDir(), err, n.cfg.NodeID, n.cfg.NodeID)
}

// applyConfChange applies a membership change to raft, the state machine
// (unless already applied there) and the transport. It reports whether the
// change removed this member.
func (n *Node) applyConfChange(e *raftpb.Entry, toStateMachine bool) (removed bool, err error) {
	var cc *raftpb.ConfChangeV2
	if e.GetType() == raftpb.EntryConfChange {
		v1 := new(raftpb.ConfChange)
		if err := proto.Unmarshal(e.GetData(), v1); err != nil {
			return false, n.corruptEntry(e, "membership change", err)
		}
		cc = v1.AsV2()
	} else {
		cc = new(raftpb.ConfChangeV2)
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			return false, n.corruptEntry(e, "membership change", err)
		}
	}
	var ctx *waldenv1.ConfChangeContext
	if len(cc.GetContext()) > 0 {
		ctx = new(waldenv1.ConfChangeContext)
		if err := proto.Unmarshal(cc.GetContext(), ctx); err != nil {
			return false, n.corruptEntry(e, "membership change's member description", err)
		}
	}

	cs := n.raft.ApplyConfChange(cc)
	n.mu.Lock()
	n.confState = proto.Clone(raftpb.EnsureConfState(cs)).(*raftpb.ConfState)
	if m := ctx.GetMember(); m.GetId() != "" {
		n.names[RaftID(m.GetId())] = m.GetId()
	}
	n.mu.Unlock()

	var smErr error
	if toStateMachine {
		smErr = n.sm.ApplyConfChange(e.GetIndex(), cc, ctx, cs)
		if smErr != nil {
			n.logger.Error("raftnode: state machine refused conf change", "index", e.GetIndex(), "err", smErr)
		}
		n.refreshMembers()
	}

	for _, ch := range cc.GetChanges() {
		id := ch.GetNodeId()
		switch ch.GetType() {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			if id == n.id {
				continue
			}
			addr := ""
			if m := ctx.GetMember(); RaftID(m.GetId()) == id {
				addr = m.GetRaftAddr()
			} else if m := n.member(id); m != nil {
				addr = m.GetRaftAddr()
			}
			if addr != "" {
				n.tr.AddPeer(id, addr)
			}
		case raftpb.ConfChangeRemoveNode:
			if id == n.id {
				removed = true
			} else {
				n.tr.RemovePeer(id)
			}
		}
		n.logger.Info("raftnode: membership changed", "change", ch.GetType().String(),
			"member", n.nameOf(id), "index", e.GetIndex(), "voters", len(cs.GetVoters()), "learners", len(cs.GetLearners()))
	}
	if ctx.GetRequestId() != 0 {
		n.wait.Trigger(ctx.GetRequestId(), applied{err: smErr})
	}
	return removed, nil
}

func (n *Node) setApplied(index uint64) {
	n.applied.Store(index)
	n.metrics.appliedIndex.Set(float64(index))
	n.applyWait.Applied(index)
}

// refreshMembers copies the state machine's membership (apply path only).
func (n *Node) refreshMembers() {
	ms := n.sm.Members()
	members := make(map[uint64]*waldenv1.Member, len(ms))
	for _, m := range ms {
		id := RaftID(m.GetId())
		mm := proto.Clone(m).(*waldenv1.Member)
		mm.RaftId = id
		members[id] = mm
	}
	n.mu.Lock()
	n.members = members
	for id, m := range members {
		n.names[id] = m.GetId()
	}
	n.mu.Unlock()
}

// maybeSnapshot snapshots the state machine and compacts the log once
// SnapshotCount entries were applied since the last snapshot, keeping
// SnapshotCatchUpEntries entries for slow followers.
func (n *Node) maybeSnapshot() error {
	applied := n.applied.Load()
	if applied-n.snapshotIndex < n.cfg.SnapshotCount {
		return nil
	}
	data, err := n.sm.Snapshot()
	if err != nil {
		return fmt.Errorf("raftnode: snapshot state machine at index %d: %w", applied, err)
	}
	n.mu.RLock()
	cs := proto.Clone(n.confState).(*raftpb.ConfState)
	n.mu.RUnlock()
	if _, err := n.st.CreateSnapshot(applied, cs, data); err != nil {
		if errors.Is(err, raft.ErrSnapOutOfDate) {
			n.snapshotIndex = applied
			return nil
		}
		return fmt.Errorf("raftnode: create snapshot at index %d: %w", applied, err)
	}
	n.snapshotIndex = applied
	n.metrics.snapshots.Inc()
	compactIndex := uint64(0)
	if applied > n.cfg.SnapshotCatchUpEntries {
		compactIndex = applied - n.cfg.SnapshotCatchUpEntries
		if err := n.st.Compact(compactIndex); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("raftnode: compact log at index %d: %w", compactIndex, err)
		}
	}
	n.logger.Info("raftnode: snapshot taken", "index", applied, "bytes", len(data), "compacted_to", compactIndex)
	return nil
}

// maybePromoteLearners, on the leader, promotes every learner whose log
// matches the leader's commit index (checked on every tick).
func (n *Node) maybePromoteLearners() {
	if n.leader.Load() != n.id {
		return
	}
	n.mu.RLock()
	hasLearners := len(n.confState.GetLearners()) > 0
	n.mu.RUnlock()
	if !hasLearners {
		return
	}
	st := n.raft.Status()
	if st.RaftState != raft.StateLeader {
		return
	}
	commit := st.HardState.GetCommit()
	for id, pr := range st.Progress {
		if !pr.IsLearner || pr.Match < commit {
			continue
		}
		n.mu.Lock()
		name, known := n.names[id]
		busy := n.promoting[id]
		if known && !busy {
			n.promoting[id] = true
		}
		n.mu.Unlock()
		if !known || busy {
			continue
		}
		n.logger.Info("raftnode: learner caught up, promoting", "member", name, "match", pr.Match, "commit", commit)
		go func() {
			defer func() {
				n.mu.Lock()
				delete(n.promoting, id)
				n.mu.Unlock()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 2*n.electionTimeout())
			defer cancel()
			if err := n.PromoteMember(ctx, name); err != nil {
				n.logger.Warn("raftnode: promoting learner failed", "member", name, "err", err)
			}
		}()
	}
}

func (n *Node) electionTimeout() time.Duration {
	return time.Duration(n.cfg.ElectionTicks) * n.cfg.TickInterval
}

// shutdown runs when the run goroutine exits.
func (n *Node) shutdown() {
	n.raft.Stop()
	if err := n.tr.Close(); err != nil {
		n.logger.Warn("raftnode: close transport", "err", err)
	}
	n.wait.FailAll(ErrStopped)
	n.leader.Store(raft.None)
	n.metrics.hasLeader.Set(0)
	close(n.donec)
}

// Stop stops the member: raft, its goroutines and the transport. It does
// not close the storage. Stop is idempotent.
func (n *Node) Stop() {
	n.stopOnce.Do(func() { close(n.stopc) })
	<-n.donec
}

// Done is closed once the member stopped: after Stop, two election
// timeouts after it applied its own removal, or after a fatal fault (which
// it logs, and Err returns).
func (n *Node) Done() <-chan struct{} { return n.donec }

// Err returns the fault that stopped the member (ErrCorruptEntry,
// ErrLogWentBackwards, a storage error), or nil while it runs and after
// Stop or its removal.
func (n *Node) Err() error {
	if p := n.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records the fault that stops the member, logs it and makes the run
// goroutine stop. The first fault wins.
func (n *Node) fail(err error) {
	n.fatalOnce.Do(func() {
		n.fatal.Store(&err)
		n.logger.Error("raftnode: fatal fault, stopping member", "data_dir", n.dataDir(), "err", err)
	})
	n.stopOnce.Do(func() { close(n.stopc) })
}

// dataDir names the member's data directory in messages.
func (n *Node) dataDir() string {
	if n.cfg.DataDir != "" {
		return n.cfg.DataDir
	}
	if p, ok := n.st.(interface{ Path() string }); ok {
		return filepath.Dir(p.Path())
	}
	return "(storage without a directory)"
}

func (n *Node) stopped() bool {
	if n.removed.Load() {
		return true
	}
	select {
	case <-n.donec:
		return true
	case <-n.stopc:
		return true
	default:
		return false
	}
}

// Propose replicates cmd and returns the state machine's result once the
// entry is applied on this member, or the state machine's error for it. It
// sets request_id and proposer_id, and proposed_unix_ms when zero, on a copy
// of cmd. It fails fast with ErrNoLeader when no leader is known; otherwise
// it waits for the outcome or ctx (callers set a deadline: a proposal lost
// with a leader change is never answered).
func (n *Node) Propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	start := time.Now()
	out, err := n.propose(ctx, cmd)
	if err != nil {
		n.metrics.proposalsFailed.Inc()
		return nil, err
	}
	n.metrics.proposalsCommitted.Inc()
	n.metrics.proposalDuration.Observe(time.Since(start).Seconds())
	return out.result, out.err
}

// propose returns the outcome of applying cmd (which may be the state
// machine's refusal), or an error when cmd was not applied (or its fate is
// unknown).
func (n *Node) propose(ctx context.Context, cmd *waldenv1.Command) (applied, error) {
	if cmd == nil {
		return applied{}, errors.New("raftnode: propose: nil command")
	}
	if n.stopped() {
		return applied{}, ErrStopped
	}
	if n.leader.Load() == raft.None {
		return applied{}, ErrNoLeader
	}
	cmd = proto.Clone(cmd).(*waldenv1.Command)
	cmd.RequestId = n.reqIDs.Next()
	cmd.ProposerId = n.cfg.NodeID
	if cmd.ProposedUnixMs == 0 {
		cmd.ProposedUnixMs = time.Now().UnixMilli()
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		return applied{}, fmt.Errorf("raftnode: propose: marshal command: %w", err)
	}
	ch := n.wait.Register(cmd.GetRequestId())
	if ch == nil {
		return applied{}, fmt.Errorf("raftnode: propose: request id %x already pending", cmd.GetRequestId())
	}
	defer n.wait.Cancel(cmd.GetRequestId())
	if n.leader.Load() == n.id && n.transferring.Load() == 0 {
		// On the leader, queue the entry: runProposals steps everything
		// queued in one proposal message, which raft appends and sends to
		// the followers as one batch instead of one append message per
		// proposal and follower.
		n.queueProposal(ctx, data)
	} else if err := n.raft.Propose(ctx, data); err != nil {
		// Elsewhere (and during a leadership transfer), propose one by
		// one: raft forwards to the leader and reports a refusal.
		return applied{}, n.raftError("propose", err)
	}
	select {
	case a := <-ch:
		if errors.Is(a.err, ErrStopped) {
			return applied{}, ErrStopped
		}
		return a, nil
	case <-ctx.Done():
		return applied{}, fmt.Errorf("raftnode: propose: %w", ctx.Err())
	case <-n.donec:
		return applied{}, ErrStopped
	}
}

// maxProposalBatch bounds the entries stepped into raft at once.
const maxProposalBatch = 1024

// queuedProposal is a proposal waiting for runProposals; ctx is its
// proposer's.
type queuedProposal struct {
	ctx  context.Context
	data []byte
}

func (n *Node) queueProposal(ctx context.Context, data []byte) {
	n.propMu.Lock()
	n.propQueue = append(n.propQueue, queuedProposal{ctx: ctx, data: data})
	n.propMu.Unlock()
	select {
	case n.propSignal <- struct{}{}:
	default:
	}
}

// runProposals steps the queued proposals into raft, as many as are queued
// (up to maxProposalBatch) in one MsgProp. Proposals queue up while raft
// takes the previous batch, so the batches grow with the load.
//
// raft.Node.Step does not report a dropped proposal the way Propose does. A
// batch is queued only while this member leads and no transfer runs; should
// leadership change before raft takes it, raft forwards it to the new leader
// or drops it, and its proposers wait for their deadline, as do those of a
// proposal lost with a leader change after raft took it.
func (n *Node) runProposals() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.stopc:
		case <-n.donec:
		}
		cancel()
	}()
	var batch []queuedProposal
	for {
		select {
		case <-n.propSignal:
		case <-ctx.Done():
			return
		}
		for {
			n.propMu.Lock()
			k := min(len(n.propQueue), maxProposalBatch)
			batch = append(batch[:0], n.propQueue[:k]...)
			rest := copy(n.propQueue, n.propQueue[k:])
			clear(n.propQueue[rest:])
			n.propQueue = n.propQueue[:rest]
			n.propMu.Unlock()
			if len(batch) == 0 {
				break
			}
			// A proposer that gave up before its entry reached raft is not
			// proposed for (as raft.Node.Propose with an expired ctx).
			ents := make([]*raftpb.Entry, 0, len(batch))
			for _, q := range batch {
				if q.ctx.Err() == nil {
					ents = append(ents, &raftpb.Entry{Type: raftpb.EntryNormal.Enum(), Data: q.data})
				}
			}
			clear(batch)
			if len(ents) == 0 {
				continue
			}
			msg := &raftpb.Message{Type: raftpb.MsgProp.Enum(), From: new(n.id), Entries: ents}
			if err := n.raft.Step(ctx, msg); err != nil {
				return // stopped
			}
		}
	}
}

// raftError maps an error of raft.Node to this package's errors.
func (n *Node) raftError(op string, err error) error {
	switch {
	case errors.Is(err, raft.ErrStopped):
		return ErrStopped
	case errors.Is(err, raft.ErrProposalDropped):
		if n.leader.Load() == raft.None {
			return ErrNoLeader
		}
		return fmt.Errorf("%w: %s", ErrProposalDropped, op)
	default:
		return fmt.Errorf("raftnode: %s: %w", op, err)
	}
}

// LinearizableRead returns once this member's state machine reflects every
// entry committed before the call (raft ReadIndex, then waiting for the
// applied index to reach the read index). It fails fast with ErrNoLeader.
func (n *Node) LinearizableRead(ctx context.Context) error {
	if n.stopped() {
		return ErrStopped
	}
	if n.leader.Load() == raft.None {
		return ErrNoLeader
	}
	rctx := make([]byte, 8)
	binary.BigEndian.PutUint64(rctx, n.reqIDs.Next())
	ch := make(chan uint64, 1)
	n.readMu.Lock()
	n.reads[string(rctx)] = ch
	n.readMu.Unlock()
	defer func() {
		n.readMu.Lock()
		delete(n.reads, string(rctx))
		n.readMu.Unlock()
	}()

	// raft drops a read index request it cannot serve yet (for example a
	// leader that has not committed an entry of its term); ask again every
	// election timeout.
	retry := time.NewTicker(n.electionTimeout())
	defer retry.Stop()
	for {
		if err := n.raft.ReadIndex(ctx, rctx); err != nil {
			return n.raftError("read index", err)
		}
		select {
		case index := <-ch:
			select {
			case <-n.applyWait.Wait(index):
				return nil
			case <-ctx.Done():
				return fmt.Errorf("raftnode: read index: wait for applied index %d: %w", index, ctx.Err())
			case <-n.donec:
				return ErrStopped
			}
		case <-retry.C:
			if n.leader.Load() == raft.None {
				return ErrNoLeader
			}
		case <-ctx.Done():
			return fmt.Errorf("raftnode: read index: %w", ctx.Err())
		case <-n.donec:
			return ErrStopped
		}
	}
}

func (n *Node) deliverReadState(rs raft.ReadState) {
	n.readMu.Lock()
	ch, ok := n.reads[string(rs.RequestCtx)]
	n.readMu.Unlock()
	if ok {
		select {
		case ch <- rs.Index:
		default:
		}
	}
}

// AddMember adds m as a learner (ConfChangeV2 AddLearnerNode) and returns
// once the change is applied on this member. The leader promotes the learner
// to voter by itself once the learner's log matches the leader's commit
// index.
func (n *Node) AddMember(ctx context.Context, m *waldenv1.MemberContext) error {
	switch {
	case m == nil || m.GetId() == "":
		return fmt.Errorf("%w: id is empty", ErrInvalidMember)
	case m.GetRaftAddr() == "":
		return fmt.Errorf("%w: raft_addr of %q is empty", ErrInvalidMember, m.GetId())
	}
	id := RaftID(m.GetId())
	if voter, learner := n.role(id); voter || learner {
		return fmt.Errorf("raftnode: add member %q: %w", m.GetId(), ErrMemberExists)
	}
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{
		Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(id),
	}}}
	member := proto.Clone(m).(*waldenv1.MemberContext)
	return n.proposeConfChange(ctx, "add member "+m.GetId(), cc, member)
}

// PromoteMember makes the learner id a voter. Promoting a voter does nothing.
func (n *Node) PromoteMember(ctx context.Context, id string) error {
	rid := RaftID(id)
	voter, learner := n.role(rid)
	switch {
	case voter:
		return nil
	case !learner:
		return fmt.Errorf("raftnode: promote member %q: %w", id, ErrUnknownMember)
	}
	var member *waldenv1.MemberContext
	if m := n.member(rid); m != nil {
		member = &waldenv1.MemberContext{Id: m.GetId(), RaftAddr: m.GetRaftAddr(), AdminAddr: m.GetAdminAddr()}
	}
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{
		Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(rid),
	}}}
	return n.proposeConfChange(ctx, "promote member "+id, cc, member)
}

// RemoveMember removes the voter or learner id. A member that applies its
// own removal stops (Done is closed).
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	rid := RaftID(id)
	voter, learner := n.role(rid)
	if !voter && !learner {
		return fmt.Errorf("raftnode: remove member %q: %w", id, ErrUnknownMember)
	}
	if voter {
		n.mu.RLock()
		voters := len(n.confState.GetVoters())
		n.mu.RUnlock()
		if voters <= 1 {
			return fmt.Errorf("raftnode: remove member %q: %w", id, ErrLastVoter)
		}
	}
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{
		Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(rid),
	}}}
	return n.proposeConfChange(ctx, "remove member "+id, cc, nil)
}

// proposeConfChange proposes cc with a ConfChangeContext carrying a request
// id and member, and waits until it is applied on this member. Raft ignores a
// change proposed while another is pending; the caller's ctx bounds the wait.
func (n *Node) proposeConfChange(ctx context.Context, op string, cc *raftpb.ConfChangeV2, member *waldenv1.MemberContext) error {
	n.confMu.Lock()
	defer n.confMu.Unlock()
	if n.stopped() {
		return ErrStopped
	}
	if n.leader.Load() == raft.None {
		return ErrNoLeader
	}
	reqID := n.reqIDs.Next()
	data, err := proto.Marshal(&waldenv1.ConfChangeContext{RequestId: reqID, Member: member})
	if err != nil {
		return fmt.Errorf("raftnode: %s: marshal context: %w", op, err)
	}
	cc.Context = data
	ch := n.wait.Register(reqID)
	if ch == nil {
		return fmt.Errorf("raftnode: %s: request id %x already pending", op, reqID)
	}
	defer n.wait.Cancel(reqID)
	if err := n.raft.ProposeConfChange(ctx, cc); err != nil {
		return n.raftError(op, err)
	}
	select {
	case a := <-ch:
		if a.err != nil && !errors.Is(a.err, ErrStopped) {
			return fmt.Errorf("raftnode: %s: %w", op, a.err)
		}
		return a.err
	case <-ctx.Done():
		return fmt.Errorf("raftnode: %s: %w", op, ctx.Err())
	case <-n.donec:
		return ErrStopped
	}
}

// TransferLeadership hands leadership to the voter id. It must be called on
// the leader (else ErrNotLeader) and waits until id leads or ctx is done.
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	if n.stopped() {
		return ErrStopped
	}
	if n.leader.Load() != n.id {
		return ErrNotLeader
	}
	rid := RaftID(id)
	voter, learner := n.role(rid)
	switch {
	case learner:
		return fmt.Errorf("raftnode: transfer leadership to %q: %w", id, ErrNotVoter)
	case !voter:
		return fmt.Errorf("raftnode: transfer leadership to %q: %w", id, ErrUnknownMember)
	case rid == n.id:
		return nil
	}
	n.transferring.Add(1)
	defer n.transferring.Add(-1)
	n.logger.Info("raftnode: transferring leadership", "to", id, "term", n.term.Load())
	n.raft.TransferLeadership(ctx, n.id, rid)
	poll := time.NewTicker(n.cfg.TickInterval)
	defer poll.Stop()
	retry := time.NewTicker(n.electionTimeout())
	defer retry.Stop()
	for {
		select {
		case <-poll.C:
			if n.leader.Load() == rid {
				return nil
			}
		case <-retry.C:
			// raft abandons a transfer that did not finish within an
			// election timeout; ask again while still leading.
			if n.leader.Load() == n.id {
				n.raft.TransferLeadership(ctx, n.id, rid)
			}
		case <-ctx.Done():
			return fmt.Errorf("raftnode: transfer leadership to %q: %w", id, ctx.Err())
		case <-n.donec:
			return ErrStopped
		}
	}
}

// Status reports this member's view of the cluster.
func (n *Node) Status() Status {
	rs := n.raft.Status()
	s := Status{
		ClusterName:  n.cfg.ClusterName,
		NodeID:       n.cfg.NodeID,
		Term:         rs.HardState.GetTerm(),
		CommitIndex:  rs.HardState.GetCommit(),
		AppliedIndex: n.applied.Load(),
	}
	if n.stopped() {
		s.Term, s.CommitIndex = n.term.Load(), n.commit.Load()
		rs.Lead = raft.None
	}
	if rs.Lead != raft.None {
		s.LeaderID = n.nameOf(rs.Lead)
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	selfLearner := slices.Contains(n.confState.GetLearners(), n.id)
	s.RaftState = raftStateName(rs.RaftState, selfLearner)
	for id, m := range n.members {
		mm := proto.Clone(m).(*waldenv1.Member)
		mm.RaftId = id
		switch {
		case slices.Contains(n.confState.GetLearners(), id):
			mm.Role = "learner"
		case id == rs.Lead:
			mm.Role = "leader"
		default:
			mm.Role = "follower"
		}
		mm.Reachable = id == n.id || n.tr.Reachable(id)
		if pr, ok := rs.Progress[id]; ok {
			mm.MatchIndex = pr.Match
		}
		s.Members = append(s.Members, mm)
	}
	sort.Slice(s.Members, func(i, j int) bool { return s.Members[i].GetId() < s.Members[j].GetId() })
	return s
}

func raftStateName(st raft.StateType, learner bool) string {
	switch st {
	case raft.StateLeader:
		return "leader"
	case raft.StateCandidate:
		return "candidate"
	case raft.StatePreCandidate:
		return "pre-candidate"
	default:
		if learner {
			return "learner"
		}
		return "follower"
	}
}

// LeaderID is the member id of the leader this member knows, or "".
func (n *Node) LeaderID() string {
	lead := n.leader.Load()
	if lead == raft.None {
		return ""
	}
	return n.nameOf(lead)
}

// IsLeader reports whether this member is the leader.
func (n *Node) IsLeader() bool { return n.leader.Load() == n.id }

// Ready reports whether the member knows a leader and has applied every
// entry up to the commit index it found in its storage at start (the
// bootstrap entries for a new member) — the /readyz condition.
func (n *Node) Ready() bool {
	return !n.stopped() && n.leader.Load() != raft.None && n.applied.Load() >= n.readyCommit
}

// Member returns this member's view of member id with its addresses, or nil.
func (n *Node) member(id uint64) *waldenv1.Member {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.members[id]
}

// inConfig reports whether this member is a voter or a learner of the
// applied configuration.
func (n *Node) inConfig() bool {
	voter, learner := n.role(n.id)
	return voter || learner
}

// role reports whether raft id is a voter or a learner in the applied
// configuration.
func (n *Node) role(id uint64) (voter, learner bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	cs := n.confState
	voter = slices.Contains(cs.GetVoters(), id) || slices.Contains(cs.GetVotersOutgoing(), id)
	learner = slices.Contains(cs.GetLearners(), id) || slices.Contains(cs.GetLearnersNext(), id)
	return voter, learner
}

func (n *Node) nameOf(id uint64) string {
	if id == raft.None {
		return ""
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if name, ok := n.names[id]; ok {
		return name
	}
	return fmt.Sprintf("%x", id)
}

// Process steps a message received from a peer into raft (Handler).
func (n *Node) Process(ctx context.Context, m *raftpb.Message) error {
	if err := n.checkLogNotBehind(m); err != nil {
		n.fail(err)
		return ErrStopped
	}
	if err := n.raft.Step(ctx, m); err != nil {
		if errors.Is(err, raft.ErrStopped) {
			return ErrStopped
		}
		return fmt.Errorf("raftnode: step: %w", err)
	}
	return nil
}

// checkLogNotBehind refuses a heartbeat whose commit index is beyond this
// member's last stored entry. The leader sends min(its commit index, the
// index this member acknowledged last), and this member acknowledges only
// what it has stored (it sends after Save): so this member acknowledged
// entries, in this term or a later one than it has stored, that its log no
// longer holds. Raft itself would panic on it ("tocommit out of range").
// A heartbeat of an older term than the stored one is left to raft, which
// ignores it (a log truncated by a newer leader is shorter legitimately).
func (n *Node) checkLogNotBehind(m *raftpb.Message) error {
	if m.GetType() != raftpb.MessageType_MsgHeartbeat || m.GetCommit() == 0 || m.GetTerm() < n.term.Load() {
		return nil
	}
	last, err := n.st.LastIndex()
	if err != nil || m.GetCommit() <= last {
		return nil
	}
	return fmt.Errorf("%w: the leader %s says member %s acknowledged raft entries up to index %d (term %d), "+
		"but its log in data dir %s ends at index %d (term %d): the data dir is an older copy, or it was wiped "+
		"while %s stayed a member. A member that lost what it acknowledged can break the cluster's agreement, so it is refused. "+
		"Way back: `waldenctl member remove %s`, empty %s, `waldenctl member add %s --raft ADDR --admin ADDR`, "+
		"then start it with initial_cluster_state: existing",
		ErrLogWentBackwards, n.nameOf(m.GetFrom()), n.cfg.NodeID, m.GetCommit(), m.GetTerm(), n.dataDir(), last, n.term.Load(),
		n.cfg.NodeID, n.cfg.NodeID, n.dataDir(), n.cfg.NodeID)
}

// ReportUnreachable tells raft that a message to id was not delivered
// (Handler).
func (n *Node) ReportUnreachable(id uint64) {
	n.metrics.peerSendFailures.Inc()
	n.raft.ReportUnreachable(id)
}

// ReportSnapshot tells raft whether a snapshot reached id (Handler).
func (n *Node) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	n.raft.ReportSnapshot(id, status)
}

// raftLogger routes raft's logs to slog. raft's Fatal and Panic mean a
// broken invariant (corruption); they log and panic, as raft expects.
type raftLogger struct{ l *slog.Logger }

func (r *raftLogger) Debug(v ...any)                 { r.l.Debug(fmt.Sprint(v...)) }
func (r *raftLogger) Debugf(format string, v ...any) { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r *raftLogger) Info(v ...any)                  { r.l.Info(fmt.Sprint(v...)) }
func (r *raftLogger) Infof(format string, v ...any)  { r.l.Info(fmt.Sprintf(format, v...)) }
func (r *raftLogger) Warning(v ...any)               { r.l.Warn(fmt.Sprint(v...)) }
func (r *raftLogger) Warningf(format string, v ...any) {
	r.l.Warn(fmt.Sprintf(format, v...))
}
func (r *raftLogger) Error(v ...any)                 { r.l.Error(fmt.Sprint(v...)) }
func (r *raftLogger) Errorf(format string, v ...any) { r.l.Error(fmt.Sprintf(format, v...)) }
func (r *raftLogger) Fatal(v ...any)                 { r.Panic(v...) }
func (r *raftLogger) Fatalf(format string, v ...any) { r.Panicf(format, v...) }
func (r *raftLogger) Panic(v ...any) {
	s := fmt.Sprint(v...)
	r.l.Error(s)
	panic(s)
}
func (r *raftLogger) Panicf(format string, v ...any) {
	s := fmt.Sprintf(format, v...)
	r.l.Error(s)
	panic(s)
}
