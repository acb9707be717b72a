package fsm_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

const testBump = 1000

// restoredHarness writes a catalog (b1 owns stream 1, b2 stream 2, each
// with one object), then restores its snapshot the way backup.Restore
// does: brokers fenced, stream epochs and the token moved by testBump, the
// reconciliation in phase scan.
func restoredHarness(t *testing.T) (*harness, map[string]uint64) {
	t.Helper()
	h := newHarness(t)
	epochs := map[string]uint64{"b1": h.register("b1"), "b2": h.register("b2")}
	for _, s := range []struct {
		b  string
		id uint64
	}{{"b1", 1}, {"b2", 2}} {
		h.ok(&waldenv1.OpenStreamRequest{BrokerId: s.b, BrokerEpoch: epochs[s.b], StreamId: s.id})
		h.ok(&waldenv1.CommitObjectRequest{BrokerId: s.b, BrokerEpoch: epochs[s.b], Object: obj("o"+s.b, rngAt(s.id, 1, 0, 5, 16, 80))})
	}
	snap := domainSnapshot(t, h.s)
	snap.AppliedIndex = h.index
	snap.NextEpoch += testBump
	for _, b := range snap.GetBrokers() {
		b.Fenced = true
	}
	for _, st := range snap.GetStreams() {
		st.Epoch += testBump
	}
	snap.Restore = &waldenv1.RestoreState{RestorePhase: waldenv1.RestorePhase_RESTORE_PHASE_SCAN, FromCluster: "demo", FromIndex: h.index,
		EpochBump: testBump, LeaseWaitMs: 3500, BackupEpochs: epochs}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	r := &harness{t: t, s: fsm.New("demo"), index: h.index, term: 2, nowMs: h.nowMs}
	if err := r.s.Restore(data); err != nil {
		t.Fatal(err)
	}
	return r, epochs
}

// rngAt is a range with its section's position and length.
func rngAt(stream, streamEpoch, start, end, pos, length uint64) *waldenv1.ObjectRange {
	r := rng(stream, streamEpoch, start, end)
	r.Position, r.Length = pos, length
	return r
}

func reconciled(id, key string, ranges ...*waldenv1.ObjectRange) *waldenv1.ReconciledObject {
	return &waldenv1.ReconciledObject{Object: &waldenv1.Object{ObjectId: id, Key: key, Size: 1000, Ranges: ranges}}
}

