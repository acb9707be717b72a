package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
)

// Node is one running member of the raft group. One goroutine owns the
// raft.Node: it ticks the clock and handles every Ready (persist, send,
// apply, advance). Other goroutines talk to it only through raft's channels,
// the wait registries and atomics.
type Node struct {
	cfg     Config
	id      uint64
	logger  *slog.Logger
	sm      StateMachine
	st      raftlog.Storage
	tr      Transport
	raft    raft.Node
	rlog    *raftLogger
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
	// confIndex is the index of the configuration applied last: of the
	// last membership change, or of the snapshot restored. Owned by the run
	// goroutine.
	confIndex uint64
	// snapshotsApplied counts snapshots received from a leader and applied.
	snapshotsApplied atomic.Uint64

	mu        sync.RWMutex
	confState *raftpb.ConfState
	members   map[uint64]*waldenv1.Member // by raft id, from sm.Members()
	names     map[uint64]string           // every member id ever seen, by raft id
	promoting map[uint64]bool             // learners with a promotion in flight
	// removedPeers holds, by raft id, every member whose removal this
	// member applied (and no addition since): Process refuses their
	// messages, so that a removed member that missed its removal learns of
	// it from the answer.
	removedPeers map[uint64]*removedPeer

	readMu sync.Mutex
	reads  map[string]chan uint64 // ReadIndex request ctx -> read index
	// readNext is the read round that callers join (see readRound);
	// readSignal (capacity 1) tells runReads it has callers. readCtx ends
	// with the node.
	readNext   *readRound
	readSignal chan struct{}
	readCtx    context.Context
	readCancel context.CancelFunc

	confMu sync.Mutex // one membership change at a time from this member
	// voterChangedAt is when this member applied the last change of the
	// voters (or started, or restored a snapshot): Config.VoterChangeWait
	// is counted from it. Guarded by mu.
	voterChangedAt time.Time

	// Proposals made on the leader are queued and stepped into raft in
	// batches by runProposals (see propose).
	propMu     sync.Mutex
	propQueue  []queuedProposal
	propSignal chan struct{} // capacity 1: the queue is not empty
	// transferring is set while TransferLeadership runs: raft drops
	// proposals during a transfer, so they take the path that reports it.
	transferring atomic.Int32
	// removed is set once this member applied its own removal, or a peer
	// refused its messages for it; it stops shortly after.
	removed atomic.Bool
	// forwardProposals is set while raft.Node takes no proposals from this
	// member: raft stops accepting them once the member applies its own
	// removal and starts again only on a leader change (etcd raft's
	// node.run). A member added again under its name replays that removal
	// from the leader's log, then the entry adding it back; it forwards
	// its proposals to the leader itself (as raft would) until raft reports
	// a new leader. Set and cleared by the run goroutine.
	forwardProposals atomic.Bool
	// removalReports carries the refusals of peers that applied this
	// member's removal (ReportRemoved) to the run goroutine.
	removalReports chan removalReport
	// commitTicks holds the commit index at each of the last
	// ElectionTicks+1 ticks while this member leads (oldest first): a
	// member commits when it has acknowledged what was committed one
	// election timeout ago (Status). Guarded by mu.
	commitTicks []uint64

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
func NewNode(cfg Config, sm StateMachine, st raftlog.Storage, tr Transport) (*Node, error) {
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
	n := newNode(cfg, sm, st, tr, metrics)
	empty := st.IsEmpty()
	hs, err := n.restoreFromStorage()
	if err != nil {
		return nil, err
	}
	rc := n.raftConfig()
	// raft.StartNode and RestartNode panic on a bad config; check it first
	// so that NewNode returns the error instead.
	probe := *rc
	if _, err := raft.NewRawNode(&probe); err != nil {
		return nil, fmt.Errorf("raftnode: raft config: %w", err)
	}
	var peers []raft.Peer
	if empty && n.founding() {
		if peers, err = bootstrapPeers(cfg.InitialCluster); err != nil {
			return nil, err
		}
		n.readyCommit = uint64(len(peers))
	}
	n.addKnownPeers(empty)
	n.startRaft(rc, peers, empty, hs)
	if err := tr.Start(n); err != nil {
		n.raft.Stop()
		_ = tr.Close()
		return nil, fmt.Errorf("raftnode: start transport: %w", err)
	}
	go n.run()
	go n.runProposals()
	go n.runReads()
	started = true
	return n, nil
}

// newNode is the member before it reads its storage: its identity, its
// channels and the names of the founding members.
func newNode(cfg Config, sm StateMachine, st raftlog.Storage, tr Transport, metrics *nodeMetrics) *Node {
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
		readSignal: make(chan struct{}, 1),
		propSignal: make(chan struct{}, 1),

		voterChangedAt: time.Now(),
		removedPeers:   make(map[uint64]*removedPeer),
		removalReports: make(chan removalReport, 4),
		stopc:          make(chan struct{}),
		donec:          make(chan struct{}),
	}
	n.readCtx, n.readCancel = context.WithCancel(context.Background())
	n.readNext = newReadRound(n.readCtx)
	n.rlog = &raftLogger{l: n.logger.With("component", "raft")}
	for _, m := range cfg.InitialCluster {
		n.names[RaftID(m.GetId())] = m.GetId()
		n.rlog.learn(RaftID(m.GetId()), m.GetId())
	}
	return n
}

