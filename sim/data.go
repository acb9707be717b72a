package sim

import (
	"fmt"
	"time"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// The data a simulated broker writes: the order of the reference broker's
// steps (package broker) reduced to one stream per broker, over the
// project's own state machine. Each registration of a new epoch opens the
// broker's stream — after committing, when the stream was still opened by
// the broker, the records its WAL holds beyond the stream's end (a restart:
// the old epoch's tail) — then appends a record now and then (written to the
// WAL, then acknowledged if the lease is still valid) and commits what the
// WAL holds now and then (an object whose records the world keeps, as S3
// would), trimming the WAL. A recovery job commits the broker's WAL beyond
// its opening streams' ends and closes them, as the builtin target does;
// one whose epoch acknowledged nothing (Job.acknowledged_nothing) reads no
// WAL. The checker holds every acknowledged record against the catalog.

// simRec is one record of a stream: its offset and the stream epoch it was
// written at; value identifies it.
type simRec struct {
	stream, epoch, offset, value uint64
}

// dataPlane is a broker's serving state under one registration.
type dataPlane struct {
	gen      int
	epoch    uint64 // broker epoch
	streamEp uint64 // stream epoch
	next     uint64
	serving  bool
	upload   bool // a commit is in flight
}

// streamOf is the stream broker a writes.
func (a *Agent) streamOf() uint64 { return uint64(101 + a.idx) }

// catalogCall proposes op through coordinator c (the broker's catalog
// calls: c forwards to the leader through raft) and calls done on the
// broker's host with the result.
func (a *Agent) catalogCall(c int, op any, done func(*waldenv1.Result, error)) {
	w := a.w
	w.call(a.idx, c, 2*time.Second, func(reply func(any)) {
		w.coords[c].propose(op, 2*time.Second, func(res *waldenv1.Result, err error) { reply(catalogAnswer{res, err}) })
	}, func(resp any, timedOut bool) {
		if timedOut {
			done(nil, errTimeout)
			return
		}
		ans := resp.(catalogAnswer)
		done(ans.res, ans.err)
	})
}

type catalogAnswer struct {
	res *waldenv1.Result
	err error
}

// serve starts the data plane of the registration gen: the streams the
// broker owned opened before, the open, the old tail's commit, then the
// appends and uploads.
func (a *Agent) serve(gen int, epoch uint64) {
	w := a.w
	a.data = &dataPlane{gen: gen, epoch: epoch}
	var step func()
	retry := func() { w.onHost(a.idx, 500*time.Millisecond, step) }
	step = func() {
		if a.gen != gen {
			return
		}
		c := a.last
		// Which streams the catalog shows opened by this broker (before
		// the open: a recovery closed them otherwise).
		w.call(a.idx, c, 2*time.Second, func(reply func(any)) {
			w.raft.readIndex(c, func() {
				var mine bool
				for _, st := range w.coords[c].st.OpeningStreams(a.name) {
					if st.GetStreamId() == a.streamOf() {
						mine = true
					}
				}
				reply(mine)
			})
		}, func(resp any, timedOut bool) {
			if a.gen != gen {
				return
			}
			if timedOut {
				retry()
				return
			}
			mine := resp.(bool)
			a.catalogCall(c, &waldenv1.OpenStreamRequest{BrokerId: a.name, BrokerEpoch: epoch, StreamId: a.streamOf()}, func(res *waldenv1.Result, err error) {
				if a.gen != gen {
					return
				}
				if err != nil {
					retry()
					return
				}
				st := res.GetOpenStream().GetStream()
				var tail []simRec
				if mine {
					tail = contiguous(a.wal, a.streamOf(), st.GetEndOffset(), 0)
				}
				if len(tail) == 0 {
					a.wal = nil // the WAL starts past its old records
					a.startServing(gen, st)
					return
				}
				a.commit(c, epoch, st.GetEpoch(), tail, nil, func(ok bool) {
					if !ok {
						retry()
						return
					}
					a.wal = nil
					st.EndOffset = tail[len(tail)-1].offset + 1
					a.startServing(gen, st)
				})
			})
		})
	}
	step()
}

// contiguous returns the records of stream in recs from offset from on,
// without a gap (any stream epoch, as the broker's own recovery and the
// builtin target take them), re-stamped at epoch when it is not 0.
func contiguous(recs []simRec, stream, from, epoch uint64) []simRec {
	var out []simRec
	next := from
	for _, r := range recs {
		if r.stream != stream || r.offset < next {
			continue
		}
		if r.offset != next {
			break
		}
		if epoch != 0 {
			r.epoch = epoch
		}
		out = append(out, r)
		next++
	}
	return out
}

// commit commits recs as one object of the broker at epoch (fo: in failover
// mode for a recovery job) and reports whether it was committed.
func (a *Agent) commit(c int, epoch, streamEp uint64, recs []simRec, fo *waldenv1.FailoverContext, done func(bool)) {
	w := a.w
	id := fmt.Sprintf("%s-%d-%d-%d", a.name, epoch, recs[0].offset, len(recs))
	if fo != nil {
		id = fmt.Sprintf("%s-a%d-%d-%d", fo.GetJobId(), fo.GetAttempt(), recs[0].offset, len(recs))
	}
	for i := range recs {
		recs[i].epoch = streamEp
	}
	w.check.uploaded(id, recs)
	length := uint64(16 * len(recs))
	obj := &waldenv1.Object{ObjectId: id, Key: "sim/" + id, Size: 16 + length + 36 + 56, Ranges: []*waldenv1.ObjectRange{{StreamId: a.streamOf(),
		StreamEpoch: streamEp, StartOffset: recs[0].offset, EndOffset: recs[len(recs)-1].offset + 1, Position: 16, Length: length}}}
	a.catalogCall(c, &waldenv1.CommitObjectRequest{BrokerId: a.name, BrokerEpoch: epoch, Object: obj, Failover: fo}, func(_ *waldenv1.Result, err error) {
		done(err == nil)
	})
}

func (a *Agent) startServing(gen int, st *waldenv1.Stream) {
	w := a.w
	d := a.data
	d.streamEp, d.next, d.serving = st.GetEpoch(), st.GetEndOffset(), true
	w.tracef("%s@%d serves stream %d at epoch %d from %d", a.name, d.epoch, a.streamOf(), d.streamEp, d.next)
	w.check.registeredAfterForce(a, w.coords[a.last], d.epoch)
	var appendLoop, uploadLoop func()
	appendLoop = func() {
		if a.gen != gen {
			return
		}
		defer w.onHost(a.idx, time.Duration(w.uniform(50*time.Millisecond, 150*time.Millisecond)), appendLoop)
		if _, ok := a.valid(); !ok {
			return
		}
		// The WAL write, then the lease check before the answer.
		w.nextValue++
		r := simRec{stream: a.streamOf(), epoch: d.streamEp, offset: d.next, value: w.nextValue}
		a.wal = append(a.wal, r)
		d.next++
		w.onHost(a.idx, time.Duration(w.rng.Int64N(int64(3*time.Millisecond))), func() {
			if _, ok := a.valid(); ok && a.gen == gen {
				w.check.acked(a, d.epoch, r)
			}
		})
	}
	uploadLoop = func() {
		if a.gen != gen {
			return
		}
		defer w.onHost(a.idx, time.Duration(w.uniform(300*time.Millisecond, time.Second)), uploadLoop)
		if d.upload || len(a.wal) == 0 {
			return
		}
		recs := append([]simRec(nil), a.wal...)
		d.upload = true
		a.commit(a.last, d.epoch, d.streamEp, recs, nil, func(ok bool) {
			d.upload = false
			if !ok || a.gen != gen {
				return
			}
			end := recs[len(recs)-1].offset
			kept := a.wal[:0]
			for _, r := range a.wal {
				if r.offset > end {
					kept = append(kept, r)
				}
			}
			a.wal = kept
		})
	}
	w.onHost(a.idx, 0, appendLoop)
	w.onHost(a.idx, time.Duration(w.uniform(300*time.Millisecond, time.Second)), uploadLoop)
}

// recoverData is the builtin target's read, upload, commit and close for
// job j on coordinator c (after the fence), then the finish: the WAL of the
// broker beyond each opening stream's end, or nothing when the job's epoch
// acknowledged nothing.
func (c *Coord) recoverData(j *waldenv1.Job) {
	w := c.w
	a := w.agentByName(j.GetBrokerId())
	fo := &waldenv1.FailoverContext{JobId: j.GetJobId(), Attempt: j.GetAttempt(), Token: j.GetToken()}
	var step func()
	retry := func() { w.onHost(c.idx, 300*time.Millisecond, step) }
	step = func() {
		cur, ok := c.st.Job(j.GetJobId())
		if !ok || cur.GetAttempt() != j.GetAttempt() || (cur.GetJobState() != waldenv1.JobState_JOB_STATE_PENDING && cur.GetJobState() != waldenv1.JobState_JOB_STATE_RUNNING) {
			return
		}
		w.raft.readIndex(c.idx, func() {
			open := c.st.OpeningStreams(j.GetBrokerId())
			if len(open) == 0 {
				c.propose(&waldenv1.FinishJob{JobId: j.GetJobId(), Attempt: j.GetAttempt(), JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED}, 2*time.Second,
					func(_ *waldenv1.Result, err error) {
						if err != nil && refusal.Of(err) != refusal.JobNotRunning && refusal.Of(err) != refusal.StaleAttempt {
							retry()
						}
					})
				return
			}
			st := open[0]
			var recs []simRec
			if !j.GetAcknowledgedNothing() && !w.cfg.Mutations.RecoveryReadsNoWAL {
				wal := a.wal
				for _, t := range j.GetTails() {
					if t.GetStreamId() == st.GetStreamId() {
						// A restore job takes its tail's stream epoch only.
						wal = nil
						for _, r := range a.wal {
							if r.stream != st.GetStreamId() || r.epoch == t.GetStreamEpoch() {
								wal = append(wal, r)
							}
						}
					}
				}
				recs = contiguous(wal, st.GetStreamId(), st.GetEndOffset(), 0)
			}
			closeStream := func() {
				c.propose(&waldenv1.CloseStreamRequest{BrokerId: j.GetBrokerId(), BrokerEpoch: j.GetToken(), StreamId: st.GetStreamId(),
					StreamEpoch: st.GetEpoch(), Failover: fo}, 2*time.Second, func(_ *waldenv1.Result, err error) { retry() })
			}
			if len(recs) == 0 {
				closeStream()
				return
			}
			for i := range recs {
				recs[i].epoch = st.GetEpoch()
			}
			id := fmt.Sprintf("%s-a%d-%d-%d", j.GetJobId(), j.GetAttempt(), recs[0].offset, len(recs))
			w.check.uploaded(id, recs)
			length := uint64(16 * len(recs))
			obj := &waldenv1.Object{ObjectId: id, Key: "sim/" + id, Size: 16 + length + 36 + 56, Ranges: []*waldenv1.ObjectRange{{StreamId: st.GetStreamId(),
				StreamEpoch: st.GetEpoch(), StartOffset: recs[0].offset, EndOffset: recs[len(recs)-1].offset + 1, Position: 16, Length: length}}}
			c.propose(&waldenv1.CommitObjectRequest{BrokerId: j.GetBrokerId(), BrokerEpoch: j.GetToken(), Object: obj, Failover: fo}, 2*time.Second,
				func(_ *waldenv1.Result, err error) {
					if err != nil {
						retry()
						return
					}
					closeStream()
				})
		})
	}
	step()
}

// catalogOf is the committed content of stream id in state st: offset →
// the record's value, from the objects the world keeps.
func (w *World) catalogOf(st *fsm.State, id uint64) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for _, o := range st.StreamObjects(id, 0, 0) {
		for _, r := range o.GetRanges() {
			if r.GetStreamId() != id {
				continue
			}
			for _, rec := range w.objects[o.GetObjectId()] {
				if rec.offset >= r.GetStartOffset() && rec.offset < r.GetEndOffset() {
					out[rec.offset] = rec.value
				}
			}
		}
	}
	return out
}