// TestRestoreReconciliation (issue 21, finding 5): a restored cluster
// registers no broker and opens no stream until it has committed again
// what was written after the backup and its restore jobs recovered the
// WALs' tails; then the streams open past every offset written before.
func TestRestoreReconciliation(t *testing.T) {
	h, _ := restoredHarness(t)
	if !h.s.Reconciling() {
		t.Fatal("a restored state does not say it reconciles")
	}
	err := h.refuse(&waldenv1.RegisterBroker{BrokerId: "b1", AgentAddr: "x"}, refusal.ErrRestoreReconciling)
	if md := refusal.Metadata(err); md["phase"] != "scan" || !strings.Contains(err.Error(), "restored from a backup") {
		t.Fatalf("refusal %v, metadata %v", err, md)
	}
	h.refuse(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: 1, StreamId: 1}, refusal.ErrRestoreReconciling)
	h.refuse(&waldenv1.RemoveBroker{BrokerId: "b2"}, refusal.ErrRestoreReconciling)

	// The scan, by the leader of the term it is appended in.
	h.refuse(&waldenv1.ReconcileScan{Term: 1, BrokersFound: []string{"b3"}, LiveMembers: []string{"c1"}}, refusal.ErrDecidedInAnotherTerm)
	h.refuse(&waldenv1.ReconcileObjects{Term: 2}, refusal.ErrInvalidArgument)
	next := h.s.NextEpoch()
	h.ok(&waldenv1.ReconcileScan{Term: 2, BrokersFound: []string{"b3", "b2"}, ObjectsListed: 7, LiveMembers: []string{"c1", "c2", "c3"}})
	rs := h.s.RestoreState()
	if rs.GetRestorePhase() != waldenv1.RestorePhase_RESTORE_PHASE_SURVEY || len(rs.GetJobIds()) != 3 ||
		strings.Join(rs.GetBrokersFound(), ",") != "b3" || rs.GetReport().GetObjectsListed() != 7 {
		t.Fatalf("after the scan: %v", rs)
	}
	jobs := map[string]*waldenv1.Job{}
	assignees := map[string]bool{}
	for _, id := range rs.GetJobIds() {
		j := h.job(id)
		b := h.broker(j.GetBrokerId())
		if !j.GetRestore() || j.GetToken() < next || b.GetEpoch() != j.GetToken() || !b.GetFenced() || j.GetLeaseWaitMs() != 3500 ||
			!strings.HasPrefix(id, "restore-"+j.GetBrokerId()+"-") {
			t.Fatalf("restore job %v of broker %v", j, b)
		}
		jobs[j.GetBrokerId()] = j
		assignees[j.GetAssigneeId()] = true
	}
	if len(assignees) != 3 {
		t.Fatalf("the restore jobs are not spread over the members: %v", assignees)
	}
	// A job that is not a restore job has no survey to give; a run that
	// is empty is refused.
	h.refuse(&waldenv1.CheckpointJob{JobId: jobs["b1"].GetJobId(), Attempt: 1, Survey: &waldenv1.RestoreSurvey{
		Runs: []*waldenv1.WalRun{{StreamId: 1, StreamEpoch: 1, StartOffset: 9, EndOffset: 9}}}}, refusal.ErrInvalidArgument)

	// The surveys: b1's WAL holds stream 1 at epoch 2 from 8 to 15 (after
	// a restart the old cluster saw); b3's is lost for good.
	h.ok(&waldenv1.CheckpointJob{JobId: jobs["b1"].GetJobId(), Attempt: 1, JobStep: waldenv1.JobStep_JOB_STEP_READ, Survey: &waldenv1.RestoreSurvey{
		Runs: []*waldenv1.WalRun{{StreamId: 1, StreamEpoch: 2, StartOffset: 8, EndOffset: 15, Records: 7}}}})
	h.ok(&waldenv1.CheckpointJob{JobId: jobs["b2"].GetJobId(), Attempt: 1, JobStep: waldenv1.JobStep_JOB_STEP_READ, Survey: &waldenv1.RestoreSurvey{}})
	if p := h.s.RestoreState().GetRestorePhase(); p != waldenv1.RestorePhase_RESTORE_PHASE_SURVEY {
		t.Fatalf("phase %s before the last survey", p.Name())
	}
	h.refuse(&waldenv1.CancelJob{JobId: jobs["b3"].GetJobId()}, refusal.ErrRestoreReconciling)
	h.ok(&waldenv1.BlockJob{JobId: jobs["b3"].GetJobId(), Attempt: 1, Error: "stat b3.wal: no such file or directory"})
	h.ok(&waldenv1.ResolveJob{JobId: jobs["b3"].GetJobId(), Reason: "disk lost", WalLost: true, LiveMembers: []string{"c1"}})
	if rs := h.s.RestoreState(); rs.GetRestorePhase() != waldenv1.RestorePhase_RESTORE_PHASE_PLAN || !h.job(jobs["b3"].GetJobId()).GetSurvey().GetWalLost() {
		t.Fatalf("after the surveys: %v", rs)
	}

	// The objects written after the backup: stream 1 went on at epoch 1
	// from 5 to 8; a stream created after the backup (9) from 0.
	h.refuse(&waldenv1.ReconcileObjects{Term: 2, Objects: []*waldenv1.ReconciledObject{
		reconciled("late", "p/b1/late.obj", rngAt(1, 1, 6, 8, 16, 64))}}, refusal.ErrOffsetMismatch)
	h.refuse(&waldenv1.ReconcileObjects{Term: 2, Objects: []*waldenv1.ReconciledObject{
		reconciled("old", "p/b1/old.obj", rngAt(9, 3, 0, 2, 16, 32)), reconciled("older", "p/b1/older.obj", rngAt(9, 2, 2, 4, 16, 32))}},
		refusal.ErrEpochExpired)
	h.ok(&waldenv1.ReconcileObjects{Term: 2, Objects: []*waldenv1.ReconciledObject{
		reconciled("late", "p/b1/late.obj", rngAt(1, 1, 5, 8, 16, 64), rngAt(9, 3, 0, 2, 80, 32))}})
	// Applied again (a retried proposal): nothing changes.
	h.ok(&waldenv1.ReconcileObjects{Term: 2, Objects: []*waldenv1.ReconciledObject{
		reconciled("late", "p/b1/late.obj", rngAt(1, 1, 5, 8, 16, 64), rngAt(9, 3, 0, 2, 80, 32))}})
	if st := h.stream(1); st.GetEndOffset() != 8 || st.GetEpoch() != 1+testBump {
		t.Fatalf("stream 1 after the objects: %v", st)
	}
	if st := h.stream(9); st.GetEndOffset() != 2 || st.GetEpoch() != 3+testBump || st.GetState() != fsm.StreamClosed {
		t.Fatalf("stream 9 created by the objects: %v", st)
	}
	if o, ok := h.s.Object("late"); !ok || !o.GetReconciled() {
		t.Fatalf("reconciled object: %v", o)
	}
	h.ok(&waldenv1.ReconcileProgress{Term: 2, Progress: &waldenv1.RestoreProgress{ObjectsTotal: 3, ObjectsChecked: 3}})

	// The plan: stream 1's tail is in b1's WAL at epoch 2, from 8.
	h.refuse(&waldenv1.ReconcilePlan{Term: 2, Tails: []*waldenv1.StreamTail{{StreamId: 1, BrokerId: "b1", StreamEpoch: 2, FromOffset: 7, EndOffset: 15}}},
		refusal.ErrOffsetMismatch)
	h.refuse(&waldenv1.ReconcilePlan{Term: 2, Tails: []*waldenv1.StreamTail{{StreamId: 1, BrokerId: "b4", StreamEpoch: 2, FromOffset: 8, EndOffset: 15}}},
		refusal.ErrInvalidArgument)
	h.ok(&waldenv1.ReconcilePlan{Term: 2, Tails: []*waldenv1.StreamTail{{StreamId: 1, BrokerId: "b1", StreamEpoch: 2, FromOffset: 8, EndOffset: 15}},
		Report: &waldenv1.RestoreReport{ObjectsCommitted: 1, RangesCommitted: 2, StreamsExtended: 2,
			Damaged: []*waldenv1.DamagedObject{{Key: "p/b2/bad.obj", Error: "index CRC32C mismatch"}}}})
	rs = h.s.RestoreState()
	if rs.GetRestorePhase() != waldenv1.RestorePhase_RESTORE_PHASE_RECOVER || rs.GetReport().GetTails() != 1 || len(rs.GetReport().GetDamaged()) != 1 {
		t.Fatalf("after the plan: %v", rs)
	}
	j1 := h.job(jobs["b1"].GetJobId())
	st1 := h.stream(1)
	if st1.GetState() != fsm.StreamOpened || st1.GetOwnerBrokerId() != "b1" || st1.GetOwnerEpoch() != j1.GetToken() || st1.GetEpoch() != 2+testBump ||
		len(j1.GetTails()) != 1 {
		t.Fatalf("stream 1 %v for job %v", st1, j1)
	}
	if st := h.stream(2); st.GetState() != fsm.StreamClosed {
		t.Fatalf("stream 2 without a tail: %v", st)
	}
	events := h.s.Events("", 0)
	if last := events[len(events)-1]; last.GetEventKind() != waldenv1.EventKind_EVENT_KIND_RESTORE || !strings.Contains(last.GetMessage(), "p/b2/bad.obj") {
		t.Fatalf("plan event: %v", last)
	}

	// The restore jobs recover as failovers do.
	h.ok(&waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: j1.GetToken(), Failover: fo(j1),
		Object: obj("tail", rngAt(1, st1.GetEpoch(), 8, 15, 16, 112))})
	h.ok(&waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: j1.GetToken(), StreamId: 1, StreamEpoch: st1.GetEpoch(), Failover: fo(j1)})
	for _, b := range []string{"b1", "b2", "b3"} {
		j := h.job(jobs[b].GetJobId())
		if p := h.s.RestoreState().GetRestorePhase(); p != waldenv1.RestorePhase_RESTORE_PHASE_RECOVER {
			t.Fatalf("phase %s before every restore job succeeded", p.Name())
		}
		h.ok(&waldenv1.FinishJob{JobId: j.GetJobId(), Attempt: j.GetAttempt(), JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED, RecoveredWalOffset: 100})
	}
	if h.s.Reconciling() || h.s.RestoreState().GetRestorePhase() != waldenv1.RestorePhase_RESTORE_PHASE_DONE {
		t.Fatalf("after the restore jobs: %v", h.s.RestoreState())
	}
	// Each phase's event carries what it found, its message rendered
	// from it.
	compareEventLines(t, restoreEventLines(h), []string{
		`restore  | scanned 7 keys under the cluster's prefix in S3; brokers the backup did not know wrote after it: b3; restore jobs restore-b1-1003, restore-b2-1004, restore-b3-1005 read the brokers' WALs | restore:{from_restore_phase:RESTORE_PHASE_SCAN restore_phase:RESTORE_PHASE_SURVEY objects_listed:7 brokers_added:"b3" job_ids:"restore-b1-1003" job_ids:"restore-b2-1004" job_ids:"restore-b3-1005"}`,
		`restore  | every broker's WAL was read (1 runs of records); the objects written after the backup are checked next (1 WALs declared lost by an operator) | restore:{from_restore_phase:RESTORE_PHASE_SURVEY restore_phase:RESTORE_PHASE_PLAN runs:1 wals_lost:1}`,
		`restore  | committed again 1 objects written after the backup (2 ranges; 2 streams extended); 0 redundant, 0 superseded, 1 damaged; stream tails in the WALs of b1 1 are recovered by their restore jobs; damaged, not committed: p/b2/bad.obj (index CRC32C mismatch) | restore:{from_restore_phase:RESTORE_PHASE_PLAN restore_phase:RESTORE_PHASE_RECOVER report:{objects_committed:1 ranges_committed:2 damaged:{key:"p/b2/bad.obj" error:"index CRC32C mismatch"} streams_extended:2} tails:{broker_id:"b1" tails:1}}`,
		`restore  | the restored cluster is reconciled with what was written after the backup of "demo" at index 9: brokers register and streams open again | restore:{from_restore_phase:RESTORE_PHASE_RECOVER restore_phase:RESTORE_PHASE_DONE from_cluster:"demo" from_index:9}`,
	})
	// A restore job is no failover: it starts no cooldown (a broker that
	// dies right after the restore is failed over automatically).
	if b := h.broker("b1"); b.GetRecoveredUnixMs() != 0 || b.GetRecoveredWalOffset() != 100 {
		t.Fatalf("b1 after its restore job: %v", b)
	}
	// Now b1 registers and opens stream 1 past everything written before.
	e := h.register("b1")
	res := h.ok(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e, StreamId: 1}).GetOpenStream().GetStream()
	if res.GetEndOffset() != 15 || res.GetEpoch() != 3+testBump {
		t.Fatalf("stream 1 opened after the restore: %v", res)
	}
}

