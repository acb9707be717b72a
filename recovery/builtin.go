package recovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"walden/objformat"
	"walden/objstore"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/wal"
)

// Store is the part of the S3 client the recovery targets use
// (*objstore.Client).
type Store interface {
	Upload(ctx context.Context, key string, body io.Reader, size int64, progress func(done int64)) (objstore.UploadResult, error)
	// UploadAt is Upload of a body read where it lies, not copied (the
	// automq target's objects).
	UploadAt(ctx context.Context, key string, body io.ReaderAt, size int64, progress func(done int64)) (objstore.UploadResult, error)
	Head(ctx context.Context, key string) (objstore.ObjectInfo, error)
	GetRange(ctx context.Context, key string, off, n int64) ([]byte, error)
	Delete(ctx context.Context, key string) error
	List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error)
	AbortIncompleteUploads(ctx context.Context, prefix string) (int, error)
	Prefix() string
}

// JobPrefix is the S3 key prefix under which job uploads: every key of the
// broker at the job's token (see objformat.Key).
func JobPrefix(prefix, brokerID string, token uint64) string {
	k := objformat.Key(prefix, brokerID, token, 0, 0)
	return k[:strings.LastIndexByte(k, '/')+1]
}

// planObject is one object of the plan: the kept records between two WAL
// offsets.
type planObject struct {
	first, last int64
	records     int
	size        int64
	streams     map[uint64]bool
	payload     int64
}

// plan is what the read step found.
type plan struct {
	objects []*planObject
	bytes   int64
	records int
	gaps    []string
	// below is, per opening stream, the lowest offset of the WAL's records
	// already committed (filter.below).
	below    map[uint64]uint64
	skipped  int64
	skipNote string
	endText  string
	// recovered is the WAL offset of the last valid record (the broker
	// trims to it, inclusive), or the header's trim offset when there is
	// none.
	recovered int64
}

// filter keeps, per opening stream, the records that continue the
// stream's committed end offset, and stops a stream at its first gap. For a
// restore job it keeps only the records of the stream epoch the plan gave
// the stream's tail (epochs).
type filter struct {
	streams map[uint64]*waldenv1.Stream
	epochs  map[uint64]uint64
	next    map[uint64]uint64
	stopped map[uint64]bool
	gaps    []string
	// below is, per stream, the lowest offset of the WAL's records below
	// the stream's committed end: acknowledged records that a committed
	// object must hold.
	below map[uint64]uint64
}

func newFilter(streams []*waldenv1.Stream, epochs map[uint64]uint64) *filter {
	f := &filter{streams: map[uint64]*waldenv1.Stream{}, epochs: epochs, next: map[uint64]uint64{}, stopped: map[uint64]bool{}, below: map[uint64]uint64{}}
	for _, st := range streams {
		f.streams[st.GetStreamId()] = st
		f.next[st.GetStreamId()] = st.GetEndOffset()
	}
	return f
}

// keep reports whether rec is uploaded. Records of other streams, and
// records below a stream's end offset (already in S3), are dropped; a
// record that starts beyond the expected offset is a gap: the stream stops
// there.
func (f *filter) keep(rec wal.Record) bool {
	b := rec.Batch
	id := b.StreamID
	if _, ok := f.streams[id]; !ok || f.stopped[id] {
		return false
	}
	if e, ok := f.epochs[id]; f.epochs != nil && (!ok || b.Epoch != e) {
		// A restore job's stream takes the records of its tail's epoch
		// only: another epoch's at these offsets were replaced.
		return false
	}
	exp := f.next[id]
	switch {
	case b.BaseOffset < exp:
		if low, ok := f.below[id]; !ok || b.BaseOffset < low {
			f.below[id] = b.BaseOffset
		}
		return false
	case b.BaseOffset > exp:
		f.stopped[id] = true
		f.gaps = append(f.gaps, fmt.Sprintf("stream %d: gap at offset %d (next record starts at %d, WAL offset %d)", id, exp, b.BaseOffset, rec.Offset))
		return false
	}
	f.next[id] = b.EndOffset()
	return true
}

