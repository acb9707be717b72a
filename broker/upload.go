package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"time"

	"google.golang.org/grpc"

	"walden/objformat"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/wal"
)

// builtObject is one object ready to upload and commit.
type builtObject struct {
	key, id     string
	data        []byte
	index       *objformat.Index
	first, last int64 // WAL offsets of the first and last record
	records     int
	uploaded    bool
	crc         uint32
	// producers is the last batch of each idempotent producer per stream,
	// committed with the object into the streams' producer tables.
	producers []*waldenv1.StreamProducers
}

// build encodes records (in WAL order) into one object uploaded under the
// broker epoch.
func (b *Broker) build(epoch uint64, records []pendingRecord) (*builtObject, error) {
	bld := objformat.NewBuilder()
	var prods producer.Summary
	for _, r := range records {
		if err := bld.Add(r.batch); err != nil {
			return nil, fmt.Errorf("broker: build object: %w", err)
		}
		if err := prods.Add(r.batch.StreamID, r.batch.BaseOffset, r.batch.Count, r.batch.Payload); err != nil {
			return nil, fmt.Errorf("broker: build object: stream %d offset %d: %w", r.batch.StreamID, r.batch.BaseOffset, err)
		}
	}
	data, ix, err := bld.Build()
	if err != nil {
		return nil, fmt.Errorf("broker: build object: %w", err)
	}
	first, last := records[0].walOffset, records[len(records)-1].walOffset
	return &builtObject{
		key:       objformat.Key(b.cfg.S3.Prefix, b.cfg.BrokerID, epoch, first, last),
		id:        objformat.ObjectID(b.cfg.BrokerID, epoch, first, last),
		data:      data,
		index:     ix,
		first:     first,
		last:      last,
		records:   len(records),
		producers: prods.Streams(),
	}, nil
}

// commit uploads obj (once) and commits it under epoch. A refusal of the
// epoch returns an error wrapping ErrFenced.
func (b *Broker) commit(ctx context.Context, epoch uint64, obj *builtObject) (*waldenv1.CommitObjectResponse, error) {
	if !obj.uploaded {
		res, err := b.s3.Upload(ctx, obj.key, bytes.NewReader(obj.data), int64(len(obj.data)), nil)
		if err != nil {
			return nil, fmt.Errorf("broker: upload %s: %w", obj.key, err)
		}
		obj.crc = res.CRC32C
		obj.uploaded = true
	}
	req := &waldenv1.CommitObjectRequest{
		BrokerId:    b.cfg.BrokerID,
		BrokerEpoch: epoch,
		Object: &waldenv1.Object{
			ObjectId:       obj.id,
			Key:            obj.key,
			Size:           uint64(len(obj.data)),
			Ranges:         obj.index.Ranges(),
			BrokerId:       b.cfg.BrokerID,
			BrokerEpoch:    epoch,
			FirstWalOffset: obj.first,
			LastWalOffset:  obj.last,
			Crc32C:         obj.crc,
		},
		Producers: obj.producers,
	}
	var resp *waldenv1.CommitObjectResponse
	err := b.coords.Do(ctx, 5*time.Second, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = waldenv1.NewCatalogClient(conn).CommitObject(ctx, req)
		return err
	})
	if err != nil {
		switch rpcerr.Reason(err) {
		case refusal.NodeFenced, refusal.EpochExpired:
			return nil, fmt.Errorf("%w: commit %s: %w", ErrFenced, obj.id, err)
		}
		return nil, fmt.Errorf("broker: commit %s: %w", obj.id, err)
	}
	return resp, nil
}

// uploadOnce uploads and commits the WAL records not yet committed, then
// trims the WAL to the last of them (inclusive). A failed attempt keeps the
// same object for the next one.
func (b *Broker) uploadOnce(ctx context.Context, inc *incarnation, log *slog.Logger) error {
	b.mu.Lock()
	obj, fenced := inc.upload, inc.fenced
	b.mu.Unlock()
	if fenced {
		return ErrFenced
	}
	if obj == nil {
		// No append is between its WAL write and the pending list while
		// walMu is held: the snapshot holds every durable record.
		b.walMu.Lock()
		b.mu.Lock()
		snap := append([]pendingRecord(nil), inc.pending...)
		b.mu.Unlock()
		b.walMu.Unlock()
		if len(snap) == 0 {
			return nil
		}
		sort.SliceStable(snap, func(i, j int) bool { return snap[i].walOffset < snap[j].walOffset })
		var err error
		if obj, err = b.build(inc.epoch, snap); err != nil {
			return err
		}
		b.mu.Lock()
		inc.upload = obj
		b.mu.Unlock()
	}
	resp, err := b.commit(ctx, inc.epoch, obj)
	if err != nil {
		b.mu.Lock()
		b.lastErr = err.Error()
		if errors.Is(err, ErrFenced) {
			inc.fenced = true
		}
		b.mu.Unlock()
		log.Warn("upload failed", "object_id", obj.id, "records", obj.records, "err", err)
		return err
	}
	b.walMu.RLock()
	defer b.walMu.RUnlock()
	b.mu.Lock()
	keep := inc.pending[:0]
	for _, r := range inc.pending {
		if r.walOffset > obj.last {
			keep = append(keep, r)
		} else {
			inc.pendingBytes -= int64(len(r.batch.Payload))
		}
	}
	clear(inc.pending[len(keep):])
	inc.pending = keep
	for _, r := range obj.index.Entries {
		if s := inc.streams[r.StreamID]; s != nil && r.EndOffset > s.committed.Load() {
			s.committed.Store(r.EndOffset)
		}
	}
	inc.upload = nil
	b.uploads++
	b.mu.Unlock()
	if err := inc.w.Trim(obj.last); err != nil {
		log.Warn("wal trim failed", "offset", obj.last, "err", err)
	}
	log.Debug("uploaded", "object_id", obj.id, "records", obj.records, "bytes", len(obj.data), "redundant", resp.GetRedundant())
	return nil
}

