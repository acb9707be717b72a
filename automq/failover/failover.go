package failover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	"walden/automq/controller"
	"walden/automq/protocol"
	"walden/objstore"
	"walden/wal"
)

// Controller is the part of AutoMQ's controller a failover uses
// (*controller.Client).
type Controller interface {
	GetNodes(ctx context.Context, ids []int32) ([]controller.Node, error)
	GetOpeningStreams(ctx context.Context, nodeID int32, nodeEpoch int64, failover bool) ([]controller.OpeningStream, error)
	PrepareS3Object(ctx context.Context, nodeID int32, count int32, ttl time.Duration) (int64, error)
	CommitStreamSetObject(ctx context.Context, req controller.CommitRequest) (controller.CommitResult, error)
	CloseStreams(ctx context.Context, nodeID int32, nodeEpoch int64, streams []controller.CloseStream) ([]controller.StreamResult, error)
}

// Store is the part of the S3 client a failover uses (*objstore.Client).
type Store interface {
	// UploadAt uploads size bytes of body without copying them (see
	// objstore.Client.UploadAt): an object is laid out over the WAL's
	// records in memory and read where they lie.
	UploadAt(ctx context.Context, key string, body io.ReaderAt, size int64, progress func(done int64)) (objstore.UploadResult, error)
	Head(ctx context.Context, key string) (objstore.ObjectInfo, error)
	GetRange(ctx context.Context, key string, off, n int64) ([]byte, error)
}

// Step is a step of the failover, in AutoMQ's order.
type Step string

// The steps.
const (
	// StepHeader reads the WAL's header: node id and epoch.
	StepHeader Step = "header"
	// StepFence asks the controller for the node's opening streams in
	// failover mode, which fences the node at the controller.
	StepFence Step = "fence"
	// StepRead scans the WAL and keeps the records AutoMQ's recovery keeps.
	StepRead Step = "read"
	// StepUpload prepares object ids and uploads the objects of a batch.
	StepUpload Step = "upload"
	// StepCommit commits a batch in failover mode.
	StepCommit Step = "commit"
	// StepReset empties the WAL.
	StepReset Step = "reset"
	// StepClose closes the opening streams as the dead node.
	StepClose Step = "close"
)

// Event tells an observer where the failover is. Report is a copy, safe to
// keep.
type Event struct {
	Step Step
	// Done says the step finished (else it starts).
	Done   bool
	Detail string
	Report *Report
}

// Request names the broker to fail over.
type Request struct {
	// WALPath is the dead broker's WAL file or device.
	WALPath string
	// NodeID is its AutoMQ node id; the WAL's header must name it.
	NodeID int32
	// NodeEpoch, when positive, is the node epoch to fail over; it must not
	// be older than the WAL header's or the controller's. Zero takes the
	// larger of those two.
	NodeEpoch int64
	// Prior is the report of an earlier run of the same failover, whose
	// streams' end offsets before, records and objects the new report
	// carries on.
	Prior *Report
}

// Options wire a Failover.
type Options struct {
	// Logger receives the failover's decisions; nil discards them.
	Logger *slog.Logger
	// Observe is told each step's start and end (synchronously: it may
	// record progress durably before the failover goes on). It may return
	// an error to stop the failover (ErrStopped, or the caller's own).
	Observe func(Event) error
	// Uploaded is told the bytes uploaded so far and the total planned so
	// far, often and from several goroutines at once; it must not block.
	Uploaded func(done, total int64)
}

// Failover fails over AutoMQ 1.x nodes the way AutoMQ's own failover code
// (Client#failover, S3Storage.recover) does, without Java: header check,
// fence at the controller, AutoMQ's record filter, objects in AutoMQ's
// format, a commit in failover mode, the WAL reset and the close. It is
// safe to run again after a failure at any point: what the controller
// committed is filtered out by its end offsets, a repeated commit answers
// REDUNDANT_OPERATION, a closed stream closes again harmlessly.
type Failover struct {
	cfg   Config
	ctl   Controller
	store Store
	opts  Options
	log   *slog.Logger
}

