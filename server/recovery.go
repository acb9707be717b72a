package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"walden/config"
	"walden/fsm"
	"walden/metrics"
	"walden/objstore"
	"walden/raftnode"
	"walden/reconcile"
	"walden/recovery"
	// The automq recovery target (recovery.action: automq).
	_ "walden/recovery/automqtarget"
)

// newRecoveryRunner wires this member's recovery: the S3 client (none when
// s3.bucket is empty: the builtin upload step then fails visibly in the
// job), the plugins, the executor and the job loops; and the reconciler of
// a restored cluster, which reads through the same S3 client.
func newRecoveryRunner(cfg *config.Server, node *raftnode.Node, state *fsm.State, m *metrics.Recovery, logger *slog.Logger) (*recovery.Runner, *reconcile.Reconciler, error) {
	rc := cfg.Recovery
	logger = logger.With("component", "recovery")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var store recovery.Store
	var s3 *recovery.S3JSON
	if cfg.S3.Bucket != "" {
		c, err := objstore.New(ctx, cfg.S3, objstore.Options{Concurrency: rc.UploadConcurrency, PartSize: rc.PartSize, Logger: logger})
		if err != nil {
			return nil, nil, fmt.Errorf("server: s3: %w", err)
		}
		store = meteredStore{Store: c, m: m}
		s3 = &recovery.S3JSON{Endpoint: cfg.S3.Endpoint, Region: cfg.S3.Region, Bucket: cfg.S3.Bucket, Prefix: cfg.S3.Prefix}
	} else if rc.Action == recovery.ActionBuiltin {
		logger.Warn("s3.bucket is not set: recovery jobs assigned to this member cannot upload until it is")
	}
	fencer, attacher, err := recovery.NewPlugins(ctx, rc, nil, logger)
	if err != nil {
		return nil, nil, fmt.Errorf("server: recovery plugins: %w", err)
	}
	target, err := recovery.NewTarget(ctx, recovery.TargetDeps{Config: rc, NodeID: cfg.NodeID, Store: store, Logger: logger})
	if err != nil {
		return nil, nil, fmt.Errorf("server: recovery target: %w", err)
	}
	exe := recovery.NewExecutor(recovery.ExecutorConfig{Config: rc, NodeID: cfg.NodeID, State: state, Cluster: node,
		Store: store, S3: s3, Fencer: fencer, Attacher: attacher, Metrics: m, Target: target, Logger: logger})
	var rstore reconcile.Store
	if store != nil {
		rstore = store
	}
	rec := reconcile.New(reconcile.Config{}, state, node, rstore, logger)
	return recovery.NewRunner(rc, cfg.NodeID, state, node, exe, logger), rec, nil
}
