package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"walden/config"
	"walden/fsm"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
	"walden/raftnode"
)

// ForceNewCluster rewrites the raft log in cfg.data_dir so that this member
// is the only voter when it starts: the way out of a lost quorum when the
// other members are gone for good (etcd's --force-new-cluster). The member
// keeps everything its log holds; the others must not come back with their
// old data (wipe their data_dir and add them again with `waldenctl member
// add`). It does nothing to a member that is already alone.
func ForceNewCluster(cfg *config.Server, logger *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	st, err := raftlog.Open(cfg.DataDir, cfg.ClusterName, cfg.NodeID, logger.With("component", "storage"))
	if err != nil {
		return fmt.Errorf("server: data_dir %s refused: %w", cfg.DataDir, err)
	}
	names := memberNames(st, cfg.ClusterName)
	if err := checkSurvivorIsNewest(cfg, st, logger); err != nil {
		_ = st.Close()
		return err
	}
	var forced raftnode.ForcedLog
	removed, err := raftnode.ForceNewCluster(st, cfg.NodeID, func(l raftnode.ForcedLog) ([]byte, error) {
		forced = l
		op := &waldenv1.ForceNewCluster{NodeId: cfg.NodeID, LastIndex: l.LastIndex, CommitIndex: l.CommitIndex, Term: l.Term,
			EpochBump: ForceNewClusterEpochBump, UnixMs: time.Now().UnixMilli()}
		for _, id := range l.Removed {
			op.Removed = append(op.Removed, nameOr(names, id))
		}
		return proto.Marshal(&waldenv1.Command{ProposerId: cfg.NodeID, ProposedUnixMs: op.GetUnixMs(),
			Op: &waldenv1.Command_ForceNewCluster{ForceNewCluster: op}})
	})
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("server: --force-new-cluster: %w", err)
	}
	if len(removed) == 0 {
		logger.Info("force new cluster: this member is already the only voter; nothing to change", "node_id", cfg.NodeID)
		return nil
	}
	ids := make([]string, len(removed))
	for i, id := range removed {
		ids[i] = nameOr(names, id)
	}
	logger.Warn("force new cluster: this member will be the only voter; the other members are removed from the configuration; do not restart them with their old data",
		"node_id", cfg.NodeID, "removed", ids)
	logger.Warn(fmt.Sprintf("force new cluster: this member's log ends at index %d (term %d; it knew entries up to %d committed): "+
		"whatever the lost members committed beyond index %d is lost. Every broker's epoch is revoked (brokers register again "+
		"and upload what their WALs hold beyond the catalog), and fencing tokens and stream epochs move %d past what this log "+
		"issued; the event log records it (waldenctl events --kind force_new_cluster)",
		forced.LastIndex, forced.Term, forced.CommitIndex, forced.LastIndex, ForceNewClusterEpochBump),
		"node_id", cfg.NodeID, "last_index", forced.LastIndex, "commit_index", forced.CommitIndex, "term", forced.Term)
	return nil
}

// Refusals of ForceNewCluster; nothing is changed.
var (
	// ErrQuorumNotLost: a majority of the members answer; they elect a
	// leader without this member being forced.
	ErrQuorumNotLost = errors.New("server: --force-new-cluster: the quorum is not lost")
	// ErrNotNewestDataDir: another member answers with a log that goes
	// further than this member's: forcing this one would lose its entries.
	ErrNotNewestDataDir = errors.New("server: --force-new-cluster: another member's log is newer")
)

// survivorProbeTimeout bounds the status call to each other member.
const survivorProbeTimeout = 2 * time.Second