// New returns a Failover. cfg must be valid (Config.Validate).
func New(cfg Config, ctl Controller, store Store, opts Options) (*Failover, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ctl == nil || store == nil {
		return nil, fmt.Errorf("automq failover: %w: a controller client and an S3 client are required", ErrInvalidConfig)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Failover{cfg: cfg, ctl: ctl, store: store, opts: opts, log: opts.Logger.With("component", "automq-failover")}, nil
}

// run is one run of a failover.
type run struct {
	f     *Failover
	req   Request
	rep   *Report
	log   *slog.Logger
	epoch int64
	// walRecords says the WAL held at least one valid record beyond its
	// trim offset (then it is reset).
	walRecords bool
	uploaded   int64
	planned    int64
}

// Run fails over node req.NodeID from the WAL at req.WALPath. It returns
// the report (also on error, with what was done) and an error unless every
// opening stream was closed with nothing left behind. ErrDataMayBeLost
// means streams were left opened because the WAL's records do not continue
// them (see Config.CloseStreamsWithGaps).
func (f *Failover) Run(ctx context.Context, req Request) (*Report, error) {
	start := time.Now()
	r := &run{f: f, req: req, rep: req.Prior.Clone(), log: f.log.With("node_id", req.NodeID, "wal", req.WALPath)}
	if r.rep == nil {
		r.rep = &Report{}
	}
	r.rep.WALPath, r.rep.NodeID, r.rep.Gaps = req.WALPath, req.NodeID, nil
	err := r.run(ctx)
	r.rep.DurationMS = time.Since(start).Milliseconds()
	if err != nil {
		return r.rep.Clone(), err
	}
	return r.rep.Clone(), nil
}

func (r *run) emit(step Step, done bool, format string, args ...any) error {
	detail := fmt.Sprintf(format, args...)
	if done {
		r.log.Info("step done", "step", string(step), "detail", detail)
	}
	if r.f.opts.Observe == nil {
		return nil
	}
	return r.f.opts.Observe(Event{Step: step, Done: done, Detail: detail, Report: r.rep.Clone()})
}

// run is the failover's sequence, in AutoMQ's order (see the package
// doc): each step is told to the observer as it starts and ends, and a
// step that fails stops the run with what was done in the report.
func (r *run) run(ctx context.Context) error {
	if r.req.NodeID < 0 {
		return fmt.Errorf("automq failover: %w: node id %d is negative", ErrInvalidRequest, r.req.NodeID)
	}
	// 1. The WAL's header: whose it is and which epoch it last ran.
	empty, err := r.readHeader(ctx)
	if err != nil {
		return err
	}
	// 2. Fence the node at the controller and learn its opening streams.
	opening, ends, err := r.fence(ctx)
	if err != nil {
		return err
	}
	if empty {
		return r.neverWritten(opening)
	}
	// 3.–5. Read, upload and commit, batch by batch.
	invalid, trim, err := r.recoverWAL(ctx, ends)
	if err != nil {
		return err
	}
	// 6. Reset the WAL, unless streams with missing records stay opened
	// (then the WAL stays as it is, for an operator).
	if err := r.resetWAL(invalid, trim); err != nil {
		return err
	}
	// 7. Close the opening streams as the dead node.
	if err := r.closeStreams(ctx, opening, invalid); err != nil {
		return err
	}
	return r.leftOpened(invalid)
}

// readHeader is step 1: it reads the WAL's header and chooses the node
// epoch. empty says the WAL was never written.
func (r *run) readHeader(ctx context.Context) (bool, error) {
	if err := r.emit(StepHeader, false, "reading the header of %s", r.req.WALPath); err != nil {
		return false, err
	}
	hdr, empty, err := r.header()
	if err != nil {
		return false, err
	}
	if err := r.chooseEpoch(ctx, hdr, empty); err != nil {
		return false, err
	}
	r.rep.NodeEpoch = r.epoch
	if err := r.emit(StepHeader, true, "node %d, epoch %d", r.req.NodeID, r.epoch); err != nil {
		return false, err
	}
	return empty, nil
}

// fence is step 2: GetOpeningStreams in failover mode fences the node at
// the controller and names its opening streams, whose end offsets (by
// stream id) the read starts from. The report records each opening stream
// at its epoch and end, not closed; a problem an earlier run recorded of it
// is kept only when it is a gap.
func (r *run) fence(ctx context.Context) ([]controller.OpeningStream, map[int64]int64, error) {
	if err := r.emit(StepFence, false, "fencing node %d at the controller", r.req.NodeID); err != nil {
		return nil, nil, err
	}
	opening, err := r.f.ctl.GetOpeningStreams(ctx, r.req.NodeID, r.epoch, true)
	if err != nil {
		return nil, nil, r.controllerError(err)
	}
	r.rep.Fenced = true
	ends := map[int64]int64{}
	for _, s := range opening {
		st := r.rep.stream(s.StreamID, s.Epoch, s.EndOffset)
		st.StreamEpoch, st.EndOffsetAfter, st.Closed = s.Epoch, s.EndOffset, false
		if st.Problem != "" && !strings.HasPrefix(st.Problem, problemGapPrefix) {
			st.Problem = ""
		}
		ends[s.StreamID] = s.EndOffset
	}
	// Streams of an earlier run that are no longer opening were closed.
	for i := range r.rep.Streams {
		if _, ok := ends[r.rep.Streams[i].StreamID]; !ok {
			r.rep.Streams[i].Closed = true
		}
	}
	if err := r.emit(StepFence, true, "node %d fenced at the controller: %d opening streams", r.req.NodeID, len(opening)); err != nil {
		return nil, nil, err
	}
	return opening, ends, nil
}

// neverWritten ends the failover of a WAL that was never written: there is
// nothing to recover, unless the controller lists opening streams, which
// such a WAL cannot be the node's.
func (r *run) neverWritten(opening []controller.OpeningStream) error {
	if len(opening) > 0 {
		return fmt.Errorf("automq failover: %w: the WAL at %s was never written (no header), but the controller lists %d opening streams of node %d: "+
			"is it the node's WAL device? Nothing was uploaded or closed", ErrWrongWAL, r.req.WALPath, len(opening), r.req.NodeID)
	}
	r.rep.WALReset = true
	return nil
}

// keepsOpened says whether streams with a problem are left opened (with
// the WAL as it is), rather than closed as AutoMQ does.
func (r *run) keepsOpened(invalid map[int64]string) bool {
	return len(invalid) > 0 && !r.f.cfg.CloseStreamsWithGaps
}

// resetWAL is step 6: it empties the WAL from trim on, unless streams are
// left opened; a WAL that held no record beyond its trim offset is empty
// already.
func (r *run) resetWAL(invalid map[int64]string, trim int64) error {
	switch {
	case r.keepsOpened(invalid):
		r.log.Warn("the WAL is not reset: streams are left opened", "streams", len(invalid))
		return nil
	case !r.walRecords:
		r.rep.WALReset = true // nothing in it beyond its trim offset
		return nil
	}
	if err := r.emit(StepReset, false, "resetting %s", r.req.WALPath); err != nil {
		return err
	}
	res, err := wal.Reset(r.req.WALPath, wal.ResetOptions{NodeID: uint32(r.req.NodeID), TrimOffset: trim})
	if err != nil {
		return fmt.Errorf("automq failover: reset the WAL: %w", err)
	}
	r.rep.WALReset = true
	return r.emit(StepReset, true, "the WAL at %s is empty: trim offset %d (%s)", r.req.WALPath, res.After.TrimOffset, res.Outcome)
}

// leftOpened is the failover's outcome once the streams are closed:
// ErrDataMayBeLost naming every stream left opened, in stream id order, or
// nil.
func (r *run) leftOpened(invalid map[int64]string) error {
	if !r.keepsOpened(invalid) {
		return nil
	}
	var lines []string
	for _, id := range sortedKeys(invalid) {
		lines = append(lines, invalid[id])
	}
	return fmt.Errorf("automq failover: %w: %s", ErrDataMayBeLost, strings.Join(lines, "; "))
}

// header reads the WAL's header. empty says the WAL was never written: both
// header slots are zeros.
func (r *run) header() (hdr wal.Header, empty bool, err error) {
	hdr, _, err = wal.ReadHeader(r.req.WALPath)
	if err != nil {
		if errors.Is(err, wal.ErrNotWAL) {
			if zero, zerr := headerZero(r.req.WALPath); zerr == nil && zero {
				r.log.Info("the WAL was never written: nothing to recover")
				return wal.Header{}, true, nil
			}
		}
		return wal.Header{}, false, fmt.Errorf("automq failover: read the WAL's header: %w", err)
	}
	if int64(hdr.NodeID) != int64(r.req.NodeID) {
		return hdr, false, fmt.Errorf("automq failover: %w: the WAL at %s belongs to node %d, not node %d: nothing was done",
			ErrWrongWAL, r.req.WALPath, hdr.NodeID, r.req.NodeID)
	}
	return hdr, false, nil
}

// headerZero reports whether both header slots of the file are zeros.
func headerZero(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, wal.HeaderRegionSize)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return false, err
	}
	for _, b := range buf[:n] {
		if b != 0 {
			return false, nil
		}
	}
	return true, nil
}