// objectOverhead is an object's size beyond its batches, with n streams.
func objectOverhead(n int) int64 {
	return objformat.HeaderSize + objformat.IndexHeaderSize + objformat.FooterSize + int64(n)*objformat.IndexEntrySize
}

// readPlan scans the WAL and groups the kept records into objects of at
// most ObjectSize bytes.
func (a *attempt) readPlan(path string, streams []*waldenv1.Stream, epochs map[uint64]uint64) (*plan, error) {
	rd, err := wal.Open(path)
	if err != nil {
		return nil, fmt.Errorf("recovery: read: %w", err)
	}
	defer rd.Close()
	p := &plan{recovered: rd.Header().TrimOffset}
	f := newFilter(streams, epochs)
	var cur *planObject
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("recovery: read: %w", err)
		}
		p.recovered = rec.Offset
		if !f.keep(rec) {
			continue
		}
		sz := int64(objformat.BatchHeaderSize + len(rec.Batch.Payload))
		if cur != nil {
			n := len(cur.streams)
			if !cur.streams[rec.Batch.StreamID] {
				n++
			}
			if cur.payload+sz+objectOverhead(n) > a.e.cfg.ObjectSize {
				cur = nil
			}
		}
		if cur == nil {
			cur = &planObject{first: rec.Offset, streams: map[uint64]bool{}}
			p.objects = append(p.objects, cur)
		}
		cur.last = rec.Offset
		cur.records++
		cur.payload += sz
		cur.streams[rec.Batch.StreamID] = true
		p.records++
	}
	for _, o := range p.objects {
		o.size = o.payload + objectOverhead(len(o.streams))
		p.bytes += o.size
	}
	st := rd.Stats()
	p.gaps = f.gaps
	p.below = f.below
	p.endText = st.EndText()
	p.skipped, p.skipNote = st.DamagedBytes()
	return p, nil
}

// built is one object ready to upload.
type built struct {
	n     int
	key   string
	id    string
	size  int64
	data  []byte
	index *objformat.Index
	crc   uint32
	first int64
	last  int64
	batch int
	// producers is the last batch of each idempotent producer per stream
	// (read from the reference broker's batch framing), committed with the
	// object so that the streams' next owners know them.
	producers []*waldenv1.StreamProducers
}

