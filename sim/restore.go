package sim

import (
	"sort"
	"time"

	"walden/backup"
	"walden/config"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/reconcile"
)

// The restore of a cluster from a backup (Faults.Restore), as the runbook
// does it: a backup of the leader's state is taken, the cluster goes on for
// a moment and then every coordinator is lost; a new cluster is founded
// from the backup (backup.Rewrite: brokers fenced, token and stream epochs
// bumped, the reconciliation in phase scan) on the same hosts with empty
// data dirs, and reconciles — the leader's scan and plan (package
// reconcile's Plan, over the objects the world keeps and the restore jobs'
// surveys of the brokers' WALs), the restore jobs' surveys and tails — while
// the brokers, refused until it is done, wait. The checker's invariants
// hold throughout: no acknowledged record lost, no offset acknowledged
// twice, no valid lease at a WAL being read.

// scheduleRestore takes the backup at a random time, stops the cluster a
// moment later and restores it.
func (w *World) scheduleRestore() {
	w.after(w.uniform(60*time.Second, 240*time.Second), func() {
		l := w.raft.leader
		if l < 0 || w.hosts[l].down {
			w.scheduleRestore()
			return
		}
		c := w.coords[l]
		data, err := c.st.Snapshot()
		if err != nil {
			panic(err)
		}
		index := c.st.AppliedIndex()
		w.tracef("operator: backup of %s's state at index %d", c.name, index)
		w.after(w.uniform(500*time.Millisecond, 3*time.Second), func() {
			w.tracef("the cluster stops: every coordinator lost")
			for _, c := range w.coords {
				c.host().down = true
				c.host().incarnation++
			}
			w.after(w.uniform(time.Second, 10*time.Second), func() { w.restoreFrom(data, index) })
		})
	})
}

// restoreFrom founds a new cluster from the backup data taken at index.
func (w *World) restoreFrom(data []byte, index uint64) {
	file, _, err := backup.Encode(&waldenv1.SnapshotHeader{ClusterName: "sim", Index: index}, data)
	if err != nil {
		panic(err)
	}
	snap, err := backup.Decode(file)
	if err != nil {
		panic(err)
	}
	cfg := &config.Server{ClusterName: "sim"}
	for _, c := range w.coords {
		cfg.InitialCluster = append(cfg.InitialCluster, config.Member{ID: c.name, Raft: c.name + ":7101", Admin: c.name + ":7001"})
	}
	restored, res, err := backup.Rewrite(snap, cfg, backup.DefaultEpochBump)
	if err != nil {
		panic(err)
	}
	w.tracef("operator: a new cluster restored from the backup: %d broker epochs revoked, next epoch %d", res.BrokersFenced, res.NextEpoch)
	w.raft = newRaftModel(w)
	w.raft.base, w.raft.baseIndex = restored, index
	w.restored = true
	for _, c := range w.coords {
		h := c.host()
		h.down = false
		h.lastTrouble = w.now
		c.store = &lease.MemStore{}
		c.config = w.basePolicy()
		c.emptyDataDir = true
		c.reset()
		c.emptyDataDir = false
		c.start()
	}
}

