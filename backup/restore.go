package backup

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/protobuf/proto"

	"walden/config"
	"walden/fsm"
	"walden/objformat"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
	"walden/raftnode"
)

// defaultLeaseWaitMs is how long a restore job waits before it reads a
// WAL when the backup does not say the cluster's lease horizon (a walden
// before it): walden's default lease_ttl + drift_margin.
const defaultLeaseWaitMs = 3500

// DefaultEpochBump is how far a restore moves the next fencing token past
// the snapshot's: far more registrations and failovers than a cluster makes
// between a backup and its loss, so that no token the old cluster issued
// after the backup is issued again.
const DefaultEpochBump = 1_000_000

var (
	// ErrDataDirNotEmpty refuses a restore into a data directory that holds
	// anything.
	ErrDataDirNotEmpty = errors.New("data_dir is not empty")
	// ErrSameClusterName refuses a restore under the snapshot's cluster name
	// unless asked for.
	ErrSameClusterName = errors.New("the new cluster has the snapshot's cluster_name")
	// ErrNotFounding refuses a restore with a configuration that joins an
	// existing cluster.
	ErrNotFounding = errors.New("the configuration does not found a new cluster")
	// ErrNoS3 refuses a restore with a configuration without an s3
	// section: the restored cluster reads what was written after the
	// backup from the cluster's bucket.
	ErrNoS3 = errors.New("the configuration has no s3 section")
	// ErrOtherPrefix refuses a restore of a backup whose objects are under
	// another S3 prefix than the configuration's: a backup of another
	// cluster, or the wrong s3 section.
	ErrOtherPrefix = errors.New("the backup's objects are under another S3 prefix")
)

// RestoreOptions tune a restore.
type RestoreOptions struct {
	// EpochBump is added to the snapshot's next fencing token (0:
	// DefaultEpochBump).
	EpochBump uint64
	// KeepClusterName allows the new cluster the snapshot's cluster_name.
	// Only safe once every member of the old cluster is gone for good: the
	// name is the identity raft peers and gossip members check, so an old
	// member that came back could otherwise talk to the new cluster.
	KeepClusterName bool
	// Logger receives the storage's logs (nil: discarded).
	Logger *slog.Logger
}

// RestoreResult says what a restore wrote.
type RestoreResult struct {
	DataDir     string
	ClusterName string
	NodeID      string
	Index       uint64
	Members     []string
	// NextEpoch is the first fencing token the new cluster issues.
	NextEpoch uint64
	// BrokersFenced counts the brokers whose epoch the restore revoked.
	BrokersFenced int
	// JobsCancelled counts the recovery jobs of backup time the restore
	// cancelled.
	JobsCancelled int
}

// Restore writes the data_dir of member cfg.node_id of a new cluster from
// snapshot s: the state of the snapshot with the new cluster's name and
// members (cfg.initial_cluster), every broker's epoch revoked (each
// registers again and uploads what its WAL holds beyond the restored
// catalog) and the next fencing token moved EpochBump past the snapshot's.
// Each member of the new cluster runs Restore with its own configuration and
// the same snapshot; then they start as usual.
func Restore(s *Snapshot, cfg *config.Server, opts RestoreOptions) (*RestoreResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.InitialClusterState != config.ClusterStateNew {
		return nil, fmt.Errorf("backup: restore: %w: initial_cluster_state is %q, want %q", ErrNotFounding, cfg.InitialClusterState, config.ClusterStateNew)
	}
	if cfg.ClusterName == s.Header.GetClusterName() && !opts.KeepClusterName {
		return nil, fmt.Errorf("backup: restore: %w %q: give the new cluster a cluster_name of its own (or --keep-cluster-name once every old member is gone)",
			ErrSameClusterName, cfg.ClusterName)
	}
	if opts.EpochBump == 0 {
		opts.EpochBump = DefaultEpochBump
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := checkEmptyDir(cfg.DataDir); err != nil {
		return nil, err
	}
	data, res, err := Rewrite(s, cfg, opts.EpochBump)
	if err != nil {
		return nil, err
	}
	if err := checkBucket(s, data, cfg); err != nil {
		return nil, err
	}
	st, err := raftlog.Open(cfg.DataDir, cfg.ClusterName, cfg.NodeID, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("backup: restore: %w", err)
	}
	var members []*waldenv1.MemberContext
	for _, m := range cfg.InitialCluster {
		members = append(members, &waldenv1.MemberContext{Id: m.ID, RaftAddr: m.Raft, AdminAddr: m.Admin})
	}
	err = raftnode.WriteRestoredState(st, s.Header.GetIndex(), members, data)
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("backup: restore: %w", err)
	}
	res.DataDir = cfg.DataDir
	return res, nil
}