// chooseEpoch picks the node epoch: the request's when given (not older
// than the WAL's or the controller's), else the larger of those two.
func (r *run) chooseEpoch(ctx context.Context, hdr wal.Header, empty bool) error {
	walEpoch := int64(-1)
	if !empty {
		walEpoch = int64(hdr.NodeEpoch)
	}
	nodes, err := r.f.ctl.GetNodes(ctx, []int32{r.req.NodeID})
	if err != nil {
		return r.controllerError(err)
	}
	ctlEpoch := int64(-1)
	for _, n := range nodes {
		if n.NodeID == r.req.NodeID {
			ctlEpoch = n.NodeEpoch
		}
	}
	if e := r.req.NodeEpoch; e > 0 {
		if e < walEpoch {
			return fmt.Errorf("automq failover: %w: node epoch %d is older than the epoch %d in the WAL's header: "+
				"the node started again after that epoch; nothing was done", ErrEpochTooOld, e, walEpoch)
		}
		if e < ctlEpoch {
			return fmt.Errorf("automq failover: %w: the controller knows node %d at epoch %d, newer than %d: "+
				"the node started again since; nothing was done", ErrEpochTooOld, r.req.NodeID, ctlEpoch, e)
		}
		r.epoch = e
		return nil
	}
	r.epoch = max(walEpoch, ctlEpoch)
	if r.epoch < 0 {
		return fmt.Errorf("automq failover: %w: neither the WAL nor the controller knows node %d's epoch: give it", ErrEpochTooOld, r.req.NodeID)
	}
	return nil
}