// reconcileTick is the leader's part of a restored cluster's
// reconciliation (package reconcile's Reconciler): the scan, then, once
// every WAL is surveyed, the plan.
func (c *Coord) reconcileTick(term uint64) {
	w := c.w
	rs := c.st.RestoreState()
	switch rs.GetRestorePhase() {
	case waldenv1.RestorePhase_RESTORE_PHASE_SCAN:
		if c.reconciled == term {
			return
		}
		c.reconciled = term
		w.tracef("%s (term %d): restore scan", c.name, term)
		c.propose(&waldenv1.ReconcileScan{Term: term, LiveMembers: c.liveMembers()}, 2*time.Second, func(_ *waldenv1.Result, err error) {
			if err != nil {
				c.reconciled = 0
			}
		})
	case waldenv1.RestorePhase_RESTORE_PHASE_PLAN:
		if c.reconciled == term+1<<32 {
			return
		}
		c.reconciled = term + 1<<32
		in := reconcile.Input{Streams: map[uint64]reconcile.Stream{}}
		for _, st := range c.st.Streams("", "") {
			in.Streams[st.GetStreamId()] = reconcile.Stream{End: st.GetEndOffset(), Floor: c.st.StreamEpochFloor(st.GetStreamId())}
		}
		for _, id := range rs.GetJobIds() {
			j, ok := c.st.Job(id)
			if !ok {
				continue
			}
			for _, r := range j.GetSurvey().GetRuns() {
				in.Runs = append(in.Runs, reconcile.Run{Broker: j.GetBrokerId(), Stream: r.GetStreamId(), Epoch: r.GetStreamEpoch(),
					Start: r.GetStartOffset(), End: r.GetEndOffset()})
			}
		}
		ids := make([]string, 0, len(w.objects))
		for id := range w.objects {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			recs := w.objects[id]
			if _, ok := c.st.Object(id); ok || len(recs) == 0 {
				continue
			}
			o := simObject(id, recs[0].stream, recs[0].epoch, recs)
			in.Candidates = append(in.Candidates, reconcile.Candidate{Object: o, Whole: true})
		}
		out := reconcile.Plan(in)
		w.tracef("%s (term %d): restore plan: %d objects committed again, %d tails, %d redundant, %d superseded, gaps %v",
			c.name, term, len(out.Commits), len(out.Tails), out.Redundant, out.Superseded, out.Gaps)
		for _, ro := range out.Commits {
			// A commit in part keeps the records of its ranges.
			if _, ok := w.objects[ro.GetObject().GetObjectId()]; !ok {
				w.objects[ro.GetObject().GetObjectId()] = w.objects[baseID(ro.GetObject().GetObjectId())]
			}
		}
		rep := &waldenv1.RestoreReport{ObjectsCommitted: uint64(len(out.Commits)), RangesCommitted: out.RangesCommitted,
			ObjectsRedundant: out.Redundant, ObjectsSuperseded: out.Superseded, StreamsExtended: out.StreamsExtended, Gaps: out.Gaps}
		var next func(i int)
		next = func(i int) {
			if i < len(out.Commits) {
				c.propose(&waldenv1.ReconcileObjects{Term: term, Objects: out.Commits[i:min(i+64, len(out.Commits))]}, 2*time.Second,
					func(_ *waldenv1.Result, err error) {
						if err != nil {
							w.tracef("%s: reconcile objects refused: %v", c.name, err)
							c.reconciled = 0
							return
						}
						next(i + 64)
					})
				return
			}
			c.propose(&waldenv1.ReconcilePlan{Term: term, Tails: out.Tails, Report: rep}, 2*time.Second, func(_ *waldenv1.Result, err error) {
				if err != nil {
					w.tracef("%s: reconcile plan refused: %v", c.name, err)
					c.reconciled = 0
				}
			})
		}
		next(0)
	}
}

// baseID is the id of the object a commit in part was cut from.
func baseID(id string) string {
	for i := 0; i < len(id); i++ {
		if id[i] == '+' {
			return id[:i]
		}
	}
	return id
}

// simObject is the catalog object of a simulated object: one range.
func simObject(id string, stream, epoch uint64, recs []simRec) *waldenv1.Object {
	length := uint64(16 * len(recs))
	return &waldenv1.Object{ObjectId: id, Key: "sim/" + id, Size: 16 + length + 36 + 56, Ranges: []*waldenv1.ObjectRange{{StreamId: stream,
		StreamEpoch: epoch, StartOffset: recs[0].offset, EndOffset: recs[len(recs)-1].offset + 1, Position: 16, Length: length}}}
}

// restoreJob is a restore job on coordinator c: after the lease wait, the
// survey of the broker's WAL, then, once the plan gave the tails, their
// recovery as a failover's.
func (c *Coord) restoreJob(j *waldenv1.Job) {
	w := c.w
	a := w.agentByName(j.GetBrokerId())
	var survey, wait func()
	survey = func() {
		cur, ok := c.st.Job(j.GetJobId())
		if !ok || cur.GetAttempt() != j.GetAttempt() {
			return
		}
		if cur.GetSurvey() != nil {
			wait()
			return
		}
		type key struct{ stream, epoch uint64 }
		var runs []*waldenv1.WalRun
		open := map[key]*waldenv1.WalRun{}
		for _, r := range a.wal {
			k := key{r.stream, r.epoch}
			if run := open[k]; run != nil && run.GetEndOffset() == r.offset {
				run.EndOffset++
				run.Records++
				continue
			}
			run := &waldenv1.WalRun{StreamId: r.stream, StreamEpoch: r.epoch, StartOffset: r.offset, EndOffset: r.offset + 1, Records: 1}
			open[k] = run
			runs = append(runs, run)
		}
		w.check.walRead(a.name, a.epoch)
		w.tracef("%s: restore job %s surveyed %s's WAL: %d runs", c.name, j.GetJobId(), a.name, len(runs))
		c.propose(&waldenv1.CheckpointJob{JobId: j.GetJobId(), Attempt: j.GetAttempt(), Survey: &waldenv1.RestoreSurvey{Runs: runs,
			Records: uint64(len(a.wal))}}, 2*time.Second, func(_ *waldenv1.Result, err error) {
			if err != nil {
				w.onHost(c.idx, 300*time.Millisecond, survey)
				return
			}
			wait()
		})
	}
	wait = func() {
		switch c.st.RestoreState().GetRestorePhase() {
		case waldenv1.RestorePhase_RESTORE_PHASE_RECOVER, waldenv1.RestorePhase_RESTORE_PHASE_DONE:
			cur, ok := c.st.Job(j.GetJobId())
			if ok {
				c.recoverData(cur)
			}
		default:
			w.onHost(c.idx, 200*time.Millisecond, wait)
		}
	}
	w.onHost(c.idx, ms(j.GetLeaseWaitMs()), survey)
}