// checkBucket refuses a configuration whose s3 section cannot be the
// backup's cluster's: none at all while the backup holds brokers walden's
// catalog serves (the reconciliation reads the objects written after the
// backup), or a prefix under which the backup's objects are not.
func checkBucket(s *Snapshot, data []byte, cfg *config.Server) error {
	st := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(data, st); err != nil {
		return fmt.Errorf("backup: restore: %w: %w", ErrCorrupt, err)
	}
	walden := len(st.GetStreams()) > 0
	for _, b := range st.GetBrokers() {
		if b.GetAutomq() == nil {
			walden = true
		}
	}
	if cfg.S3.Bucket == "" {
		if !walden {
			return nil // AutoMQ's nodes only: their streams are AutoMQ's controller's
		}
		return fmt.Errorf("backup: restore: %w: the restored cluster reads what the old cluster %q wrote after the backup from its bucket; "+
			"give this configuration the old cluster's s3 section (bucket and prefix) and restore again", ErrNoS3, s.Header.GetClusterName())
	}
	for _, o := range st.GetObjects() {
		at, ok := keyPrefix(o.GetKey())
		if !ok {
			continue // not a key walden wrote (a test's, an import's)
		}
		if want := strings.Trim(cfg.S3.Prefix, "/"); at != want {
			return fmt.Errorf("backup: restore: %w: the backup of cluster %q holds object %s under prefix %q, this configuration's s3.prefix is %q: "+
				"restore a backup with the s3 section of the cluster it was taken from, or the backup of the cluster this s3 section is",
				ErrOtherPrefix, s.Header.GetClusterName(), o.GetKey(), at, want)
		}
	}
	return nil
}

// keyPrefix returns the prefix of a key objformat.Key made (what is before
// its broker/epoch/offsets.obj), and false for another key.
func keyPrefix(key string) (string, bool) {
	parts := strings.Split(key, "/")
	if len(parts) < 3 {
		return "", false
	}
	prefix := strings.Join(parts[:len(parts)-3], "/")
	if _, ok := objformat.ParseKey(prefix, key); !ok {
		return "", false
	}
	return prefix, true
}

// checkEmptyDir refuses a data_dir that exists with anything in it.
func checkEmptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backup: restore: data_dir: %w", err)
	}
	for _, e := range entries {
		if e.Name() != "lost+found" {
			return fmt.Errorf("backup: restore: %w: %s holds %s; restore writes a new data_dir", ErrDataDirNotEmpty, dir, e.Name())
		}
	}
	return nil
}

