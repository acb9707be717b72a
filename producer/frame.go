package producer

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt means a batch payload is not well framed.
var ErrCorrupt = errors.New("producer: malformed record framing")

// headerMarker starts the producer header. A payload without header starts
// with the length of its first record, which is always smaller (a WAL batch
// payload is far below 4 GiB), so the marker tells the two apart.
const headerMarker = 0xFFFFFFFF

// HeaderSize is the size of the producer header: marker u32, producer id
// u64, sequence u64.
const HeaderSize = 4 + 8 + 8

// Header is the idempotent producer of a batch. ID 0 means none: the
// append is not idempotent and the payload has no header.
type Header struct {
	ID uint64
	// Sequence is the sequence number of the batch's first record.
	Sequence uint64
}

// Encode frames records into one batch payload: the header when h.ID is
// not 0, then each record as a big-endian u32 length and its bytes.
func Encode(h Header, records [][]byte) []byte {
	n := 0
	if h.ID != 0 {
		n = HeaderSize
	}
	for _, r := range records {
		n += 4 + len(r)
	}
	out := make([]byte, 0, n)
	if h.ID != 0 {
		out = binary.BigEndian.AppendUint32(out, headerMarker)
		out = binary.BigEndian.AppendUint64(out, h.ID)
		out = binary.BigEndian.AppendUint64(out, h.Sequence)
	}
	for _, r := range records {
		out = binary.BigEndian.AppendUint32(out, uint32(len(r)))
		out = append(out, r...)
	}
	return out
}

// HeaderOf reads the producer header of a payload without reading its
// records; a payload without header has the zero Header.
func HeaderOf(payload []byte) (Header, error) {
	if len(payload) < 4 || binary.BigEndian.Uint32(payload) != headerMarker {
		return Header{}, nil
	}
	if len(payload) < HeaderSize {
		return Header{}, fmt.Errorf("%w: producer header of %d bytes, want %d", ErrCorrupt, len(payload), HeaderSize)
	}
	h := Header{ID: binary.BigEndian.Uint64(payload[4:]), Sequence: binary.BigEndian.Uint64(payload[12:])}
	if h.ID == 0 {
		return Header{}, fmt.Errorf("%w: producer header with producer id 0", ErrCorrupt)
	}
	return h, nil
}

// Decode splits a batch payload framed by Encode; it expects exactly count
// records. The returned slices alias payload.
func Decode(payload []byte, count uint32) (Header, [][]byte, error) {
	h, err := HeaderOf(payload)
	if err != nil {
		return Header{}, nil, err
	}
	if h.ID != 0 {
		payload = payload[HeaderSize:]
	}
	out := make([][]byte, 0, count)
	for len(payload) > 0 {
		if len(payload) < 4 {
			return Header{}, nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(payload))
		}
		n := binary.BigEndian.Uint32(payload)
		if uint64(n) > uint64(len(payload)-4) {
			return Header{}, nil, fmt.Errorf("%w: record of %d bytes, %d left", ErrCorrupt, n, len(payload)-4)
		}
		out = append(out, payload[4:4+n])
		payload = payload[4+n:]
	}
	if uint32(len(out)) != count {
		return Header{}, nil, fmt.Errorf("%w: %d records, batch count %d", ErrCorrupt, len(out), count)
	}
	return h, out, nil
}