// controllerError adds what an operator can do to a controller refusal.
func (r *run) controllerError(err error) error {
	switch {
	case errors.Is(err, protocol.ErrNodeEpochExpired):
		return fmt.Errorf("automq failover: node %d epoch %d: %w (the node started again with a newer epoch; nothing more was done)", r.req.NodeID, r.epoch, err)
	default:
		return fmt.Errorf("automq failover: %w", err)
	}
}

// recoverWAL reads the WAL in batches, uploads and commits each; it returns
// the streams left with a problem (id → description) and the WAL's trim
// offset when it was read.
func (r *run) recoverWAL(ctx context.Context, ends map[int64]int64) (map[int64]string, int64, error) {
	if err := r.emit(StepRead, false, "reading %s from its trim offset", r.req.WALPath); err != nil {
		return nil, 0, err
	}
	rd, err := wal.Open(r.req.WALPath)
	if err != nil {
		return nil, 0, fmt.Errorf("automq failover: read the WAL: %w", err)
	}
	defer rd.Close()
	if int64(rd.Header().NodeID) != int64(r.req.NodeID) {
		return nil, 0, fmt.Errorf("automq failover: %w: the WAL at %s changed: it now belongs to node %d", ErrWrongWAL, r.req.WALPath, rd.Header().NodeID)
	}
	trim := rd.Header().TrimOffset
	sc := newScanner(rd, ends, r.f.cfg.BatchSize)
	invalid := map[int64]string{}
	for n := 1; ; n++ {
		b, err := sc.next()
		if err != nil {
			return nil, 0, fmt.Errorf("automq failover: read the WAL: %w", err)
		}
		r.walRecords = r.walRecords || sc.records > 0
		for id, why := range b.invalid {
			invalid[id] = why
			st := r.rep.stream(id, 0, ends[id])
			st.Problem = why
			r.log.Error("stream left behind: data may be lost", "stream_id", id, "problem", why)
		}
		for id, why := range b.gaps {
			r.rep.Gaps = append(r.rep.Gaps, why)
			r.log.Warn("records after a gap dropped, as AutoMQ drops them", "stream_id", id, "detail", why)
		}
		if err := r.emit(StepRead, true, "batch %d: %s of %s (%d bytes of payload)%s", n,
			plural(int64(b.count), "record", "records"), plural(int64(len(b.streams)), "stream", "streams"), b.payload, walEnd(sc)); err != nil {
			return nil, 0, err
		}
		if b.count > 0 {
			if err := r.uploadAndCommit(ctx, b); err != nil {
				return nil, 0, err
			}
			for _, s := range b.streams {
				ends[s.id] = s.end()
			}
		}
		if !b.full {
			break
		}
	}
	if n, reasons := rd.Stats().DamagedBytes(); n > 0 {
		r.log.Warn("damaged WAL bytes skipped by AutoMQ's recovery rules", "bytes", n, "reasons", reasons)
		r.rep.SkippedBytes, r.rep.Skipped = n, reasons
	}
	return invalid, trim, nil
}

