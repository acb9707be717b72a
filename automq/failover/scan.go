package failover

import (
	"errors"
	"fmt"
	"io"
	"sort"

	"walden/wal"
)

// recordOverhead is what AutoMQ's recovery counts for a record besides its
// payload when it fills a batch (StreamRecordBatch's OBJECT_OVERHEAD: the
// Java objects and buffers that hold it).
const recordOverhead = 144

// problemGapPrefix starts the problem of a stream whose WAL records do not
// start at the controller's end offset.
const problemGapPrefix = "records missing"

// rec is one kept record: its encoded body (a view of the mapped WAL, or a
// copy) and its offsets.
type rec struct {
	body  []byte
	base  int64
	count int64
	epoch int64
	// walOffset is where the record is in the WAL (for messages).
	walOffset int64
}

func (r rec) end() int64 { return r.base + r.count }

// streamRecs are the kept records of one stream in a batch, contiguous.
type streamRecs struct {
	id      int64
	recs    []rec
	payload int64
}

func (s *streamRecs) start() int64 { return s.recs[0].base }
func (s *streamRecs) end() int64   { return s.recs[len(s.recs)-1].end() }

// batch is what AutoMQ's failover recovers into one cache block: each
// opening stream's records that continue it, in offset order.
type batch struct {
	// streams are sorted by stream id (a signed compare, as AutoMQ sorts).
	streams []*streamRecs
	count   int
	payload int64
	// full says the batch reached the size bound: the WAL has more.
	full bool
	// invalid are streams whose first record does not start at the
	// controller's end offset: their records were dropped.
	invalid map[int64]string
	// gaps are streams whose records stopped at a gap inside the batch:
	// the records after it were dropped.
	gaps map[int64]string
}

// scanner reads the WAL and fills batches with AutoMQ's recovery rules
// (S3Storage.recoverContinuousRecords in 1.4.1):
//
//   - a record is kept only if its stream is opening and its base offset is
//     at or beyond the stream's end offset at the controller;
//   - a stream's first kept record in a batch is taken whatever its base
//     offset; after it, a record that does not continue the stream waits
//     among the stream's out-of-order records, and is taken when the records
//     before it arrive; what still waits when the batch ends is dropped;
//   - a stream whose first kept record does not start exactly at its end
//     offset is invalid: its records are dropped and it is reported;
//   - a batch is full once its records count batchSize bytes (payload plus
//     144 per record).
type scanner struct {
	rd        *wal.Reader
	ends      map[int64]int64
	batchSize int64
	// records counts the valid records the WAL held (kept or not).
	records int
	done    bool
	// invalid are streams already found invalid: their later records are
	// dropped too.
	invalid map[int64]bool
}

func newScanner(rd *wal.Reader, ends map[int64]int64, batchSize int64) *scanner {
	return &scanner{rd: rd, ends: ends, batchSize: batchSize, invalid: map[int64]bool{}}
}

// next returns the next batch (empty and not full at the end of the WAL).
// s.ends must hold each stream's end offset after the previous batch's
// commit.
//
// It reads records into the batch until they count batchSize bytes or the
// WAL ends, keeping those AutoMQ keeps; then it reports the records left
// waiting after a gap, sets aside the streams that do not start at their
// end offset, and holds the pages of the records taken.
func (s *scanner) next() (*batch, error) {
	b := &batch{invalid: map[int64]string{}, gaps: map[int64]string{}}
	if s.done {
		return b, nil
	}
	f := filling{streams: map[int64]*streamRecs{}, nextOff: map[int64]int64{}, pending: map[int64][]rec{}}
	copyBodies := !s.rd.Mapped()
	for f.size < s.batchSize {
		r, err := s.rd.Next()
		if errors.Is(err, io.EOF) {
			s.done = true
			break
		}
		if err != nil {
			return nil, err
		}
		s.records++
		if kr, ok := s.keep(r, copyBodies); ok {
			f.take(int64(r.Batch.StreamID), kr)
		}
	}
	b.full = f.size >= s.batchSize
	f.reportGaps(b)
	s.settle(b, f.streams)
	// The batch's records are read twice more (laid out, then uploaded):
	// map their pages in once rather than a fault per page.
	if !copyBodies {
		s.hold(b)
	}
	return b, nil
}