// build scans the WAL again and sends the objects of p, built with
// objformat, on out. Batches are written under the stream's current epoch
// (the epoch the failover commit names).
//
// The payload arena and the object buffers (from bufs, which holds at most
// upload_objects + 1 of them) are allocated once at the plan's largest
// object and reused, so a recovery holds object_size × (upload_objects + 2)
// bytes of objects at most, whatever the WAL's size (see Config.MemoryBound).
func (a *attempt) build(ctx context.Context, j *waldenv1.Job, path string, streams []*waldenv1.Stream, p *plan, out chan<- *built, bufs *bufferPool) error {
	defer close(out)
	rd, err := wal.Open(path)
	if err != nil {
		return fmt.Errorf("recovery: upload: %w", err)
	}
	defer rd.Close()
	f := newFilter(streams, tailEpochs(j))
	arena := make([]byte, 0, p.maxPayload())
	prefix := ""
	if a.e.store != nil {
		prefix = a.e.store.Prefix()
	}
	for n, po := range p.objects {
		b := objformat.NewBuilder()
		// The arena holds the object's payloads (the reader's buffer is
		// reused by the next record); WriteTo copies them out.
		arena = arena[:0]
		var prods producer.Summary
		for b.Len() < po.records {
			rec, err := rd.Next()
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("recovery: upload: the WAL ended before object %d (WAL offsets %d..%d): it changed since the read step", n, po.first, po.last)
			}
			if err != nil {
				return fmt.Errorf("recovery: upload: %w", err)
			}
			if !f.keep(rec) {
				continue
			}
			if b.Len() == 0 && rec.Offset != po.first || rec.Offset > po.last {
				return fmt.Errorf("recovery: upload: record at WAL offset %d outside object %d (%d..%d): the WAL changed since the read step", rec.Offset, n, po.first, po.last)
			}
			bt := rec.Batch
			bt.Epoch = f.streams[bt.StreamID].GetEpoch()
			start := len(arena)
			if len(arena)+len(bt.Payload) > cap(arena) {
				return fmt.Errorf("recovery: upload: object %d (WAL offsets %d..%d) holds more payload than the read step found: the WAL changed since the read step", n, po.first, po.last)
			}
			arena = append(arena, bt.Payload...)
			bt.Payload = arena[start:len(arena):len(arena)]
			if err := b.Add(bt); err != nil {
				return fmt.Errorf("recovery: upload: %w", err)
			}
			// A payload whose producer header is malformed is uploaded
			// all the same (its CRC held): only its producer is not known.
			if err := prods.Add(bt.StreamID, bt.BaseOffset, bt.Count, bt.Payload); err != nil {
				a.log.Warn("record batch with a malformed producer header; its producer's retries are not recognized",
					"stream_id", bt.StreamID, "base_offset", bt.BaseOffset, "wal_offset", rec.Offset, "err", err)
			}
		}
		buf, err := bufs.get(ctx)
		if err != nil {
			return err
		}
		w := &fixedBuffer{b: buf[:0]}
		if _, err := b.WriteTo(w); err != nil {
			bufs.put(buf)
			return fmt.Errorf("recovery: upload: object %d (WAL offsets %d..%d): %w", n, po.first, po.last, err)
		}
		data := w.b
		ix, err := objformat.ReadIndex(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return fmt.Errorf("recovery: upload: built object: %w", err)
		}
		obj := &built{n: n, key: objformat.Key(prefix, j.GetBrokerId(), j.GetToken(), po.first, po.last),
			id: objformat.ObjectID(j.GetBrokerId(), j.GetToken(), po.first, po.last), data: data, index: ix, size: int64(len(data)),
			first: po.first, last: po.last, batch: po.records, producers: prods.Streams()}
		select {
		case out <- obj:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// maxPayload and maxSize are the largest payload and encoded size of the
// plan's objects (at most object_size, or one record when a record alone is
// larger).
func (p *plan) maxPayload() int64 {
	var m int64
	for _, o := range p.objects {
		m = max(m, o.payload)
	}
	return m
}

func (p *plan) maxSize() int64 {
	var m int64
	for _, o := range p.objects {
		m = max(m, o.size)
	}
	return m
}

// bufferPool hands out object buffers of one size, at most limit of them:
// get waits for a buffer whose upload finished once limit are out. Only the
// build goroutine calls get; the uploaders put buffers back.
type bufferPool struct {
	size  int64
	limit int
	made  int
	free  chan []byte
}

func newBufferPool(size int64, limit int) *bufferPool {
	return &bufferPool{size: size, limit: limit, free: make(chan []byte, limit)}
}

func (p *bufferPool) get(ctx context.Context) ([]byte, error) {
	select {
	case b := <-p.free:
		return b, nil
	default:
	}
	if p.made < p.limit {
		p.made++
		return make([]byte, 0, p.size), nil
	}
	select {
	case b := <-p.free:
		return b, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (p *bufferPool) put(b []byte) {
	select {
	case p.free <- b[:0]:
	default: // not one of the pool's: dropped
	}
}

// errObjectTooLarge means an object encoded to more bytes than the read
// step planned: the WAL changed in between.
var errObjectTooLarge = errors.New("the object is larger than the read step planned: the WAL changed since the read step")

// fixedBuffer is an io.Writer into a slice that never grows beyond its
// capacity (a bytes.Buffer would double it), so an object never takes more
// memory than its pool buffer.
type fixedBuffer struct{ b []byte }

func (f *fixedBuffer) Write(p []byte) (int, error) {
	if len(f.b)+len(p) > cap(f.b) {
		return 0, errObjectTooLarge
	}
	f.b = append(f.b, p...)
	return len(p), nil
}

// builtinTarget recovers into walden's own catalog and object format:
// attach → read → upload → commit → close → detach → finish. Every part is
// idempotent, so a failure anywhere retries the whole sequence.
type builtinTarget struct{}

func (builtinTarget) Recover(ctx context.Context, r *Run) (waldenv1.JobStep, error) {
	return r.a.builtin(ctx)
}

// builtin runs the builtin target: the job as committed (surveyed first
// when it restores a cluster), then either nothing to read (withoutWAL) or
// attach → read → upload → commit → close → detach → finish.
func (a *attempt) builtin(ctx context.Context) (waldenv1.JobStep, error) {
	j, step, err := a.builtinJob(ctx)
	if err != nil {
		return step, err
	}
	if note, ok := a.nothingToRead(ctx, j); ok {
		return a.withoutWAL(ctx, j, note)
	}
	path, err := a.attach(ctx)
	if err != nil {
		return waldenv1.JobStep_JOB_STEP_ATTACH, err
	}
	r, err := a.readStep(ctx, j, path)
	if err != nil {
		return waldenv1.JobStep_JOB_STEP_READ, err
	}
	objs, err := a.upload(ctx, j, path, r.streams, r.plan)
	if err != nil {
		return waldenv1.JobStep_JOB_STEP_UPLOAD, err
	}
	if err := a.commitObjects(ctx, j, objs); err != nil {
		return waldenv1.JobStep_JOB_STEP_COMMIT, err
	}
	if err := a.closeStreams(ctx, j, r.total); err != nil {
		return waldenv1.JobStep_JOB_STEP_CLOSE, err
	}
	if err := a.detach(ctx); err != nil {
		return waldenv1.JobStep_JOB_STEP_DETACH, err
	}
	a.cleanup(ctx, j)
	return waldenv1.JobStep_JOB_STEP_DONE, a.finish(ctx, r.plan.recovered)
}

// builtinJob is the job as committed; a job that restores a cluster is
// surveyed first, and read again after it.
func (a *attempt) builtinJob(ctx context.Context) (*waldenv1.Job, waldenv1.JobStep, error) {
	j, err := a.job()
	if err != nil {
		return nil, waldenv1.JobStep_JOB_STEP_ATTACH, err
	}
	if !j.GetRestore() {
		return j, 0, nil
	}
	if step, err := a.survey(ctx, j); err != nil {
		return nil, step, err
	}
	if j, err = a.job(); err != nil {
		return nil, waldenv1.JobStep_JOB_STEP_READ, err
	}
	return j, 0, nil
}

// nothingToRead reports whether the job reads no WAL, and the note that
// says why: an operator declared the WAL lost, or the failed epoch
// acknowledged nothing (recorded in an event once).
func (a *attempt) nothingToRead(ctx context.Context, j *waldenv1.Job) (string, bool) {
	switch {
	case j.GetWalLost():
		return "the WAL was declared lost by an operator (" + j.GetResolution() + "): nothing read", true
	case j.GetAcknowledgedNothing():
		if !a.reported {
			a.reported = true
			a.event(ctx, j, waldenv1.JobStep_JOB_STEP_READ, fmt.Sprintf("no WAL read: a majority of the voters never granted the failed epoch a lease, so broker %s acknowledged "+
				"nothing under it, and its earlier epochs were recovered before it registered; its streams are closed at the catalog's ends", j.GetBrokerId()))
		}
		return "the failed epoch was never granted a lease by a majority: it acknowledged nothing; nothing read", true
	}
	return "", false
}

// readResult is what the read step found: the opening streams as committed
// at its start, the broker's total of streams (after a partial close by an
// earlier run fewer are open) and the plan of the objects to upload.
type readResult struct {
	streams []*waldenv1.Stream
	total   int
	plan    *plan
}

// readStep reads the opening streams as committed now, then the WAL at
// path, checks that every record it drops as already in S3 is backed by an
// object, and checkpoints the read step (failing the job when acknowledged
// records are missing).
func (a *attempt) readStep(ctx context.Context, j *waldenv1.Job, path string) (readResult, error) {
	if err := a.e.cluster.LinearizableRead(ctx); err != nil {
		return readResult{}, fmt.Errorf("recovery: read barrier: %w", err)
	}
	streams := a.e.state.OpeningStreams(j.GetBrokerId())
	total := max(len(streams), int(j.GetStreamsTotal()))
	started := time.Now()
	p, err := a.readPlan(path, streams, tailEpochs(j))
	if err != nil {
		return readResult{}, err
	}
	detail := readDetail(p, len(streams))
	// The WAL's records below a stream's end offset are dropped as already
	// in S3: the objects that hold them must exist, or the job would
	// succeed without acknowledged records.
	missing, err := a.checkBacked(ctx, streams, p.below)
	if err != nil {
		return readResult{}, err
	}
	if len(missing) > 0 {
		return readResult{}, a.failMissing(ctx, j, path, p, detail, total, missing)
	}
	if !a.reported && (p.skipped > 0 || len(p.gaps) > 0) {
		a.reported = true
		a.event(ctx, j, waldenv1.JobStep_JOB_STEP_READ, "read "+path+": "+detail+gapText(p.gaps))
	}
	if err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: waldenv1.JobStep_JOB_STEP_READ, StepDone: true, Detail: detail,
		BytesTotal: uint64(p.bytes), SkippedBytes: uint64(p.skipped), Gaps: p.gaps, StreamsTotal: uint32(total),
		RecoveredWalOffset: p.recovered}); err != nil {
		return readResult{}, err
	}
	a.log.Info("step done", "step", waldenv1.JobStep_JOB_STEP_READ.Name(), "detail", detail, "elapsed", time.Since(started))
	return readResult{streams: streams, total: total, plan: p}, nil
}

// readDetail says what the read step found, for its checkpoint.
func readDetail(p *plan, opening int) string {
	detail := fmt.Sprintf("%s of %s to upload in %s (%d bytes); %s",
		plural(int64(p.records), "record", "records"), plural(int64(opening), "opening stream", "opening streams"),
		plural(int64(len(p.objects)), "object", "objects"), p.bytes, p.endText)
	if p.skipped > 0 {
		detail += fmt.Sprintf("; skipped %d bytes of damaged records", p.skipped)
		if p.skipNote != "" {
			detail += " (" + p.skipNote + ")"
		}
	}
	if len(p.gaps) > 0 {
		detail += fmt.Sprintf("; %s stopped at a gap", plural(int64(len(p.gaps)), "stream", "streams"))
	}
	return detail
}

// failMissing records that acknowledged records are missing (committed
// ranges of the WAL that no object backs) and fails the job.
func (a *attempt) failMissing(ctx context.Context, j *waldenv1.Job, path string, p *plan, detail string, total int, missing []unbacked) error {
	msg := fmt.Sprintf("acknowledged records are missing: the WAL holds records of committed ranges that no object backs: %s", unbackedText(missing))
	gaps := append([]string(nil), p.gaps...)
	for _, m := range missing {
		gaps = append(gaps, m.String())
	}
	a.event(ctx, j, waldenv1.JobStep_JOB_STEP_READ, "read "+path+": "+msg)
	if err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: waldenv1.JobStep_JOB_STEP_READ, Detail: detail, BytesTotal: uint64(p.bytes),
		SkippedBytes: uint64(p.skipped), Gaps: gaps, StreamsTotal: uint32(total), Error: msg}); err != nil {
		return err
	}
	if err := a.fail(ctx, msg); err != nil {
		return err
	}
	return fmt.Errorf("recovery: job %s failed: %w: %s", a.jobID, ErrRecordsMissing, unbackedText(missing))
}