func walEnd(sc *scanner) string {
	if !sc.done {
		return ""
	}
	return "; " + sc.rd.Stats().EndText()
}

// closeStreams closes the node's opening streams, except those left
// behind with a problem (unless CloseStreamsWithGaps).
func (r *run) closeStreams(ctx context.Context, opening []controller.OpeningStream, invalid map[int64]string) error {
	var todo []controller.CloseStream
	for _, s := range opening {
		if _, bad := invalid[s.StreamID]; bad && !r.f.cfg.CloseStreamsWithGaps {
			continue
		}
		todo = append(todo, controller.CloseStream{StreamID: s.StreamID, StreamEpoch: s.Epoch})
	}
	if err := r.emit(StepClose, false, "closing %s as node %d", plural(int64(len(todo)), "stream", "streams"), r.req.NodeID); err != nil {
		return err
	}
	if len(todo) == 0 {
		return r.emit(StepClose, true, "no stream to close")
	}
	res, err := r.f.ctl.CloseStreams(ctx, r.req.NodeID, r.epoch, todo)
	if err != nil && res == nil {
		return r.controllerError(err)
	}
	var failed []error
	for _, sr := range res {
		st := r.rep.stream(sr.StreamID, sr.StreamEpoch, 0)
		switch {
		case sr.Err == nil:
			st.Closed = true
		case errors.Is(sr.Err, protocol.ErrStreamFenced), errors.Is(sr.Err, protocol.ErrStreamNotOpened):
			// Another node opened it since (a stale epoch), or it is
			// closed: either way it is no longer this node's.
			st.Closed = true
			r.log.Info("stream no longer the node's", "stream_id", sr.StreamID, "answer", sr.Err)
		default:
			failed = append(failed, sr.Err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("automq failover: close streams: %w", errors.Join(failed...))
	}
	return r.emit(StepClose, true, "closed %s of node %d", plural(int64(len(todo)), "stream", "streams"), r.req.NodeID)
}

func sortedKeys[V any](m map[int64]V) []int64 {
	keys := make([]int64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}

// plural is "1 record", "2 records".
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