// keep returns the record AutoMQ's recovery keeps of r: one of an opening
// stream not found invalid, at or beyond its end offset (else it is closed
// already, or committed already). Its body is copied unless the WAL is
// mapped.
func (s *scanner) keep(r wal.Record, copyBody bool) (rec, bool) {
	bt := r.Batch
	id := int64(bt.StreamID)
	end, opening := s.ends[id]
	if !opening || s.invalid[id] || int64(bt.BaseOffset) < end {
		return rec{}, false
	}
	body := r.Body
	if copyBody {
		body = append([]byte(nil), body...)
	}
	return rec{body: body, base: int64(bt.BaseOffset), count: int64(bt.Count), epoch: int64(bt.Epoch), walOffset: r.Offset}, true
}

// filling is a batch being filled: the records taken of each stream, the
// offset each stream continues at, the records waiting for the ones before
// them, and the size the records taken count.
type filling struct {
	streams map[int64]*streamRecs
	nextOff map[int64]int64
	pending map[int64][]rec
	size    int64
}

// take adds a kept record of stream id: a stream's first record whatever
// its base offset, then records that continue it; a record that does not
// waits among the stream's out-of-order records until those before it
// arrive.
func (f *filling) take(id int64, kr rec) {
	exp, started := f.nextOff[id]
	if started && exp != kr.base {
		f.pending[id] = append(f.pending[id], kr)
		return
	}
	sr := f.streams[id]
	if sr == nil {
		sr = &streamRecs{id: id}
		f.streams[id] = sr
	}
	// Only records taken count toward the batch's size, as in AutoMQ's
	// cache block.
	f.size += sr.add(kr)
	// Take the waiting records that now continue the stream.
	q := f.pending[id]
	sort.SliceStable(q, func(i, j int) bool { return q[i].base < q[j].base })
	for len(q) > 0 && q[0].base == sr.end() {
		f.size += sr.add(q[0])
		q = q[1:]
	}
	f.pending[id] = q
	f.nextOff[id] = sr.end()
}

// reportGaps records in b the streams whose records still wait when the
// batch ends: they follow a gap and are dropped, as AutoMQ drops them.
func (f *filling) reportGaps(b *batch) {
	for id, q := range f.pending {
		if len(q) == 0 {
			continue
		}
		sr := f.streams[id]
		b.gaps[id] = fmt.Sprintf("stream %d: %s after offset %d dropped (the next starts at %d, WAL offset %d), as AutoMQ drops records after a gap",
			id, plural(int64(len(q)), "record", "records"), sr.end(), minBase(q), q[0].walOffset)
	}
}

// settle puts in b, in stream id order, the streams whose records start at
// their end offset at the controller. Those that do not are invalid: their
// records are dropped, now and in later batches, and b says why.
func (s *scanner) settle(b *batch, streams map[int64]*streamRecs) {
	for id, sr := range streams {
		if sr.start() != s.ends[id] {
			s.invalid[id] = true
			b.invalid[id] = fmt.Sprintf("%s: stream %d: the controller's end offset is %d but the WAL's first record of the stream starts at %d "+
				"(WAL offset %d): offsets %d..%d are in neither S3 nor this WAL, so data may be lost",
				problemGapPrefix, id, s.ends[id], sr.start(), sr.recs[0].walOffset, s.ends[id], sr.start())
			continue
		}
		b.streams = append(b.streams, sr)
		b.count += len(sr.recs)
		b.payload += sr.payload
	}
	sort.Slice(b.streams, func(i, j int) bool { return b.streams[i].id < b.streams[j].id })
}

// hold maps in the pages of the batch's records at once.
func (s *scanner) hold(b *batch) {
	bodies := make([][]byte, 0, b.count)
	for _, sr := range b.streams {
		for _, r := range sr.recs {
			bodies = append(bodies, r.body)
		}
	}
	s.rd.Hold(bodies)
}

// add appends r and returns what it counts toward a batch's size.
func (s *streamRecs) add(r rec) int64 {
	s.recs = append(s.recs, r)
	p := int64(len(r.body) - wal.BodyHeaderSize)
	s.payload += p
	return p + recordOverhead
}

func minBase(q []rec) int64 {
	m := q[0].base
	for _, r := range q {
		m = min(m, r.base)
	}
	return m
}