// Rewrite returns the snapshot's state as the new cluster's (the data of a
// raft snapshot of cfg's cluster), in this version's form (a backup of an
// older walden is upgraded first): cfg's members, every broker's epoch
// revoked, the jobs of backup time cancelled, the fencing token and every
// stream's epoch moved bump past the snapshot's, and the reconciliation
// with what was written after the backup in its first phase.
func Rewrite(s *Snapshot, cfg *config.Server, bump uint64) ([]byte, *RestoreResult, error) {
	st, err := fsm.UpgradeSnapshot(s.Data)
	if errors.Is(err, fsm.ErrInvalidSnapshot) {
		return nil, nil, fmt.Errorf("backup: restore: %w: %w", ErrCorrupt, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("backup: restore: %w", err)
	}
	res := &RestoreResult{ClusterName: cfg.ClusterName, NodeID: cfg.NodeID, Index: st.GetAppliedIndex()}
	st.ClusterName = cfg.ClusterName
	st.Members = nil
	for _, m := range cfg.InitialCluster {
		st.Members = append(st.Members, &waldenv1.Member{Id: m.ID, RaftId: raftnode.RaftID(m.ID), RaftAddr: m.Raft, AdminAddr: m.Admin,
			MemberRole: waldenv1.MemberRole_MEMBER_ROLE_VOTER})
		res.Members = append(res.Members, m.ID)
	}
	backupNext := max(st.GetNextEpoch(), 1)
	st.NextEpoch = backupNext + bump
	res.NextEpoch = st.NextEpoch
	// Before any broker registers or any stream opens, the cluster finds
	// what was written after the backup: the objects in S3 and the records
	// the brokers' WALs hold (package reconcile). The brokers' epochs at the
	// backup tell which objects may be of after it.
	epochs := map[string]uint64{}
	for _, b := range st.GetBrokers() {
		epochs[b.GetBrokerId()] = b.GetEpoch()
	}
	leaseWait := st.GetLeaseHorizonMs()
	if leaseWait <= 0 {
		leaseWait = defaultLeaseWaitMs
	}
	st.Restore = &waldenv1.RestoreState{
		RestorePhase:    waldenv1.RestorePhase_RESTORE_PHASE_SCAN,
		FromCluster:     s.Header.GetClusterName(),
		FromIndex:       s.Header.GetIndex(),
		BackupSha256:    hex.EncodeToString(s.SHA256[:]),
		EpochBump:       bump,
		LeaseWaitMs:     leaseWait,
		BackupEpochs:    epochs,
		BackupNextEpoch: backupNext,
	}
	for _, b := range st.GetBrokers() {
		if b.GetFenced() {
			continue
		}
		// The epoch held at the backup may have been failed over since, and
		// the catalog lacks what the broker committed after it: the broker
		// registers again and uploads what its WAL holds beyond the catalog.
		b.Fenced = true
		b.LeaseRemainingMs = -1
		if b.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_MAINTENANCE {
			b.BrokerState = waldenv1.BrokerState_BROKER_STATE_FAILED
		}
		res.BrokersFenced++
	}
	for _, j := range st.GetJobs() {
		switch j.GetJobState() {
		case waldenv1.JobState_JOB_STATE_PENDING, waldenv1.JobState_JOB_STATE_RUNNING, waldenv1.JobState_JOB_STATE_BLOCKED:
		default:
			continue
		}
		// The job's broker may have registered again since the backup and
		// trimmed and reused its WAL: resuming the job would read records
		// of a later epoch as this one's. The broker registers again and
		// uploads what its WAL holds instead.
		j.JobState = waldenv1.JobState_JOB_STATE_CANCELLED
		j.Error = "cancelled by the restore of a backup: the broker's WAL may have been trimmed and reused since; " +
			"the broker registers again and uploads what its WAL holds"
		res.JobsCancelled++
	}
	// Streams may have been opened again after the backup: their epochs
	// move past what the old cluster may have issued, as the tokens do.
	for _, stream := range st.GetStreams() {
		stream.Epoch += bump
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
	if err != nil {
		return nil, nil, fmt.Errorf("backup: restore: encode state: %w", err)
	}
	// The state machine must accept it as the new cluster's.
	if err := fsm.New(cfg.ClusterName).Restore(data); err != nil {
		return nil, nil, fmt.Errorf("backup: restore: %w", err)
	}
	return data, res, nil
}
