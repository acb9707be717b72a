package backup

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/config"
	"walden/fsm"
	"walden/objstore"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftlog"
	"walden/raftnode"
)

// testState is the state of cluster "old" at index 42: two brokers (one
// alive, one recovered), two streams and an object.
func testState(t *testing.T) ([]byte, *waldenv1.SnapshotHeader) {
	t.Helper()
	st := &waldenv1.StateSnapshot{
		Version: 3, ClusterName: "old", AppliedIndex: 42, NextEpoch: 9,
		Members: []*waldenv1.Member{{Id: "o1", RaftId: raftnode.RaftID("o1"), RaftAddr: "10.0.0.1:7101"}},
		Brokers: []*waldenv1.Broker{
			{BrokerId: "b1", BrokerState: waldenv1.BrokerState_BROKER_STATE_ALIVE, Epoch: 7},
			{BrokerId: "b2", BrokerState: waldenv1.BrokerState_BROKER_STATE_RECOVERED, Epoch: 8, Fenced: true, LastJobId: "job-b2-8"},
			{BrokerId: "b3", BrokerState: waldenv1.BrokerState_BROKER_STATE_RECOVERING, Epoch: 6, Fenced: true, LastJobId: "job-b3-6"},
		},
		Streams: []*waldenv1.Stream{{StreamId: 1, Epoch: 1, State: "opened", OwnerBrokerId: "b1", EndOffset: 10}, {StreamId: 2, State: "closed", EndOffset: 5}},
		Objects: []*waldenv1.Object{{ObjectId: "o-1", Key: "walden/b1/00000000000000000007/00000000000000016384-00000000000000016384.obj",
			Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StartOffset: 0, EndOffset: 10}}}},
		Jobs: []*waldenv1.Job{
			{JobId: "job-b2-8", BrokerId: "b2", Token: 8, Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED, JobStep: waldenv1.JobStep_JOB_STEP_DONE},
			{JobId: "job-b3-6", BrokerId: "b3", Token: 6, Attempt: 2, JobState: waldenv1.JobState_JOB_STATE_RUNNING, JobStep: waldenv1.JobStep_JOB_STEP_UPLOAD},
		},
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := fsm.New("old").Restore(data); err != nil {
		t.Fatalf("test state refused: %v", err)
	}
	return data, &waldenv1.SnapshotHeader{ClusterName: "old", Index: 42, Term: 3, NodeId: "o1", Brokers: 3, Streams: 2, Objects: 1}
}

func TestFileRoundTripAndDamage(t *testing.T) {
	data, h := testState(t)
	path := filepath.Join(t.TempDir(), "backup.snap")
	sum, err := WriteFile(path, h, data)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.SHA256 != sum || !bytes.Equal(s.Data, data) || s.Header.GetIndex() != 42 || s.Header.GetSize() != uint64(len(data)) {
		t.Fatalf("read back %v", s.Header)
	}
	if _, err := WriteFile(path, h, data); !errors.Is(err, ErrExists) {
		t.Fatalf("overwrite: %v, want ErrExists", err)
	}
	if _, err := os.Stat(path + ".part"); !os.IsNotExist(err) {
		t.Fatalf("a .part file was left: %v", err)
	}

	raw, _ := os.ReadFile(path)
	for name, b := range map[string][]byte{
		"flipped data byte": flip(raw, len(raw)-40),
		"flipped header":    flip(raw, 14),
		"truncated":         raw[:len(raw)-1],
	} {
		if _, err := Decode(b); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotSnapshot) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
	if _, err := Decode([]byte("SQLite format 3\x00 and more bytes to be long enough to check")); !errors.Is(err, ErrNotSnapshot) {
		t.Errorf("other format: %v, want ErrNotSnapshot", err)
	}
	// A consistent file whose header disagrees with its state is refused.
	h2 := proto.Clone(h).(*waldenv1.SnapshotHeader)
	h2.Index = 41
	b, _, err := Encode(h2, data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
		t.Errorf("header index disagreeing with the state: %v", err)
	}
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0xff
	return c
}