// restoreFromStorage restores the state machine from the latest snapshot
// (raft replays the committed entries after it) and takes the applied,
// committed and membership state from the storage. It returns the stored
// HardState.
func (n *Node) restoreFromStorage() (*raftpb.HardState, error) {
	hs, cs, err := n.st.InitialState()
	if err != nil {
		return nil, fmt.Errorf("raftnode: read initial state: %w", err)
	}
	snap, err := n.st.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("raftnode: read snapshot: %w", err)
	}
	snapIndex := snap.GetMetadata().GetIndex()
	if !raft.IsEmptySnap(snap) && snapIndex > n.sm.AppliedIndex() {
		if err := n.sm.Restore(snap.GetData()); err != nil {
			return nil, fmt.Errorf("raftnode: restore snapshot at index %d: %w", snapIndex, err)
		}
	}
	n.snapshotIndex = snapIndex
	n.confIndex = snapIndex
	// The state machine may lag the snapshot index by entries it never sees
	// (the empty entries of new leaders).
	applied := max(n.sm.AppliedIndex(), snapIndex)
	n.applied.Store(applied)
	n.applyWait = newIndexWaiter(applied)
	n.metrics.appliedIndex.Set(float64(applied))
	n.confState = proto.Clone(raftpb.EnsureConfState(cs)).(*raftpb.ConfState)
	n.term.Store(hs.GetTerm())
	n.commit.Store(hs.GetCommit())
	n.readyCommit = hs.GetCommit()
	n.refreshMembers()
	return hs, nil
}

// raftConfig is the raft member's config: CheckQuorum and PreVote on, as
// etcd runs them, and applied from the snapshot's index.
func (n *Node) raftConfig() *raft.Config {
	return &raft.Config{
		ID:                n.id,
		ElectionTick:      n.cfg.ElectionTicks,
		HeartbeatTick:     n.cfg.HeartbeatTicks,
		Storage:           n.st,
		Applied:           n.snapshotIndex,
		MaxSizePerMsg:     n.cfg.MaxSizePerMsg,
		MaxInflightMsgs:   n.cfg.MaxInflightMsgs,
		CheckQuorum:       true,
		PreVote:           true,
		StepDownOnRemoval: true,
		Logger:            n.rlog,
	}
}

// founding reports whether this member is one of initial_cluster's (it
// bootstraps the cluster when its storage is empty).
func (n *Node) founding() bool {
	for _, m := range n.cfg.InitialCluster {
		if m.GetId() == n.cfg.NodeID {
			return true
		}
	}
	return false
}