// commitObjects commits the uploaded objects in WAL order (every range
// starts at its stream's end offset) and checkpoints the commit step.
func (a *attempt) commitObjects(ctx context.Context, j *waldenv1.Job, objs []*built) error {
	records := 0
	for _, o := range objs {
		res, err := a.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_CommitObject{CommitObject: &waldenv1.CommitObjectRequest{
			BrokerId: j.GetBrokerId(), BrokerEpoch: j.GetToken(), Failover: a.failover(j),
			Object: &waldenv1.Object{ObjectId: o.id, Key: o.key, Size: uint64(o.size), Ranges: o.index.Ranges(),
				FirstWalOffset: o.first, LastWalOffset: o.last, Crc32C: o.crc},
			Producers: o.producers,
		}}})
		if err != nil {
			return fmt.Errorf("recovery: commit %s: %w", o.id, err)
		}
		records += o.batch
		a.log.Debug("object committed", "object_id", o.id, "redundant", res.GetCommitObject().GetRedundant())
	}
	return a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: waldenv1.JobStep_JOB_STEP_COMMIT, StepDone: true, RecordsUploaded: uint64(records),
		Detail: fmt.Sprintf("committed %s (%s)", plural(int64(len(objs)), "object", "objects"), plural(int64(records), "record batch", "record batches"))})
}