func newConfig(t *testing.T, name, id string) *config.Server {
	t.Helper()
	cfg := config.DefaultServerConfig()
	cfg.ClusterName, cfg.NodeID = name, id
	cfg.DataDir = filepath.Join(t.TempDir(), id)
	cfg.Listen = config.Listen{Admin: "127.0.0.1:0", Raft: "127.0.0.1:0"}
	cfg.InitialCluster = []config.Member{
		{ID: "n1", Raft: "10.1.0.1:7101", Admin: "10.1.0.1:7001"},
		{ID: "n2", Raft: "10.1.0.2:7101", Admin: "10.1.0.2:7001"},
		{ID: "n3", Raft: "10.1.0.3:7101", Admin: "10.1.0.3:7001"},
	}
	cfg.S3 = objstore.Config{Endpoint: "http://10.1.0.9:9000", Region: "us-east-1", Bucket: "walden", Prefix: "walden"}
	return cfg
}

func TestRestore(t *testing.T) {
	data, h := testState(t)
	b, _, err := Encode(h, data)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}

	cfg := newConfig(t, "new", "n2")
	res, err := Restore(s, cfg, RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Index != 42 || res.NextEpoch != 9+DefaultEpochBump || res.BrokersFenced != 1 || strings.Join(res.Members, ",") != "n1,n2,n3" {
		t.Fatalf("result %+v", res)
	}
	// The data dir holds the new cluster's state at the snapshot index.
	st, err := raftlog.Open(cfg.DataDir, "new", "n2", nil)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot()
	_ = st.Close()
	if err != nil {
		t.Fatal(err)
	}
	if snap.GetMetadata().GetIndex() != 42 || len(snap.GetMetadata().GetConfState().GetVoters()) != 3 {
		t.Fatalf("raft snapshot %v", snap.GetMetadata())
	}
	state := fsm.New("new")
	if err := state.Restore(snap.GetData()); err != nil {
		t.Fatal(err)
	}
	b1, _ := state.Broker("b1")
	b2, _ := state.Broker("b2")
	if !b1.GetFenced() || b1.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_FAILED || b1.GetEpoch() != 7 || b2.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_RECOVERED {
		t.Fatalf("brokers after restore: %v / %v", b1, b2)
	}
	if n := len(state.Streams("", "")); n != 2 {
		t.Fatalf("%d streams restored", n)
	}
	// Streams opened again after the backup got epochs the new cluster
	// must not issue again; jobs running at backup time may read a WAL
	// trimmed and reused since: cancelled, the finished one kept.
	for _, st := range state.Streams("", "") {
		if st.GetEpoch() < DefaultEpochBump {
			t.Fatalf("stream %d epoch %d after restore, want beyond %d", st.GetStreamId(), st.GetEpoch(), DefaultEpochBump)
		}
	}
	if j, _ := state.Job("job-b3-6"); j.GetJobState() != waldenv1.JobState_JOB_STATE_CANCELLED || !strings.Contains(j.GetError(), "restore") {
		t.Fatalf("job running at backup time: %v", j)
	}
	if j, _ := state.Job("job-b2-8"); j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job finished at backup time: %v", j)
	}
	if res.JobsCancelled != 1 {
		t.Fatalf("jobs cancelled %d, want 1", res.JobsCancelled)
	}
	// The reconciliation starts: no broker registers, no stream opens
	// until the objects and WALs written after the backup are found.
	rs := state.RestoreState()
	if rs.GetRestorePhase() != waldenv1.RestorePhase_RESTORE_PHASE_SCAN || rs.GetFromCluster() != "old" || rs.GetFromIndex() != 42 ||
		rs.GetEpochBump() != DefaultEpochBump || rs.GetBackupEpochs()["b1"] != 7 || rs.GetBackupNextEpoch() != 9 ||
		len(rs.GetBackupSha256()) != 64 || !state.Reconciling() {
		t.Fatalf("restore state %v", rs)
	}
	if ms := state.Members(); len(ms) != 3 || ms[0].GetId() != "n1" || ms[0].GetRaftAddr() != "10.1.0.1:7101" {
		t.Fatalf("members %v", ms)
	}

	// Refusals, each leaving the data dir untouched.
	if _, err := Restore(s, cfg, RestoreOptions{}); !errors.Is(err, ErrDataDirNotEmpty) {
		t.Fatalf("restore into the restored dir: %v", err)
	}
	same := newConfig(t, "old", "n1")
	if _, err := Restore(s, same, RestoreOptions{}); !errors.Is(err, ErrSameClusterName) {
		t.Fatalf("same cluster name: %v", err)
	}
	if _, err := os.Stat(same.DataDir); !os.IsNotExist(err) {
		t.Fatalf("a refused restore created the data dir: %v", err)
	}
	if _, err := Restore(s, same, RestoreOptions{KeepClusterName: true, EpochBump: 10}); err != nil {
		t.Fatalf("same cluster name, allowed: %v", err)
	}
	joining := newConfig(t, "new", "n3")
	joining.InitialClusterState = config.ClusterStateExisting
	if _, err := Restore(s, joining, RestoreOptions{}); !errors.Is(err, ErrNotFounding) {
		t.Fatalf("joining config: %v", err)
	}
	// Without an s3 section, or with another prefix than the backup's
	// objects are under (a backup of another cluster): refused, with what
	// to do, nothing written.
	noS3 := newConfig(t, "new", "n3")
	noS3.S3 = objstore.Config{}
	if _, err := Restore(s, noS3, RestoreOptions{}); !errors.Is(err, ErrNoS3) || !strings.Contains(err.Error(), "give this configuration the old cluster's s3 section") {
		t.Fatalf("no s3 section: %v", err)
	}
	other := newConfig(t, "new", "n3")
	other.S3.Prefix = "staging"
	if _, err := Restore(s, other, RestoreOptions{}); !errors.Is(err, ErrOtherPrefix) || !strings.Contains(err.Error(), `under prefix "walden"`) {
		t.Fatalf("another prefix: %v", err)
	}
	for _, c := range []*config.Server{noS3, other} {
		if _, err := os.Stat(c.DataDir); !os.IsNotExist(err) {
			t.Fatalf("a refused restore created the data dir: %v", err)
		}
	}
}

