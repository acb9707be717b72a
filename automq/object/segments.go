package object

import (
	"fmt"
	"io"
	"sort"
)

// segmentCopyMax is the longest write Segments copies rather than keeps: a
// Writer reuses only its record-header buffer (RecordHeaderSize bytes);
// block headers, the index and the records themselves are slices it never
// writes to again.
const segmentCopyMax = 64

// Segments is an io.Writer for a Writer that keeps what it is given
// instead of copying it, and reads it back as one object (io.ReaderAt):
// an object laid out over records already in memory — an AutoMQ WAL's,
// for a failover — then costs its index and a few small headers, not a
// copy of its bytes. Writes of up to 64 bytes are copied (the Writer's
// record header is one buffer it reuses); longer ones are kept as they
// are, so the records given to the Writer must not change while the
// Segments is read. A Segments is not safe for concurrent writes; ReadAt
// may be called concurrently once the writes are done.
type Segments struct {
	segs  [][]byte
	ends  []int64 // ends[i] is the offset just past segs[i]
	owned bool    // the last segment is a copy this Segments may append to
	size  int64
}

// Write keeps p (or a copy of it, when short).
func (s *Segments) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) <= segmentCopyMax {
		last := len(s.segs) - 1
		if s.owned && cap(s.segs[last])-len(s.segs[last]) >= len(p) {
			s.segs[last] = append(s.segs[last], p...)
		} else {
			s.segs = append(s.segs, append(make([]byte, 0, 4*segmentCopyMax), p...))
			s.ends = append(s.ends, s.size)
			s.owned = true
		}
		s.size += int64(len(p))
		s.ends[len(s.ends)-1] = s.size
		return len(p), nil
	}
	s.segs = append(s.segs, p)
	s.size += int64(len(p))
	s.ends = append(s.ends, s.size)
	s.owned = false
	return len(p), nil
}

// Size is the number of bytes written.
func (s *Segments) Size() int64 { return s.size }

// ReadAt reads len(p) bytes at off, as io.ReaderAt.
func (s *Segments) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("automq object: read at negative offset %d", off)
	}
	if off >= s.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	i := sort.Search(len(s.ends), func(i int) bool { return s.ends[i] > off })
	n := 0
	for n < len(p) && i < len(s.segs) {
		seg := s.segs[i]
		at := off + int64(n) - (s.ends[i] - int64(len(seg)))
		n += copy(p[n:], seg[at:])
		i++
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