// checkSurvivorIsNewest asks every other member this member's log or its
// config file knows for its status. It refuses when a majority answers
// (the quorum is not lost) or when one answers with an applied or commit
// index beyond this member's last index (force the new cluster there).
// Members that do not answer are logged: their data is what would be lost.
func checkSurvivorIsNewest(cfg *config.Server, st *raftlog.DiskStorage, logger *slog.Logger) error {
	last, err := st.LastIndex()
	if err != nil {
		return fmt.Errorf("server: --force-new-cluster: read the log: %w", err)
	}
	peers := map[string]string{} // id -> admin address
	for _, m := range cfg.InitialCluster {
		peers[m.ID] = m.Admin
	}
	if snap, err := st.Snapshot(); err == nil && len(snap.GetData()) > 0 {
		s := fsm.New(cfg.ClusterName)
		if s.Restore(snap.GetData()) == nil {
			for _, m := range s.Members() {
				peers[m.GetId()] = m.GetAdminAddr()
			}
		}
	}
	delete(peers, cfg.NodeID)
	if len(peers) == 0 {
		return nil // alone already: nothing to ask
	}
	creds, err := mtls.ClientCreds(cfg.TLS)
	if err != nil {
		return fmt.Errorf("server: --force-new-cluster: %w", err)
	}
	var up, down []string
	for _, id := range slices.Sorted(maps.Keys(peers)) {
		addr := peers[id]
		if addr == "" {
			down = append(down, id)
			continue
		}
		resp, err := memberStatus(addr, creds)
		if err != nil {
			logger.Warn("force new cluster: member does not answer", "member_id", id, "admin_addr", addr, "err", err)
			down = append(down, id)
			continue
		}
		up = append(up, id)
		if n := max(resp.GetAppliedIndex(), resp.GetCommitIndex()); n > last {
			return fmt.Errorf("%w: member %s answers with entries up to index %d, beyond this member's last index %d: "+
				"force the new cluster on %s instead (stop this member and start %s with --force-new-cluster)",
				ErrNotNewestDataDir, id, n, last, id, id)
		}
	}
	if members := len(peers) + 1; 2*(len(up)+1) > members {
		return fmt.Errorf("%w: %d of %d members answer (%s and this one): start this member as usual, they elect a leader; "+
			"bring back the others (docs/runbook.md#quorum-loss)", ErrQuorumNotLost, len(up)+1, members, strings.Join(up, ", "))
	}
	logger.Warn("force new cluster: the other members do not answer; what only they hold is lost", "unreachable", down, "answering", up, "last_index", last)
	return nil
}

// memberStatus asks the member at addr for its status.
func memberStatus(addr string, creds credentials.TransportCredentials) (*waldenv1.StatusResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), survivorProbeTimeout)
	defer cancel()
	return waldenv1.NewClusterClient(conn).Status(ctx, &waldenv1.StatusRequest{})
}

// ForceNewClusterEpochBump is how far --force-new-cluster moves the next
// fencing token and every stream's epoch: far more registrations,
// failovers and stream opens than the lost members can have committed
// beyond the survivor's log.
const ForceNewClusterEpochBump = 1_000_000

// memberNames maps raft ids to member names from the storage's snapshot
// (best effort: a name not found is printed as the raft id).
func memberNames(st *raftlog.DiskStorage, cluster string) map[uint64]string {
	names := map[uint64]string{}
	snap, err := st.Snapshot()
	if err != nil || len(snap.GetData()) == 0 {
		return names
	}
	s := fsm.New(cluster)
	if s.Restore(snap.GetData()) == nil {
		for _, m := range s.Members() {
			names[m.GetRaftId()] = m.GetId()
		}
	}
	// Members added after the snapshot are named by the membership changes
	// of the log.
	first, err1 := st.FirstIndex()
	last, err2 := st.LastIndex()
	if err1 != nil || err2 != nil || last < first {
		return names
	}
	ents, err := st.Entries(first, last+1, 1<<62)
	if err != nil {
		return names
	}
	for _, e := range ents {
		var ctxBytes []byte
		switch e.GetType() {
		case raftpb.EntryConfChange:
			cc := new(raftpb.ConfChange)
			if proto.Unmarshal(e.GetData(), cc) == nil {
				ctxBytes = cc.GetContext()
			}
		case raftpb.EntryConfChangeV2:
			cc := new(raftpb.ConfChangeV2)
			if proto.Unmarshal(e.GetData(), cc) == nil {
				ctxBytes = cc.GetContext()
			}
		}
		c := new(waldenv1.ConfChangeContext)
		if len(ctxBytes) > 0 && proto.Unmarshal(ctxBytes, c) == nil && c.GetMember().GetId() != "" {
			names[raftnode.RaftID(c.GetMember().GetId())] = c.GetMember().GetId()
		}
	}
	return names
}

func nameOr(names map[uint64]string, id uint64) string {
	if n, ok := names[id]; ok {
		return n
	}
	return fmt.Sprintf("%x", id)
}