// TestRestoreOlderVersion restores a backup of a walden before the enums
// (snapshot version 2, states as strings): the new cluster's state is in
// this version's form, a broker in maintenance stays in maintenance and the
// others are failed.
func TestRestoreOlderVersion(t *testing.T) {
	data, err := os.ReadFile("../fsm/testdata/snapshot-v2.bin")
	if err != nil {
		t.Fatal(err)
	}
	old := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(data, old); err != nil || old.GetVersion() != 2 {
		t.Fatalf("fixture: version %d, %v", old.GetVersion(), err)
	}
	b, _, err := Encode(&waldenv1.SnapshotHeader{ClusterName: old.GetClusterName(), Index: old.GetAppliedIndex(), NodeId: "c1"}, data)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	cfg := newConfig(t, "new", "n1")
	if _, err := Restore(s, cfg, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := raftlog.Open(cfg.DataDir, "new", "n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot()
	_ = st.Close()
	if err != nil {
		t.Fatal(err)
	}
	written := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(snap.GetData(), written); err != nil {
		t.Fatal(err)
	}
	if written.GetVersion() != 3 || waldenv1.HasLegacy(written) {
		t.Fatalf("written as version %d, with strings %t", written.GetVersion(), waldenv1.HasLegacy(written))
	}
	state := fsm.New("new")
	if err := state.Restore(snap.GetData()); err != nil {
		t.Fatal(err)
	}
	for _, br := range state.Brokers() {
		want := waldenv1.BrokerState_BROKER_STATE_FAILED
		switch br.GetBrokerId() {
		case "b1":
			want = waldenv1.BrokerState_BROKER_STATE_RECOVERED // fenced already: left as it was
		case "b4":
			want = waldenv1.BrokerState_BROKER_STATE_MAINTENANCE
		case "b5":
			want = waldenv1.BrokerState_BROKER_STATE_RECOVERING
		}
		if br.GetBrokerState() != want || !br.GetFenced() {
			t.Errorf("broker %s: %s, fenced %t; want %s, fenced", br.GetBrokerId(), br.GetBrokerState().Name(), br.GetFenced(), want.Name())
		}
	}
	for _, m := range state.Members() {
		if m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_VOTER {
			t.Errorf("member %s: role %s", m.GetId(), m.GetMemberRole().Name())
		}
	}
}