// TestRestoreReconciliationWithoutBrokers: a backup without brokers goes
// from the scan to the plan, and from the plan to done.
func TestRestoreReconciliationWithoutBrokers(t *testing.T) {
	h := newHarness(t)
	snap := domainSnapshot(t, h.s)
	snap.AppliedIndex = h.index
	snap.Restore = &waldenv1.RestoreState{RestorePhase: waldenv1.RestorePhase_RESTORE_PHASE_SCAN, FromCluster: "demo", EpochBump: testBump}
	data, _ := proto.Marshal(snap)
	r := &harness{t: t, s: fsm.New("demo"), index: h.index, term: 3, nowMs: h.nowMs}
	if err := r.s.Restore(data); err != nil {
		t.Fatal(err)
	}
	r.ok(&waldenv1.ReconcileScan{Term: 3})
	if p := r.s.RestoreState().GetRestorePhase(); p != waldenv1.RestorePhase_RESTORE_PHASE_PLAN {
		t.Fatalf("phase %s after a scan without brokers", p.Name())
	}
	r.ok(&waldenv1.ReconcilePlan{Term: 3, Report: &waldenv1.RestoreReport{}})
	if r.s.Reconciling() {
		t.Fatalf("still reconciling: %v", r.s.RestoreState())
	}
	compareEventLines(t, restoreEventLines(r), []string{
		`restore  | scanned 0 keys under the cluster's prefix in S3; no broker WAL to read: the objects are checked next | restore:{from_restore_phase:RESTORE_PHASE_SCAN restore_phase:RESTORE_PHASE_PLAN}`,
		`restore  | committed again 0 objects written after the backup (0 ranges; 0 streams extended); 0 redundant, 0 superseded, 0 damaged; no stream has records beyond them in a WAL | restore:{from_restore_phase:RESTORE_PHASE_PLAN restore_phase:RESTORE_PHASE_RECOVER report:{}}`,
		`restore  | the restored cluster is reconciled with what was written after the backup of "demo" at index 0: brokers register and streams open again | restore:{from_restore_phase:RESTORE_PHASE_RECOVER restore_phase:RESTORE_PHASE_DONE from_cluster:"demo"}`,
	})
	r.register("b1")
}