// withoutWAL finishes a job whose WAL is not read: an operator resolved it
// with the WAL declared lost (waldenctl jobs resolve --wal-lost), or the
// decision found that the broker acknowledged nothing the catalog lacks
// (Job.acknowledged_nothing). Nothing is attached, read or uploaded; the
// broker's streams are closed at the catalog's ends (with the WAL lost,
// what it held beyond them is lost, as the operator said). note says why
// in the job's checkpoints.
func (a *attempt) withoutWAL(ctx context.Context, j *waldenv1.Job, note string) (waldenv1.JobStep, error) {
	if err := a.e.cluster.LinearizableRead(ctx); err != nil {
		return waldenv1.JobStep_JOB_STEP_READ, fmt.Errorf("recovery: read barrier: %w", err)
	}
	total := max(len(a.e.state.OpeningStreams(j.GetBrokerId())), int(j.GetStreamsTotal()))
	for _, step := range []waldenv1.JobStep{waldenv1.JobStep_JOB_STEP_ATTACH, waldenv1.JobStep_JOB_STEP_READ,
		waldenv1.JobStep_JOB_STEP_UPLOAD, waldenv1.JobStep_JOB_STEP_COMMIT} {
		if j.GetJobStep() > step {
			continue
		}
		if err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: step, StepDone: true, Detail: note, StreamsTotal: uint32(total)}); err != nil {
			return step, err
		}
	}
	if err := a.closeStreams(ctx, j, total); err != nil {
		return waldenv1.JobStep_JOB_STEP_CLOSE, err
	}
	if err := a.stepDone(ctx, waldenv1.JobStep_JOB_STEP_DETACH, "nothing attached"); err != nil {
		return waldenv1.JobStep_JOB_STEP_DETACH, err
	}
	return waldenv1.JobStep_JOB_STEP_DONE, a.finish(ctx, -1)
}

