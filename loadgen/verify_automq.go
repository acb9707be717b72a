package loadgen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"time"

	"walden/automq/metaview"
	"walden/automq/object"
	"walden/objstore"
	walframe "walden/producer"
)

// AutomqVerifyConfig configures VerifyAutomq.
type AutomqVerifyConfig struct {
	// MetadataURL is the AutoMQ controller's metadata view (the
	// development controller's HTTP endpoint). Required.
	MetadataURL string
	// S3 is AutoMQ's data bucket. Required.
	S3 objstore.Config
	// Ledger is the file Load wrote. Required.
	Ledger string
	// Wait is how long VerifyAutomq waits for a stream's end offset at the
	// controller to reach its last acknowledged offset (uploads and
	// failovers still running). Default 30s.
	Wait time.Duration
	// HTTPClient reads the view and S3 (default: a 5s timeout for the
	// view, the AWS SDK's client for S3).
	HTTPClient *http.Client
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// VerifyAutomq checks a ledger against what AutoMQ holds: for each stream,
// the records of the committed objects the controller lists, read from S3
// in AutoMQ's format, from offset 0 to the stream's end offset at the
// controller, without going through any broker. A record acknowledged but
// missing at its offset is lost; offsets that no committed object holds
// below the end offset are gaps; a record id stored at two offsets is a
// duplicate. The report is Verify's.
func VerifyAutomq(ctx context.Context, cfg AutomqVerifyConfig) (*VerifyReport, error) {
	switch {
	case cfg.MetadataURL == "":
		return nil, fmt.Errorf("%w: --automq: the controller's metadata view is required", ErrInvalid)
	case cfg.Ledger == "":
		return nil, fmt.Errorf("%w: --ledger: required", ErrInvalid)
	}
	if err := cfg.S3.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	led, _, err := ReadLedger(cfg.Ledger)
	if err != nil {
		return nil, err
	}
	store, err := objstore.New(ctx, cfg.S3, objstore.Options{Logger: cfg.Logger, HTTPClient: cfg.HTTPClient})
	if err != nil {
		return nil, fmt.Errorf("loadgen: s3: %w", err)
	}
	view := metaview.NewClient(cfg.MetadataURL, cfg.HTTPClient)
	rd := metaview.NewReader(store)
	ids := make([]uint64, 0, len(led))
	for id := range led {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	deadline := time.Now().Add(cfg.Wait)
	rep := &VerifyReport{Streams: []StreamVerify{}}
	for _, id := range ids {
		sv, err := verifyAutomqStream(ctx, view, rd, id, led[id], deadline, cfg.Logger)
		if err != nil {
			return nil, err
		}
		rep.Streams = append(rep.Streams, sv)
		rep.Acked += sv.Acked
		rep.Present += sv.Present
		rep.Lost += sv.Lost
		rep.Gaps += sv.Gaps
		rep.Duplicates += sv.Duplicates
		rep.Unbacked += int64(len(sv.Unbacked))
	}
	return rep, nil
}

// verifyAutomqStream waits until the controller's end offset of stream
// reaches the ledger's last offset (or the deadline passes), then reads the
// stream's committed objects and compares.
func verifyAutomqStream(ctx context.Context, view *metaview.Client, rd *metaview.Reader, stream uint64, acked map[uint64]string,
	deadline time.Time, log *slog.Logger) (StreamVerify, error) {
	sv := StreamVerify{Stream: stream, Acked: int64(len(acked)), LostOffsets: []uint64{}, Unbacked: []UnbackedRange{}}
	if stream > math.MaxInt64 {
		return sv, fmt.Errorf("loadgen: stream %d is not an AutoMQ stream id", stream)
	}
	var need uint64
	first := uint64(math.MaxUint64)
	for off := range acked {
		need = max(need, off+1)
		first = min(first, off)
	}
	var end int64
	for {
		st, ok, err := view.Stream(ctx, int64(stream))
		switch {
		case err != nil:
			log.Debug("read the stream's metadata", "stream_id", stream, "err", err)
		case !ok:
			return sv, fmt.Errorf("loadgen: stream %d: the controller has no such stream", stream)
		default:
			end = st.EndOffset
		}
		if uint64(max(end, 0)) >= need || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	objs, err := view.Committed(ctx)
	if err != nil {
		return sv, fmt.Errorf("loadgen: stream %d: %w", stream, err)
	}
	got := map[uint64]string{}
	seen := map[string]int{}
	next := int64(0)
	for _, seg := range metaview.AllSegments(objs, int64(stream)) {
		if seg.StartOffset >= end {
			break
		}
		if seg.StartOffset < next {
			// Two committed objects claim the same offsets: the second
			// copy counts as duplicates below.
			log.Warn("committed objects overlap", "stream_id", stream, "object_id", seg.Object.ObjectID, "start", seg.StartOffset, "next", next)
		}
		if seg.StartOffset > next {
			sv.Gaps += seg.StartOffset - next
		}
		var bad error
		err := rd.ReadSegment(ctx, seg, seg.StartOffset, func(r object.Record) bool {
			_, payloads, err := walframe.Decode(r.Payload, uint32(r.Count))
			if err != nil {
				bad = fmt.Errorf("stream %d offset %d: %w", stream, r.BaseOffset, err)
				return false
			}
			for i, p := range payloads {
				off := uint64(r.BaseOffset) + uint64(i)
				id := PayloadID(p)
				if prev, dup := got[off]; dup && prev == id {
					seen[id]++
					continue
				}
				got[off] = id
				if off >= first {
					seen[id]++
				}
			}
			return true
		})
		if errors.Is(err, objstore.ErrNotFound) {
			u := UnbackedRange{Start: uint64(seg.StartOffset), End: uint64(seg.EndOffset), ObjectID: fmt.Sprint(seg.Object.ObjectID),
				Key: seg.Object.Key}
			u.Message = fmt.Sprintf("stream %d [%d, %d): the controller's object %d (%s) is not in S3", stream, u.Start, u.End,
				seg.Object.ObjectID, seg.Object.Key)
			sv.Unbacked = append(sv.Unbacked, u)
			next = max(next, seg.EndOffset)
			continue
		}
		if err == nil {
			err = bad
		}
		if err != nil {
			return sv, fmt.Errorf("loadgen: %w", err)
		}
		next = max(next, seg.EndOffset)
	}
	if next < end {
		sv.Gaps += end - next
	}
	sv.ReadEnd = uint64(max(next, 0))
	for off, id := range acked {
		if got[off] == id {
			sv.Present++
		} else {
			sv.Lost++
			if len(sv.LostOffsets) < 20 {
				sv.LostOffsets = append(sv.LostOffsets, off)
			}
		}
	}
	slices.Sort(sv.LostOffsets)
	for _, n := range seen {
		if n > 1 {
			sv.Duplicates += int64(n - 1)
		}
	}
	return sv, nil
}
