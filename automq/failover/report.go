package failover

import (
	"slices"
	"sort"
)

// Report is what a failover did, in AutoMQ's terms: `walden automq failover
// -o json` prints it, and the coordinator keeps it in the job.
type Report struct {
	// WALPath is the WAL that was read.
	WALPath string `json:"wal_path"`
	// NodeID and NodeEpoch are the AutoMQ node failed over and the node
	// epoch the controller calls carried.
	NodeID    int32 `json:"node_id"`
	NodeEpoch int64 `json:"node_epoch"`
	// Fenced says the controller fenced the node (GetOpeningStreams in
	// failover mode was answered).
	Fenced bool `json:"fenced"`
	// Streams are the node's opening streams when the failover first read
	// them, sorted by id.
	Streams []StreamReport `json:"streams"`
	// Objects are the objects committed (and, while the failover runs,
	// those prepared or uploaded), in commit order.
	Objects []ObjectReport `json:"objects"`
	// BytesUploaded counts the bytes of the objects uploaded.
	BytesUploaded int64 `json:"bytes_uploaded"`
	// Records counts the record batches committed.
	Records int64 `json:"records"`
	// WALReset says the WAL is empty now: reset by this failover, or found
	// without records.
	WALReset bool `json:"wal_reset"`
	// DurationMS is how long the failover took (its last run).
	DurationMS int64 `json:"duration_ms"`
	// Gaps describes records dropped after a gap inside a stream (as
	// AutoMQ drops them), one line per stream.
	Gaps []string `json:"gaps,omitempty"`
	// SkippedBytes counts the WAL bytes AutoMQ's recovery rules skipped as
	// damaged (a bad CRC in the middle of a block, ...); Skipped says why.
	SkippedBytes int64  `json:"skipped_bytes"`
	Skipped      string `json:"skipped,omitempty"`
}

// StreamReport is one opening stream of the node.
type StreamReport struct {
	StreamID    int64 `json:"stream_id"`
	StreamEpoch int64 `json:"stream_epoch"`
	// EndOffsetBefore is the stream's end offset at the controller when the
	// failover first read it; EndOffsetAfter once its records are
	// committed.
	EndOffsetBefore int64 `json:"end_offset_before"`
	EndOffsetAfter  int64 `json:"end_offset_after"`
	// Records counts the record batches committed to the stream.
	Records int64 `json:"records"`
	// Closed says the stream is closed (by this failover, or found closed).
	Closed bool `json:"closed"`
	// Problem says why the stream was left opened, empty when none.
	Problem string `json:"problem,omitempty"`
}

// ObjectReport is one object of the failover.
type ObjectReport struct {
	ObjectID int64  `json:"object_id"`
	Key      string `json:"key"`
	Size     int64  `json:"size"`
	// Kind is KindStreamSet or KindStream.
	Kind string `json:"kind"`
	// State is StatePrepared, StateUploaded or StateCommitted.
	State string `json:"state"`
}

// Object kinds and states of an ObjectReport.
const (
	KindStreamSet = "stream_set"
	KindStream    = "stream"

	StatePrepared  = "prepared"
	StateUploaded  = "uploaded"
	StateCommitted = "committed"
)

// Clone returns a deep copy.
func (r *Report) Clone() *Report {
	if r == nil {
		return nil
	}
	c := *r
	c.Streams = slices.Clone(r.Streams)
	c.Objects = slices.Clone(r.Objects)
	c.Gaps = slices.Clone(r.Gaps)
	return &c
}

// stream returns the report of stream id, adding it if absent.
func (r *Report) stream(id, epoch, end int64) *StreamReport {
	for i := range r.Streams {
		if r.Streams[i].StreamID == id {
			return &r.Streams[i]
		}
	}
	r.Streams = append(r.Streams, StreamReport{StreamID: id, StreamEpoch: epoch, EndOffsetBefore: end, EndOffsetAfter: end})
	sort.Slice(r.Streams, func(i, j int) bool { return r.Streams[i].StreamID < r.Streams[j].StreamID })
	for i := range r.Streams {
		if r.Streams[i].StreamID == id {
			return &r.Streams[i]
		}
	}
	return nil // unreachable
}

func (r *Report) object(id int64) *ObjectReport {
	for i := range r.Objects {
		if r.Objects[i].ObjectID == id {
			return &r.Objects[i]
		}
	}
	return nil
}

// Complete says the failover did all it had to: every opening stream is
// closed and nothing was left behind.
func (r *Report) Complete() bool {
	for _, s := range r.Streams {
		if !s.Closed || s.Problem != "" {
			return false
		}
	}
	return r.Fenced
}

// StreamsClosed counts the closed streams.
func (r *Report) StreamsClosed() int {
	n := 0
	for _, s := range r.Streams {
		if s.Closed {
			n++
		}
	}
	return n
}