// recoverOldWAL re-opens, with the new epoch, every stream the catalog
// still shows OPENED by this broker, and uploads the records of the WAL left
// by an earlier run that the catalog lacks, before the WAL is reset. Only
// those streams qualify: each one's records are committed contiguous from
// the stream's end offset (stopping at the first gap). A CLOSED stream was
// recovered by the coordinators (its records beyond the end were never
// acknowledged), and a stream another broker owns is not ours to write.
func (b *Broker) recoverOldWAL(ctx context.Context, inc *incarnation, log *slog.Logger) error {
	mine, err := b.coords.ListStreams(ctx, b.cfg.BrokerID, "opened")
	if err != nil {
		return fmt.Errorf("broker: list own streams: %w", err)
	}
	for _, st := range mine {
		if !b.openStream(ctx, inc, st.GetStreamId(), log) {
			if inc.isFenced(b) {
				return ErrFenced
			}
			return fmt.Errorf("broker: re-open stream %d failed", st.GetStreamId())
		}
	}
	var records []wal.Record
	if _, err := os.Stat(b.cfg.WAL.Path); err == nil {
		rec, err := wal.RecoverFile(b.cfg.WAL.Path)
		if err != nil {
			return fmt.Errorf("broker: read old wal: %w", err)
		}
		records = rec.Records
		log.Info("old WAL read", "records", len(rec.Records), "trim_offset", rec.Header.TrimOffset,
			"recovered_wal_offset", b.agent.RecoveredWALOffset(), "own_open_streams", len(mine))
	}
	var take []pendingRecord
	skipped := map[uint64]int{}
	expected := map[uint64]uint64{}
	stopped := map[uint64]bool{}
	for _, r := range records {
		bt := r.Batch
		s := inc.streams[bt.StreamID]
		if s == nil {
			skipped[bt.StreamID]++
			continue
		}
		if stopped[bt.StreamID] {
			continue
		}
		exp, ok := expected[bt.StreamID]
		if !ok {
			exp = s.next
		}
		if bt.EndOffset() <= exp {
			continue
		}
		if bt.BaseOffset != exp {
			log.Warn("old WAL stream stops at a gap", "stream_id", bt.StreamID, "expected", exp, "base_offset", bt.BaseOffset)
			stopped[bt.StreamID] = true
			continue
		}
		bt.Epoch = s.epoch
		take = append(take, pendingRecord{walOffset: r.Offset, batch: bt})
		expected[bt.StreamID] = bt.EndOffset()
	}
	for id, n := range skipped {
		log.Info("old WAL records of a stream not opened by this broker; skipped", "stream_id", id, "records", n)
	}
	if len(take) == 0 {
		return nil
	}
	obj, err := b.build(inc.epoch, take)
	if err != nil {
		return err
	}
	if _, err := b.commit(ctx, inc.epoch, obj); err != nil {
		if errors.Is(err, ErrFenced) {
			b.mu.Lock()
			inc.fenced = true
			b.mu.Unlock()
		}
		return err
	}
	for _, e := range obj.index.Entries {
		if s := inc.streams[e.StreamID]; s != nil {
			s.committed.Store(e.EndOffset)
			s.next = e.EndOffset
		}
	}
	// The streams' producer tables came with the opens, before this commit:
	// add its producers' last batches (a retry of a batch acknowledged
	// before the crash, or written but not acknowledged, is a duplicate).
	for _, sp := range obj.producers {
		if s := inc.streams[sp.GetStreamId()]; s != nil {
			s.producers.Merge(sp.GetProducers())
		}
	}
	log.Info("old WAL tail committed", "object_id", obj.id, "records", len(take))
	return nil
}