// addKnownPeers gives the transport the peers known before anything is
// applied: the founding members (for a new or joining member, empty) and
// the members of the restored snapshot.
func (n *Node) addKnownPeers(empty bool) {
	for _, m := range n.cfg.InitialCluster {
		if id := RaftID(m.GetId()); id != n.id && empty {
			n.tr.AddPeer(id, m.GetRaftAddr())
		}
	}
	for id, m := range n.members {
		if id != n.id {
			n.tr.AddPeer(id, m.GetRaftAddr())
		}
	}
}

// startRaft starts the raft member: bootstrapping a new cluster (peers),
// joining one with empty storage, or restarting from storage.
func (n *Node) startRaft(rc *raft.Config, peers []raft.Peer, empty bool, hs *raftpb.HardState) {
	switch {
	case len(peers) > 0:
		n.logger.Info("raftnode: bootstrapping new cluster", "cluster", n.cfg.ClusterName, "members", len(peers))
		n.raft = raft.StartNode(rc, peers)
	case empty:
		n.logger.Info("raftnode: joining existing cluster with empty storage", "cluster", n.cfg.ClusterName)
		n.raft = raft.RestartNode(rc)
	default:
		n.logger.Info("raftnode: restarting from storage", "cluster", n.cfg.ClusterName,
			"term", hs.GetTerm(), "commit", hs.GetCommit(), "snapshot_index", n.snapshotIndex)
		n.raft = raft.RestartNode(rc)
	}
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

// run is the goroutine that owns the raft.Node.
func (n *Node) run() {
	defer n.shutdown()
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	// removedc fires a while after this member learnt of its removal: it
	// applied the entry that removed it, or a peer that applied it refused
	// its messages. removedAt is that entry's index.
	var removedc <-chan time.Time
	var removedAt uint64
	for {
		select {
		case <-ticker.C:
			n.raft.Tick()
			n.maybePromoteLearners()
			n.recordCommitTick()
		case rd := <-n.raft.Ready():
			own, err := n.handleReady(rd)
			if err != nil {
				n.fail(err)
				return
			}
			removedAt = max(removedAt, own)
			if removedAt == 0 {
				continue
			}
			if n.confIndex > removedAt && n.inConfig() {
				// Added again after its removal (a replacement under the
				// same name replays both from the leader's log): it stays.
				if removedc != nil {
					n.logger.Info("raftnode: this member was added again after its removal; it keeps running")
				}
				removedc, removedAt = nil, 0
				n.removed.Store(false)
				continue
			}
			if removedc == nil {
				removedc = n.lingerRemoved("raftnode: this member was removed from the cluster, stopping", "removed_index", removedAt)
			}
		case r := <-n.removalReports:
			// A peer that applied this member's removal refuses its
			// messages. Unless this member applied that entry itself (then
			// its own configuration decides: removed, or added again), it
			// missed its removal: nobody sends to it any more.
			if r.index <= n.applied.Load() || removedc != nil {
				continue
			}
			removedAt = r.index
			removedc = n.lingerRemoved("raftnode: a peer refuses this member's messages: it was removed from the cluster by a raft entry "+
				"this member never received; stopping", "peer", n.nameOf(r.by), "removed_index", r.index, "applied_index", n.applied.Load())
		case <-removedc:
			return
		case <-n.stopc:
			return
		}
	}
}

// lingerRemoved marks this member removed and returns the timer of its stop.
// It lingers before stopping, as etcd does: a removed leader must still
// deliver the commit index of its removal (and vote and append for the
// survivors while they have not applied it), else the survivors keep a
// configuration that needs this member; with two voters, forever.
func (n *Node) lingerRemoved(msg string, args ...any) <-chan time.Time {
	n.removed.Store(true)
	wait := 2 * n.electionTimeout()
	n.logger.Warn(msg, append(args, "in", wait)...)
	return time.After(wait)
}

// removedPeer is a member whose removal this member applied.
type removedPeer struct {
	index  uint64 // the entry that removed it
	warned bool   // its first refused message was logged
}

// removalReport is a peer's refusal of this member's messages.
type removalReport struct{ by, index uint64 }

// handleReady handles one Ready. It reports the index of the entry that
// removed this member, if it applied one (else 0). An error is fatal: the
// member stops.
func (n *Node) handleReady(rd raft.Ready) (removed uint64, err error) {
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
			return 0, err
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
		return 0, fmt.Errorf("raftnode: persist ready: %w", err)
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
			return 0, err
		}
	}

	// 8. Apply the committed entries in log order (unless done in 3).
	if !applyFirst {
		if removed, err = n.applyEntries(rd.CommittedEntries); err != nil {
			return 0, err
		}
	}

	// 9. Snapshot the state machine and compact the log every
	//    SnapshotCount applied entries, once the applied entries are stored.
	if err := n.maybeSnapshot(); err != nil {
		return 0, err
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
	// raft.Node takes proposals again on a leader change.
	n.forwardProposals.Store(false)
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
	cs := raftpb.EnsureConfState(snap.GetMetadata().GetConfState())
	n.mu.Lock()
	if !sameVoters(n.confState, cs) {
		n.voterChangedAt = time.Now()
	}
	n.confState = proto.Clone(cs).(*raftpb.ConfState)
	for _, ids := range [][]uint64{cs.GetVoters(), cs.GetLearners(), cs.GetVotersOutgoing(), cs.GetLearnersNext()} {
		for _, id := range ids {
			delete(n.removedPeers, id) // added again since
		}
	}
	n.mu.Unlock()
	n.confIndex = index
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

// applyEntries applies committed entries; it reports the index of the last
// one that removed this member (0: none did).
func (n *Node) applyEntries(ents []*raftpb.Entry) (removed uint64, err error) {
	if len(ents) > 0 && ents[0].GetIndex() > n.applied.Load()+1 {
		// Entries between the applied index and these are missing: the
		// state machine would silently diverge.
		return 0, fmt.Errorf("raftnode: committed entries start at index %d, applied index is %d",
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
					return 0, err
				}
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			r, err := n.applyConfChange(e, !replay)
			if err != nil {
				return 0, err
			}
			if r {
				removed = index
			}
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

	wasMember := n.inConfig()
	cs := n.raft.ApplyConfChange(cc)
	if wasMember && !confStateHas(cs, n.id) {
		n.forwardProposals.Store(true)
	}
	n.confIndex = e.GetIndex()
	n.mu.Lock()
	if !sameVoters(n.confState, cs) {
		n.voterChangedAt = time.Now()
	}
	n.confState = proto.Clone(raftpb.EnsureConfState(cs)).(*raftpb.ConfState)
	if m := ctx.GetMember(); m.GetId() != "" {
		n.names[RaftID(m.GetId())] = m.GetId()
		n.rlog.learn(RaftID(m.GetId()), m.GetId())
	}
	// Refuse a removed member's messages from now on (they would reach raft
	// from a member it no longer counts), and accept them again once it is
	// added back: raft sends to it only after this Ready.
	for _, ch := range cc.GetChanges() {
		switch id := ch.GetNodeId(); ch.GetType() {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			delete(n.removedPeers, id)
		case raftpb.ConfChangeRemoveNode:
			if id != n.id {
				n.removedPeers[id] = &removedPeer{index: e.GetIndex()}
			}
		}
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
		n.rlog.learn(id, m.GetId())
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
// timeouts after it learnt of its own removal (it applied the entry, or a
// peer that applied it refused its messages), or after a fatal fault (which
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

// Process steps a message received from a peer into raft (Handler). A
// message from a member whose removal this member applied is refused with a
// RemovedError (the transport hands it back to the sender: ReportRemoved),
// unless a leader sends it to its followers: this member may lag behind the
// entry that added the sender again, and learns it only from that leader.
func (n *Node) Process(ctx context.Context, m *raftpb.Message) error {
	if n.cfg.VoterChangeWait != nil && m.GetType() == raftpb.MsgProp && hasConfChange(m) {
		// Membership changes are made on the leader, which spaces voter
		// changes; one forwarded through raft was not checked.
		n.logger.Warn("raftnode: dropping a membership change forwarded by a peer: changes are made on the leader",
			"peer", n.nameOf(m.GetFrom()))
		return nil
	}
	if !leaderToFollower(m.GetType()) {
		if err := n.refuseRemoved(m.GetFrom()); err != nil {
			return err
		}
	}
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

// leaderToFollower reports whether t is a message that only a leader sends,
// to its followers.
func leaderToFollower(t raftpb.MessageType) bool {
	switch t {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap, raftpb.MsgTimeoutNow, raftpb.MsgReadIndexResp:
		return true
	}
	return false
}

// refuseRemoved returns a RemovedError when from is a member whose removal
// this member applied (logged once per member), else nil.
func (n *Node) refuseRemoved(from uint64) error {
	n.mu.RLock()
	p, ok := n.removedPeers[from]
	n.mu.RUnlock()
	if !ok {
		return nil
	}
	n.mu.Lock()
	first := !p.warned
	p.warned = true
	index := p.index
	n.mu.Unlock()
	err := &RemovedError{Member: n.nameOf(from), Index: index}
	if first {
		n.logger.Warn("raftnode: refusing the messages of a removed member; it stops on this answer",
			"member", err.Member, "removed_index", err.Index)
	}
	return err
}

// ReportRemoved tells this member that peer id refused its messages because
// the peer applied this member's removal at index (Handler). Unless this
// member applied that entry itself (its own configuration then decides), it
// stops after the same linger as on applying its removal.
func (n *Node) ReportRemoved(id, index uint64) {
	if index <= n.applied.Load() {
		n.logger.Debug("raftnode: a peer refuses this member's messages for a removal this member applied",
			"peer", n.nameOf(id), "removed_index", index)
		return
	}
	select {
	case n.removalReports <- removalReport{by: id, index: index}:
	default: // reports are pending already
	}
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

// raftLogger routes raft's logs to slog. raft's own progress (elections,
// votes, leader changes, which the node logs in its own words) goes to
// debug, with every member named instead of its hexadecimal raft id; its
// warnings and errors stay what they are. raft's Fatal and Panic mean a
// broken invariant (corruption); they log and panic, as raft expects.
type raftLogger struct {
	l *slog.Logger
	// names maps the hexadecimal form raft prints of a raft id to the
	// member's name (a sync.Map: raft logs from its own goroutine, whatever
	// locks the node holds).
	names sync.Map
}

// learn records member name's raft id.
func (r *raftLogger) learn(id uint64, name string) {
	r.names.Store(strconv.FormatUint(id, 16), name)
}

var hexID = regexp.MustCompile(`\b[0-9a-f]{6,16}\b`)

// named writes msg with the members' names for their raft ids.
func (r *raftLogger) named(msg string) string {
	return hexID.ReplaceAllStringFunc(msg, func(h string) string {
		if n, ok := r.names.Load(h); ok {
			return n.(string)
		}
		return h
	})
}

func (r *raftLogger) Debug(v ...any) { r.l.Debug(r.named(fmt.Sprint(v...))) }

func (r *raftLogger) Debugf(format string, v ...any) { r.l.Debug(r.named(fmt.Sprintf(format, v...))) }

func (r *raftLogger) Info(v ...any) { r.l.Debug(r.named(fmt.Sprint(v...))) }

func (r *raftLogger) Infof(format string, v ...any) { r.l.Debug(r.named(fmt.Sprintf(format, v...))) }

func (r *raftLogger) Warning(v ...any) { r.l.Warn(r.named(fmt.Sprint(v...))) }

func (r *raftLogger) Warningf(format string, v ...any) {
	r.l.Warn(r.named(fmt.Sprintf(format, v...)))
}

func (r *raftLogger) Error(v ...any) { r.l.Error(fmt.Sprint(v...)) }

func (r *raftLogger) Errorf(format string, v ...any) { r.l.Error(fmt.Sprintf(format, v...)) }

func (r *raftLogger) Fatal(v ...any) { r.Panic(v...) }

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