func gapText(gaps []string) string {
	if len(gaps) == 0 {
		return ""
	}
	return "; " + strings.Join(gaps, "; ")
}

// upload builds and uploads the objects of p, UploadObjects at a time,
// skipping objects already in S3 under their deterministic key with the
// same size (an earlier attempt uploaded them: same key, same bytes). It
// returns them in plan order.
func (a *attempt) upload(ctx context.Context, j *waldenv1.Job, path string, streams []*waldenv1.Stream, p *plan) ([]*built, error) {
	if len(p.objects) == 0 {
		return nil, a.stepDone(ctx, waldenv1.JobStep_JOB_STEP_UPLOAD, "nothing to upload")
	}
	if a.e.store == nil {
		return nil, fmt.Errorf("recovery: upload: %w", ErrNoS3)
	}
	prefix := JobPrefix(a.e.store.Prefix(), j.GetBrokerId(), j.GetToken())
	if n, err := a.e.store.AbortIncompleteUploads(ctx, prefix); err != nil {
		return nil, fmt.Errorf("recovery: upload: clean up earlier attempts: %w", err)
	} else if n > 0 {
		a.log.Info("aborted incomplete uploads of earlier attempts", "count", n, "prefix", prefix)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Unbuffered: a built object waits in the build goroutine for a free
	// uploader, so at most upload_objects + 1 object buffers exist (one per
	// uploader, one being built) besides the payload arena.
	ch := make(chan *built)
	bufs := newBufferPool(p.maxSize(), a.e.cfg.UploadObjects+1)
	var buildErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.build(ctx, j, path, streams, p, ch, bufs); err != nil {
			buildErr = err
			cancel(err)
		}
	}()

	var done atomic.Int64 // bytes of finished objects
	var inflight sync.Map // object n → bytes acknowledged so far
	progress := func() uint64 {
		n := done.Load()
		inflight.Range(func(_, v any) bool { n += v.(*atomic.Int64).Load(); return true })
		return uint64(n)
	}
	prog := &Progress{}
	prog.total.Store(uint64(p.bytes))
	prog.start(ctx, a, waldenv1.JobStep_JOB_STEP_UPLOAD, func(err error) { cancel(err) }, progress)

	out := make([]*built, len(p.objects))
	var mu sync.Mutex
	var firstErr error
	var uwg sync.WaitGroup
	skipped := 0
	for w := 0; w < a.e.cfg.UploadObjects; w++ {
		uwg.Add(1)
		go func() {
			defer uwg.Done()
			for o := range ch {
				size := int64(len(o.data))
				if info, err := a.e.store.Head(ctx, o.key); err == nil && info.Size == size {
					o.crc = objformat.CRC32C(o.data)
					mu.Lock()
					skipped++
					mu.Unlock()
				} else {
					cur := new(atomic.Int64)
					inflight.Store(o.n, cur)
					res, err := a.e.store.Upload(ctx, o.key, bytes.NewReader(o.data), size, func(n int64) { cur.Store(n) })
					inflight.Delete(o.n)
					o.crc = res.CRC32C // computed while uploading
					if err != nil {
						// The buffer is not reused: the build stops (cancel).
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						cancel(err)
						continue
					}
				}
				done.Add(size)
				bufs.put(o.data)
				o.data = nil // in S3; the commit needs the index only
				out[o.n] = o
			}
		}()
	}
	uwg.Wait()
	wg.Wait()
	prog.Stop()
	if firstErr != nil {
		return nil, fmt.Errorf("recovery: upload: %w", firstErr)
	}
	if buildErr != nil {
		return nil, buildErr
	}
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return nil, err
	}
	if err := a.checkpoint(ctx, &waldenv1.CheckpointJob{JobStep: waldenv1.JobStep_JOB_STEP_UPLOAD, StepDone: true, BytesUploaded: uint64(p.bytes), BytesTotal: uint64(p.bytes),
		Detail: fmt.Sprintf("uploaded %s (%d already in S3), %d bytes", plural(int64(len(out)), "object", "objects"), skipped, p.bytes)}); err != nil {
		return nil, err
	}
	return out, nil
}

