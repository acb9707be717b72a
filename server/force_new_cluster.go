package server

import (
	"fmt"
	"log/slog"

	"walden/config"
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
	st, err := raftnode.OpenStorage(cfg.DataDir, cfg.ClusterName, cfg.NodeID, logger.With("component", "storage"))
	if err != nil {
		return fmt.Errorf("server: data_dir %s refused: %w", cfg.DataDir, err)
	}
	removed, err := raftnode.ForceNewCluster(st, cfg.NodeID)
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
		ids[i] = fmt.Sprintf("%x", id)
	}
	logger.Warn("force new cluster: this member will be the only voter; the other members are removed from the configuration (their names appear as the log applies); do not restart them with their old data",
		"node_id", cfg.NodeID, "removed_raft_ids", ids)
	return nil
}
