package object

import "io"

// DescribeOptions says what Describe includes.
type DescribeOptions struct {
	// Records lists every record's header (not its payload) under its
	// block.
	Records bool
}

// Description is what an inspection prints about one object: its layout,
// each block's index entry and, optionally, its records. The JSON field
// names are the ones `-o json` shows.
type Description struct {
	// Size is the object's size in bytes.
	Size int64 `json:"size"`
	// IndexPosition is the index's byte offset.
	IndexPosition int64 `json:"index_position"`
	// IndexSize is the index's size in bytes.
	IndexSize int64 `json:"index_size"`
	// RecordCount is the number of records in the object.
	RecordCount int64 `json:"record_count"`
	// PayloadBytes is the total size of the records' payloads.
	PayloadBytes int64 `json:"payload_bytes"`
	// Streams has one range per stream, in object order, with the epoch of
	// the stream's first record (what the writer reported).
	Streams []StreamRange `json:"streams"`
	// Blocks has one entry per data block, in object order.
	Blocks []BlockDescription `json:"blocks"`
}

// BlockDescription is one data block's index entry, with its records when
// asked for.
type BlockDescription struct {
	// Block is the block's number, its place in the index.
	Block int `json:"block"`
	// StreamID is the stream of the block's records.
	StreamID int64 `json:"stream_id"`
	// StartOffset is the first offset in the block.
	StartOffset int64 `json:"start_offset"`
	// EndOffset is one past the block's last offset.
	EndOffset int64 `json:"end_offset"`
	// RecordCount is the number of records in the block.
	RecordCount int32 `json:"record_count"`
	// Position is the block's byte offset in the object.
	Position int64 `json:"position"`
	// Size is the block's size in bytes, header included.
	Size int32 `json:"size"`
	// Records are the block's records, when DescribeOptions.Records is set.
	Records []RecordDescription `json:"records,omitempty"`
}

// RecordDescription is a record's header.
type RecordDescription struct {
	// StreamID is the record's stream.
	StreamID int64 `json:"stream_id"`
	// Epoch is the stream epoch the record was written under.
	Epoch int64 `json:"epoch"`
	// BaseOffset is the record's first offset.
	BaseOffset int64 `json:"base_offset"`
	// Count is the number of offsets the record covers.
	Count int32 `json:"count"`
	// PayloadLen is the payload's size in bytes.
	PayloadLen int `json:"payload_len"`
}

// Describe reads an object of the given size with ReadIndex and reads every
// block, so that a description is only given of an object that checks out
// entirely (one block in memory at a time). It returns the reader's errors.
func Describe(r io.ReaderAt, size int64, opts DescribeOptions) (*Description, error) {
	o, err := ReadIndex(r, size)
	if err != nil {
		return nil, err
	}
	d := &Description{
		Size:          o.Size(),
		IndexPosition: o.IndexPosition(),
		IndexSize:     o.IndexSize(),
		Streams:       []StreamRange{},
		Blocks:        make([]BlockDescription, 0, len(o.index)),
	}
	for i, e := range o.index {
		recs, err := o.ReadBlock(i)
		if err != nil {
			return nil, err
		}
		b := BlockDescription{
			Block: i, StreamID: e.StreamID, StartOffset: e.StartOffset, EndOffset: e.EndOffset(),
			RecordCount: e.RecordCount, Position: e.Position, Size: e.Size,
		}
		for _, rec := range recs {
			d.RecordCount++
			d.PayloadBytes += int64(len(rec.Payload))
			if opts.Records {
				b.Records = append(b.Records, RecordDescription{
					StreamID: rec.StreamID, Epoch: rec.Epoch, BaseOffset: rec.BaseOffset,
					Count: rec.Count, PayloadLen: len(rec.Payload),
				})
			}
		}
		if k := len(d.Streams) - 1; k >= 0 && d.Streams[k].StreamID == e.StreamID {
			d.Streams[k].EndOffset = e.EndOffset()
		} else {
			d.Streams = append(d.Streams, StreamRange{StreamID: e.StreamID, Epoch: recs[0].Epoch, StartOffset: e.StartOffset, EndOffset: e.EndOffset()})
		}
		d.Blocks = append(d.Blocks, b)
	}
	return d, nil
}