// cleanup deletes what earlier attempts left under the job's prefix:
// incomplete multipart uploads and objects that are not committed. It is
// best effort: a failure is logged, the job still succeeds.
func (a *attempt) cleanup(ctx context.Context, j *waldenv1.Job) {
	if a.e.store == nil {
		return
	}
	prefix := JobPrefix(a.e.store.Prefix(), j.GetBrokerId(), j.GetToken())
	if _, err := a.e.store.AbortIncompleteUploads(ctx, prefix); err != nil {
		a.log.Warn("cleanup: abort incomplete uploads", "prefix", prefix, "err", err)
	}
	objs, err := a.e.store.List(ctx, prefix)
	if err != nil {
		a.log.Warn("cleanup: list", "prefix", prefix, "err", err)
		return
	}
	cur, _ := a.e.state.Job(j.GetJobId())
	committed := map[string]bool{}
	for _, id := range cur.GetObjects() {
		if o, ok := a.e.state.Object(id); ok {
			committed[o.GetKey()] = true
		}
	}
	deleted := 0
	for _, o := range objs {
		if committed[o.Key] {
			continue
		}
		if err := a.e.store.Delete(ctx, o.Key); err != nil {
			a.log.Warn("cleanup: delete uncommitted object", "key", o.Key, "err", err)
			continue
		}
		deleted++
	}
	if deleted > 0 {
		a.log.Info("cleanup: deleted objects uploaded but never committed", "count", deleted, "prefix", prefix)
	}
}

// plural is "1 object", "2 objects".
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
